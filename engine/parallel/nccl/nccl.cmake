# NCCL communicator (engine/parallel/nccl): multi-GPU tensor/expert parallelism, one process per
# GPU. Included from engine/CMakeLists.txt. Built only with the CUDA backend and when nccl.h
# and libnccl are found (the CUDA toolkit's lib/ or the system); otherwise skipped with a
# message. nccl_communicator_test and cuda_tp_test need >= 2 GPUs, so they are not registered
# with ctest.
set(SLUICE_NCCL_ENABLED OFF)
if(SLUICE_CUDA_ENABLED)
  find_path(SLUICE_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME ENV CUDA_HOME
            PATH_SUFFIXES include)
  find_library(SLUICE_NCCL_LIBRARY nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT} ENV NCCL_HOME
                     ENV CUDA_HOME
               PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
  if(SLUICE_NCCL_INCLUDE_DIR AND SLUICE_NCCL_LIBRARY)
    set(SLUICE_NCCL_ENABLED ON)
    message(STATUS "Sluice NCCL communicator: ON (${SLUICE_NCCL_LIBRARY})")
    add_library(sluice_parallel_nccl STATIC ${CMAKE_CURRENT_LIST_DIR}/nccl_communicator.cc)
    target_include_directories(sluice_parallel_nccl PUBLIC ${SLUICE_NCCL_INCLUDE_DIR})
    target_link_libraries(sluice_parallel_nccl PUBLIC sluice_engine CUDA::cudart_static
                          ${SLUICE_NCCL_LIBRARY})
    add_executable(nccl_communicator_test ${CMAKE_CURRENT_LIST_DIR}/nccl_communicator_test.cc)
    target_link_libraries(nccl_communicator_test PRIVATE sluice_parallel_nccl)
    # Tensor-parallel CUDA Llama runner, TP=2 vs TP=1 logits (needs >= 2 GPUs: not in ctest).
    add_executable(cuda_tp_test ${CMAKE_CURRENT_LIST_DIR}/cuda_tp_test.cc)
    target_link_libraries(cuda_tp_test PRIVATE sluice_parallel_nccl sluice_engine_cuda
                          GTest::gtest GTest::gtest_main)
  else()
    message(STATUS "Sluice NCCL communicator: OFF (nccl.h or libnccl not found)")
  endif()
else()
  message(STATUS "Sluice NCCL communicator: OFF (no CUDA backend)")
endif()
