# UCX for the KV transfer agent: target sluice_ucx (headers + libucp/libucs/libuct).
#   CUDA builds (SLUICE_CUDA_ENABLED) use the CUDA-aware UCX of PyPI's libucx-cu13, which
#   scripts/install_deps.sh unpacks into .deps/ucx-cu13 (override: -DSLUICE_UCX_CUDA_ROOT=<dir
#   holding include/ and lib/>): device memory registration and the cuda_copy / cuda_ipc
#   transports. Its CUDA module needs libcuda.so.1 only when loaded, so a machine without a GPU
#   (CI) runs the same binaries over the host transports.
#   CPU-only builds, or a CUDA build without that install (with a warning), use the system's
#   UCX through pkg-config (Debian's 1.13, built without CUDA: KV stays in host memory).
# Sets SLUICE_UCX_CUDA (ON: the CUDA-aware UCX is linked) and SLUICE_UCX_PERFTEST (the
# ucx_perftest of the linked UCX, for bench/).
set(SLUICE_UCX_CUDA_ROOT "${CMAKE_SOURCE_DIR}/.deps/ucx-cu13/libucx" CACHE PATH
    "Root (include/, lib/) of the CUDA-aware UCX used when SLUICE_CUDA is on")
set(SLUICE_UCX_CUDA OFF)
add_library(sluice_ucx INTERFACE IMPORTED GLOBAL)
if(SLUICE_CUDA_ENABLED)
  if(EXISTS "${SLUICE_UCX_CUDA_ROOT}/include/ucp/api/ucp.h" AND
     EXISTS "${SLUICE_UCX_CUDA_ROOT}/lib/libucp.so")
    set(SLUICE_UCX_CUDA ON)
    target_include_directories(sluice_ucx INTERFACE "${SLUICE_UCX_CUDA_ROOT}/include")
    # Full paths: CMake puts their directory in the binaries' RPATH, and UCX finds its transport
    # modules (lib/ucx/) next to libucs.
    target_link_libraries(sluice_ucx INTERFACE "${SLUICE_UCX_CUDA_ROOT}/lib/libucp.so"
                          "${SLUICE_UCX_CUDA_ROOT}/lib/libuct.so"
                          "${SLUICE_UCX_CUDA_ROOT}/lib/libucs.so")
    set(SLUICE_UCX_PERFTEST "${SLUICE_UCX_CUDA_ROOT}/bin/ucx_perftest")
    message(STATUS "Sluice UCX: CUDA-aware (${SLUICE_UCX_CUDA_ROOT})")
  else()
    message(WARNING "SLUICE_CUDA is on but the CUDA-aware UCX is not at ${SLUICE_UCX_CUDA_ROOT} "
                    "(run scripts/install_deps.sh): using the system UCX, so KV transfer can "
                    "only move host memory (--device cuda workers refuse to start)")
  endif()
endif()
if(NOT SLUICE_UCX_CUDA)
  pkg_check_modules(UCX REQUIRED IMPORTED_TARGET GLOBAL ucx)
  target_link_libraries(sluice_ucx INTERFACE PkgConfig::UCX)
  find_program(SLUICE_UCX_PERFTEST ucx_perftest)
  message(STATUS "Sluice UCX: system (${UCX_VERSION})")
endif()
