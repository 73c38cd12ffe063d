# CUDA backend switch. SLUICE_CUDA (top-level cache variable):
#   AUTO  builds the CUDA kernels wherever nvcc is found (on PATH, $CUDACXX, $CUDA_HOME or
#         /usr/local/cuda), so CI compiles them even without a GPU;
#   ON    requires nvcc (configure fails without it);
#   OFF   builds the CPU engine only.
# Sets SLUICE_CUDA_ENABLED (ON/OFF), enables the CUDA language and finds CUDAToolkit
# (CUDA::cudart_static, CUDA::cublasLt). Kernel targets are defined in kernels/CMakeLists.txt.
set(SLUICE_CUDA_ENABLED OFF)
string(TOUPPER "${SLUICE_CUDA}" _sluice_cuda_mode)
if(NOT _sluice_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "SLUICE_CUDA must be AUTO, ON or OFF, got '${SLUICE_CUDA}'")
endif()

if(NOT _sluice_cuda_mode STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(SLUICE_NVCC nvcc
                 HINTS ENV CUDACXX ENV CUDA_HOME ENV CUDA_PATH
                 PATHS /usr/local/cuda/bin
                 PATH_SUFFIXES bin)
    if(SLUICE_NVCC)
      set(CMAKE_CUDA_COMPILER "${SLUICE_NVCC}")
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    # Hopper (wgmma-capable sm_90a) plus an Ampere fallback; sm_90a cubins also run on sm_90.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90a;80")
    endif()
    if(CCACHE_PROGRAM)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc 13's C++20 flag; the .cu files need only C++17.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(SLUICE_CUDA_ENABLED ON)
    message(STATUS "Sluice CUDA backend: ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                   "archs ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_sluice_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "SLUICE_CUDA=ON but nvcc was not found (set CUDACXX or CUDA_HOME)")
  else()
    message(STATUS "Sluice CUDA backend: OFF (nvcc not found)")
  endif()
else()
  message(STATUS "Sluice CUDA backend: OFF (SLUICE_CUDA=OFF)")
endif()

# sluice_cuda_target_options(TARGET): the top-level add_compile_options() flags are GCC flags
# that nvcc rejects; give CUDA sources their own warning set (passed to the host compiler) and
# keep the directory's flags for the target's C++ sources only.
function(sluice_cuda_target_options target)
  get_target_property(_opts ${target} COMPILE_OPTIONS)
  set(_cxx_opts "")
  if(_opts)
    foreach(_o ${_opts})
      list(APPEND _cxx_opts "$<$<COMPILE_LANGUAGE:CXX>:${_o}>")
    endforeach()
  endif()
  set_property(TARGET ${target} PROPERTY COMPILE_OPTIONS ${_cxx_opts})
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wno-unused-parameter>")
  set_property(TARGET ${target} PROPERTY CUDA_RUNTIME_LIBRARY Static)
endfunction()
