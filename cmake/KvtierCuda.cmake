# CUDA is optional. KVTIER_CUDA=AUTO enables it when a toolkit is found, ON requires it, OFF
# skips it. Architectures are fixed before enable_language: `native` fails without a GPU.
set(KVTIER_CUDA AUTO CACHE STRING "Build the CUDA data plane: AUTO, ON or OFF")
set_property(CACHE KVTIER_CUDA PROPERTY STRINGS AUTO ON OFF)
set(KVTIER_HAVE_CUDA OFF)
if(NOT KVTIER_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80;90)
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # CMake 3.25 cannot ask for C++20 on .cu files; kernels stay at C++17.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(KVTIER_HAVE_CUDA ON)
  elseif(KVTIER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVTIER_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "kvtier: CUDA data plane ${KVTIER_HAVE_CUDA}")

# The simulated CUDA device (worker/cuda/sim): the CUDA code built a second time against a CPU
# implementation of the runtime API it uses, so its host logic is tested without a GPU or a
# toolkit. ON by default; scripts/test runs the suites over it (docs/cuda.md).
option(KVTIER_CUDA_SIM "Build the CUDA data plane over the simulated device too" ON)
message(STATUS "kvtier: simulated CUDA device ${KVTIER_CUDA_SIM}")

# Libraries that exist in two variants: kvtier_<x> over the real runtime and kvtier_<x>_sim over
# the simulated device.
set(KVTIER_CUDA_VARIANTS cuda_kernels cuda_store cuda_runtime worker_runtime cuda_decoder_config
    cuda_engine_kernels cuda_engine)

# The simulated variant of a dependency list: the CUDA libraries become the simulation, and every
# two-variant kvtier library its _sim variant.
function(kvtier_cuda_sim_deps out)
  set(mapped)
  foreach(dep ${ARGN})
    string(REGEX REPLACE "^kvtier::" "" bare "${dep}")
    if(dep STREQUAL "CUDA::cudart_static" OR dep STREQUAL "CUDA::cublas")
      list(APPEND mapped kvtier::cuda_sim)
    elseif(NOT bare STREQUAL dep AND bare IN_LIST KVTIER_CUDA_VARIANTS)
      list(APPEND mapped kvtier::${bare}_sim)
    else()
      list(APPEND mapped ${dep})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES mapped)
  set(${out} ${mapped} PARENT_SCOPE)
endfunction()

# kvtier_cuda_library(NAME n SRCS ... [SIM_SRCS ...] [HDRS ...] [DEPS ...] [ALWAYS])
#   kvtier_<n> over the real runtime (with a toolkit; ALWAYS: everywhere, for a library with no
#   CUDA call of its own) and, with KVTIER_CUDA_SIM, kvtier_<n>_sim over the simulated device
#   (SIM_SRCS instead of SRCS when given: kernels' CPU references instead of .cu files).
function(kvtier_cuda_library)
  cmake_parse_arguments(K "ALWAYS" "NAME" "SRCS;SIM_SRCS;HDRS;DEPS" ${ARGN})
  if(KVTIER_HAVE_CUDA OR K_ALWAYS)
    kvtier_cc_library(NAME ${K_NAME} SRCS ${K_SRCS} HDRS ${K_HDRS} DEPS ${K_DEPS})
  endif()
  if(KVTIER_CUDA_SIM)
    if(NOT K_SIM_SRCS)
      set(K_SIM_SRCS ${K_SRCS})
    endif()
    kvtier_cuda_sim_deps(sim_deps ${K_DEPS})
    kvtier_cc_library(NAME ${K_NAME}_sim SRCS ${K_SIM_SRCS} HDRS ${K_HDRS} DEPS ${sim_deps})
  endif()
endfunction()

# kvtier_cuda_test(NAME n_gpu_test SRCS ... [DEPS ...] [TIMEOUT s] [SIM_LABELS ...])
#   The same test sources twice: n_gpu_test over the real runtime (label gpu, with a toolkit) and
#   n_sim_test over the simulated device (SIM_LABELS, default unit), so one suite runs on both.
function(kvtier_cuda_test)
  cmake_parse_arguments(K "" "NAME;TIMEOUT" "SRCS;DEPS;SIM_LABELS;ENVIRONMENT" ${ARGN})
  if(NOT K_TIMEOUT)
    set(K_TIMEOUT 300)
  endif()
  if(NOT K_SIM_LABELS)
    set(K_SIM_LABELS unit)
  endif()
  if(KVTIER_HAVE_CUDA)
    kvtier_cc_test(NAME ${K_NAME} SRCS ${K_SRCS} DEPS ${K_DEPS} LABELS gpu TIMEOUT ${K_TIMEOUT}
                   ENVIRONMENT ${K_ENVIRONMENT})
  endif()
  if(KVTIER_CUDA_SIM)
    string(REGEX REPLACE "_gpu_test$" "_sim_test" sim_name "${K_NAME}")
    kvtier_cuda_sim_deps(sim_deps ${K_DEPS})
    kvtier_cc_test(NAME ${sim_name} SRCS ${K_SRCS} DEPS ${sim_deps} LABELS ${K_SIM_LABELS}
                   TIMEOUT ${K_TIMEOUT} ENVIRONMENT ${K_ENVIRONMENT})
  endif()
endfunction()
