# Third-party packages, all from Debian (scripts/install-deps installs them).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
# Debian ships no CMake config for protobuf: use the module, and /usr/bin/protoc only.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(Boost REQUIRED)
find_package(tomlplusplus CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
