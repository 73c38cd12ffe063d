// cuda_kernel_bench: ceilings and kernel rates of the CUDA backend on the current GPU.
//   cuda_kernel_bench [OUT.json]
// Measures (CUDA events, mean over timed repetitions after warm-ups):
//   - device-to-device copy bandwidth (cudaMemcpyAsync, bytes read + written per second);
//   - bf16 GEMM TFLOP/s through LinearCuda (cuBLASLt, fp32 accumulation), 2·m·n·k per product;
//   - RMSNorm, fused add+RMSNorm and SiLU·mul achieved bandwidth (bytes the kernel must move)
//     and its fraction of the copy bandwidth.
// Prints the JSON and writes it to OUT.json when given. Exit code 1 on any CUDA error.
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/activation/activation_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/rms_norm/rms_norm_cuda.h"
#include "nlohmann/json.hpp"

namespace sluice::kernels {
namespace {

// TimeMs returns the mean milliseconds of one call of `fn` over `iters` calls after `warmup`.
absl::StatusOr<double> TimeMs(const std::function<absl::Status()>& fn, int warmup, int iters,
                              cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) {
    absl::Status s = fn();
    if (!s.ok()) return s;
  }
  cudaEvent_t start, stop;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "cudaEventCreate");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) {
    absl::Status s = fn();
    if (!s.ok()) return s;
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream), "cudaEventRecord");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(ms) / iters;
}

absl::StatusOr<DeviceBuffer<bf16>> RandomDevice(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<bf16> host(n);
  for (auto& v : host) v = FloatToBf16(dist(rng));
  auto buf = DeviceBuffer<bf16>::Create(n);
  if (!buf.ok()) return buf.status();
  absl::Status s = buf->CopyFromHost(host.data());
  if (!s.ok()) return s;
  return buf;
}

#define BENCH_ASSIGN_OR_RETURN(lhs, expr)       \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

