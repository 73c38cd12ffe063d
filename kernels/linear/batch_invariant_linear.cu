#include "kernels/linear/batch_invariant_linear.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/linear/skinny_gemm.h"

namespace sluice::kernels {
namespace {

constexpr int64_t kWarpsPerCta = 8;  // skinny_gemm.cu's kWarps

}  // namespace

int BatchInvariantGemmSplit(int64_t n, bool glu, int64_t target_ctas) {
  const int64_t cols_per_group = glu ? 16 : 32;  // output columns one warp owns
  const int64_t groups = (n + cols_per_group - 1) / cols_per_group;
  for (int split : {1, 2, 4}) {
    const int64_t groups_per_cta = kWarpsPerCta / split;
    if ((groups + groups_per_cta - 1) / groups_per_cta >= target_ctas) return split;
  }
  return 8;
}

int64_t BatchInvariantChunkRows(int split) { return split == 8 ? 32 : 64; }

absl::Status BatchInvariantLinearCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                                      int64_t m, int64_t n, int64_t k, bool glu,
                                      cudaStream_t stream, int64_t target_ctas) {
  const int64_t w_rows = glu ? 2 * n : n;
  if (m < 1 || y == nullptr || !skinny_detail::SkinnySupported(x, w, 1, w_rows, k)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BatchInvariantLinearCuda: needs m >= 1, 1 <= n < 2^30, k a positive multiple of 8, "
        "16-byte aligned x and w and an output buffer (m=", m, " n=", n, " k=", k,
        glu ? " SiLU·mul" : "", ")"));
  }
  const int split = BatchInvariantGemmSplit(n, glu, target_ctas);
  const int64_t chunk = BatchInvariantChunkRows(split);
  // Deeper rings where they fit; the depth never changes an element's additions.
  const int stages = skinny_detail::SkinnyVariantSupported(chunk, split, 4) ? 4 : 3;
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int64_t rows = std::min(chunk, m - r0);
    skinny_detail::LaunchSkinny(x + r0 * k, w, bias, y + r0 * n, rows, n, k, split, stages, glu,
                                stream, /*pdl=*/false);
  }
  return CudaLaunchStatus(glu ? "BatchInvariantLinearCuda (SiLU·mul)" : "BatchInvariantLinearCuda");
}

}  // namespace sluice::kernels
