# Declaration helpers, after abseil's absl_cc_library: one library target per folder, one test
# target per test file. Every target sees the repository root as its include root, so includes
# read as paths ("core/status/status_macros.h").

# kvtier_cc_library(NAME n SRCS ... [HDRS ...] [DEPS ...] [PUBLIC_INCLUDES ...])
#   Declares target kvtier_<n> (alias kvtier::<n>). A library with no sources is INTERFACE.
function(kvtier_cc_library)
  cmake_parse_arguments(K "" "NAME" "SRCS;HDRS;DEPS;PUBLIC_INCLUDES;DEFINES" ${ARGN})
  set(target kvtier_${K_NAME})
  if(K_SRCS)
    add_library(${target} STATIC ${K_SRCS} ${K_HDRS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${K_PUBLIC_INCLUDES})
    target_link_libraries(${target} PUBLIC ${K_DEPS})
    target_compile_definitions(${target} PUBLIC ${K_DEFINES})
    target_compile_options(${target} PRIVATE ${KVTIER_WARNINGS})
  else()
    add_library(${target} INTERFACE ${K_HDRS})
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR} ${K_PUBLIC_INCLUDES})
    target_link_libraries(${target} INTERFACE ${K_DEPS})
    target_compile_definitions(${target} INTERFACE ${K_DEFINES})
  endif()
  add_library(kvtier::${K_NAME} ALIAS ${target})
endfunction()

# kvtier_cc_binary(NAME n SRCS ... [DEPS ...]) declares executable n.
function(kvtier_cc_binary)
  cmake_parse_arguments(K "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${K_NAME} ${K_SRCS})
  target_include_directories(${K_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${K_NAME} PRIVATE ${K_DEPS})
  target_compile_options(${K_NAME} PRIVATE ${KVTIER_WARNINGS})
endfunction()

# kvtier_cc_test(NAME n SRCS ... [DEPS ...] [LABELS unit|integration|e2e|gpu] [TIMEOUT s]
#                [ENVIRONMENT ...])
#   One gtest executable, registered with ctest under its LABELS (default: unit).
function(kvtier_cc_test)
  cmake_parse_arguments(K "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT K_LABELS)
    set(K_LABELS unit)
  endif()
  if(NOT K_TIMEOUT)
    set(K_TIMEOUT 300)
  endif()
  add_executable(${K_NAME} ${K_SRCS})
  target_include_directories(${K_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${K_NAME} PRIVATE ${K_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_options(${K_NAME} PRIVATE ${KVTIER_WARNINGS})
  add_test(NAME ${K_NAME} COMMAND ${K_NAME})
  set_tests_properties(${K_NAME} PROPERTIES LABELS "${K_LABELS}" TIMEOUT ${K_TIMEOUT}
                       ENVIRONMENT "KVTIER_BUILD_DIR=${PROJECT_BINARY_DIR};${K_ENVIRONMENT}")
endfunction()

# kvtier_cc_bench(NAME n SRCS ... [DEPS ...] [SMOKE]) declares a Google Benchmark executable.
#   SMOKE: ctest also runs every benchmark once, briefly (`n_runs`, label unit), so a bench
#   that no longer works against the code it measures fails the tests rather than its next user.
function(kvtier_cc_bench)
  cmake_parse_arguments(K "SMOKE" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${K_NAME} ${K_SRCS})
  target_include_directories(${K_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${K_NAME} PRIVATE ${K_DEPS} benchmark::benchmark benchmark::benchmark_main)
  if(K_SMOKE)
    add_test(NAME ${K_NAME}_runs COMMAND ${K_NAME} --benchmark_min_time=0.01)
    set_tests_properties(${K_NAME}_runs PROPERTIES LABELS unit TIMEOUT 300)
  endif()
endfunction()

# Adds every immediate subdirectory of the current one that has a CMakeLists.txt, so a new
# folder joins the build without editing its parent.
function(kvtier_add_subdirectories)
  file(GLOB children LIST_DIRECTORIES true RELATIVE ${CMAKE_CURRENT_SOURCE_DIR}
       ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT children)
  foreach(child ${children})
    if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${child}
       AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${child}/CMakeLists.txt)
      add_subdirectory(${child})
    endif()
  endforeach()
endfunction()