absl::StatusOr<nlohmann::json> Run() {
  nlohmann::json out;
  BENCH_ASSIGN_OR_RETURN(name, CudaDeviceName());
  int device = 0, sms = 0, driver = 0, runtime = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  out["gpu"] = name;
  out["multiprocessors"] = sms;
  out["cuda_driver_version"] = driver;
  out["cuda_runtime_version"] = runtime;
  BENCH_ASSIGN_OR_RETURN(stream_holder, CudaStream::Create());
  cudaStream_t stream = stream_holder.get();
  std::mt19937 rng(1234);

  // Copy bandwidth: 2 GiB buffers, bytes read + written.
  const size_t copy_bytes = size_t{2} << 30;
  BENCH_ASSIGN_OR_RETURN(src, DeviceBuffer<uint8_t>::Create(copy_bytes));
  BENCH_ASSIGN_OR_RETURN(dst, DeviceBuffer<uint8_t>::Create(copy_bytes));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(src.data(), 1, copy_bytes), "cudaMemset");
  BENCH_ASSIGN_OR_RETURN(copy_ms, TimeMs(
                                      [&]() -> absl::Status {
                                        SLUICE_CUDA_RETURN_IF_ERROR(
                                            cudaMemcpyAsync(dst.data(), src.data(), copy_bytes,
                                                            cudaMemcpyDeviceToDevice, stream),
                                            "cudaMemcpyAsync");
                                        return absl::OkStatus();
                                      },
                                      3, 20, stream));
  const double copy_gbps = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  out["copy"] = {{"bytes_per_copy", copy_bytes},
                 {"ms", copy_ms},
                 {"bandwidth_gbps_read_plus_write", copy_gbps}};
  src = DeviceBuffer<uint8_t>();
  dst = DeviceBuffer<uint8_t>();

  // bf16 GEMM through cuBLASLt (y = x·Wᵀ, fp32 accumulation), random data.
  BENCH_ASSIGN_OR_RETURN(lt, CublasLt::Create());
  nlohmann::json gemms = nlohmann::json::array();
  for (int64_t size : {4096, 8192}) {
    const int64_t m = size, n = size, k = size;
    BENCH_ASSIGN_OR_RETURN(x, RandomDevice(static_cast<size_t>(m * k), rng, -1.0f, 1.0f));
    BENCH_ASSIGN_OR_RETURN(w, RandomDevice(static_cast<size_t>(n * k), rng, -1.0f, 1.0f));
    BENCH_ASSIGN_OR_RETURN(y, DeviceBuffer<bf16>::Create(static_cast<size_t>(m * n)));
    BENCH_ASSIGN_OR_RETURN(ms, TimeMs(
                                   [&]() {
                                     return LinearCuda(*lt, x.data(), w.data(), nullptr, y.data(),
                                                       m, n, k, stream);
                                   },
                                   5, size == 4096 ? 100 : 30, stream));
    const double tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
    gemms.push_back({{"m", m}, {"n", n}, {"k", k}, {"ms", ms}, {"tflops", tflops}});
  }
  out["gemm_bf16_cublaslt"] = gemms;

  // Memory-bound kernels on a 32768 × 8192 bf16 tensor (512 MiB).
  const int64_t rows = 32768, dim = 8192;
  const size_t n = static_cast<size_t>(rows * dim);
  BENCH_ASSIGN_OR_RETURN(a, RandomDevice(n, rng, -2.0f, 2.0f));
  BENCH_ASSIGN_OR_RETURN(b, RandomDevice(n, rng, -2.0f, 2.0f));
  BENCH_ASSIGN_OR_RETURN(o, DeviceBuffer<bf16>::Create(n));
  BENCH_ASSIGN_OR_RETURN(weight, RandomDevice(static_cast<size_t>(dim), rng, 0.5f, 1.5f));
  nlohmann::json mem = nlohmann::json::array();
  auto record = [&](const std::string& op, int64_t op_rows, int64_t op_dim, double bytes,
                    double ms) {
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    mem.push_back({{"op", op},
                   {"rows", op_rows},
                   {"dim", op_dim},
                   {"bytes_moved", bytes},
                   {"ms", ms},
                   {"bandwidth_gbps", gbps},
                   {"fraction_of_copy", gbps / copy_gbps}});
  };
  const double tensor_bytes = 2.0 * n;
  // vecs_per_thread 0 is the launcher's default; 1, 2 and 4 are the variants it chooses from.
  for (const int vpt : {0, 1, 2, 4}) {
    const std::string suffix = vpt == 0 ? " (default)" : absl::StrCat(" vecs_per_thread=", vpt);
    auto rms = [&]() {
      return RmsNormCudaTuned(a.data(), dim, nullptr, weight.data(), o.data(), dim, rows, dim,
                              1e-6f, vpt, stream);
    };
    BENCH_ASSIGN_OR_RETURN(rms_ms, TimeMs(rms, 3, 20, stream));
    record("rms_norm" + suffix, rows, dim, 2 * tensor_bytes + 2.0 * dim, rms_ms);
    auto add = [&]() {
      return RmsNormCudaTuned(a.data(), dim, b.data(), weight.data(), o.data(), dim, rows, dim,
                              1e-6f, vpt, stream);
    };
    BENCH_ASSIGN_OR_RETURN(add_ms, TimeMs(add, 3, 20, stream));
    record("add_rms_norm" + suffix, rows, dim, 4 * tensor_bytes + 2.0 * dim, add_ms);
  }
  BENCH_ASSIGN_OR_RETURN(
      silu_ms, TimeMs([&]() { return SiluMulCuda(a.data(), o.data(), rows / 2, dim, stream); }, 3,
                      20, stream));
  record("silu_mul (input [rows, 2 dim])", rows / 2, dim, 1.5 * tensor_bytes, silu_ms);
  out["memory_bound_kernels"] = mem;
  return out;
}

}  // namespace
}  // namespace sluice::kernels

int main(int argc, char** argv) {
  if (!sluice::kernels::CudaAvailable()) {
    std::fprintf(stderr, "cuda_kernel_bench: no CUDA device\n");
    return 1;
  }
  auto result = sluice::kernels::Run();
  if (!result.ok()) {
    std::fprintf(stderr, "cuda_kernel_bench: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const std::string text = result->dump(2);
  std::printf("%s\n", text.c_str());
  if (argc > 1) {
    std::ofstream f(argv[1]);
    f << text << "\n";
    if (!f) {
      std::fprintf(stderr, "cuda_kernel_bench: cannot write %s\n", argv[1]);
      return 1;
    }
  }
  return 0;
}
