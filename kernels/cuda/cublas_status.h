#ifndef SLUICE_KERNELS_CUDA_CUBLAS_STATUS_H_
#define SLUICE_KERNELS_CUDA_CUBLAS_STATUS_H_

#include <cublas_api.h>

#include "absl/status/status.h"

namespace sluice::kernels {

// CublasStatus maps a cuBLAS / cuBLASLt result to OK or
// Internal("<what>: <status name>: <status text>"). Defined in kernels/linear/linear.cu.
absl::Status CublasStatus(cublasStatus_t s, const char* what);

}  // namespace sluice::kernels

// SLUICE_CUBLAS_RETURN_IF_ERROR(expr, what): returns CublasStatus(expr, what) from the enclosing
// function when the cuBLAS call fails.
#define SLUICE_CUBLAS_RETURN_IF_ERROR(expr, what)                       \
  do {                                                                  \
    const cublasStatus_t sluice_cublas_s_ = (expr);                     \
    if (sluice_cublas_s_ != CUBLAS_STATUS_SUCCESS) {                    \
      return ::sluice::kernels::CublasStatus(sluice_cublas_s_, (what)); \
    }                                                                   \
  } while (false)

#endif  // SLUICE_KERNELS_CUDA_CUBLAS_STATUS_H_
