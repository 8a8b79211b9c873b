# Third-party packages, all from Debian (scripts/install-deps installs them).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
# Debian ships no CMake config for protobuf: use the module, and /usr/bin/protoc only.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
# A gRPC built without its code generator (scripts/tsan's, instrumented for ThreadSanitizer):
# Debian's grpc_cpp_plugin, the same version, generates the stubs.
if(NOT TARGET gRPC::grpc_cpp_plugin)
  find_program(KVTIER_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
  add_executable(gRPC::grpc_cpp_plugin IMPORTED)
  set_target_properties(gRPC::grpc_cpp_plugin PROPERTIES IMPORTED_LOCATION
                                                         ${KVTIER_GRPC_CPP_PLUGIN})
endif()
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(Boost REQUIRED)
find_package(tomlplusplus CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
