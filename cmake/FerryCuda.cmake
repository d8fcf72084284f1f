# Decides whether the CUDA backend is built (FERRY_CUDA=AUTO|ON|OFF) and sets
# FERRY_HAVE_CUDA. The CUDA runtime is linked statically; the driver library is
# never linked (only its stub exists on machines without a GPU), the driver API is
# reached through the runtime's entry-point query instead.
set(FERRY_HAVE_CUDA OFF)
if(NOT FERRY_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # The kernels include content.hpp (std::span): C++20 device code. CMake 3.25
    # does not know nvcc's C++20 flag; teach it.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(FERRY_HAVE_CUDA ON)
    endif()
  endif()
  if(FERRY_CUDA STREQUAL "ON" AND NOT FERRY_HAVE_CUDA)
    message(FATAL_ERROR "FERRY_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
message(STATUS "ferry: CUDA backend ${FERRY_HAVE_CUDA}")
