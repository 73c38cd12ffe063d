#include "engine/cuda/dense_attention.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/softmax/softmax_cuda.h"

namespace sluice::cuda_runner {

using kernels::bf16;

absl::StatusOr<std::unique_ptr<DenseAttention>> DenseAttention::Create(cudaStream_t stream) {
  std::unique_ptr<DenseAttention> a(new DenseAttention());
  a->stream_ = stream;
  auto gemm = BatchedGemm::Create(stream);
  if (!gemm.ok()) return gemm.status();
  a->gemm_ = *std::move(gemm);
  return a;
}

absl::Status DenseAttention::Run(const bf16* q, const bf16* k, const bf16* v, int64_t row_stride,
                                 const kernels::BidirectionalAttentionParams& p, bf16* out) {
  const int64_t L = p.seq_len, H = p.num_heads, hd = p.head_dim, D = H * hd;
  if (p.num_sequences < 1 || L < 1 || H < 1 || hd < 1 || row_stride < D) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseAttention: bad shape sequences=", p.num_sequences, " seq_len=", L, " heads=", H,
        " head_dim=", hd, " row_stride=", row_stride));
  }
  const size_t scores = static_cast<size_t>(H * L * L);
  if (scores_.size() < scores) {
    scores_ = kernels::DeviceBuffer<float>();  // free first: the peak is one buffer, not two
    probs_ = kernels::DeviceBuffer<bf16>();
    auto s = kernels::DeviceBuffer<float>::Create(scores);
    if (!s.ok()) return s.status();
    auto pr = kernels::DeviceBuffer<bf16>::Create(scores);
    if (!pr.ok()) return pr.status();
    scores_ = *std::move(s);
    probs_ = *std::move(pr);
  }
  for (int64_t seq = 0; seq < p.num_sequences; ++seq) {
    const int64_t row0 = seq * L;
    // S_h [L, L] = Q_h · K_hᵀ: head h of q/k is the column slice h·hd of each row.
    absl::Status s = gemm_->Run({q + row0 * row_stride, row_stride, hd},
                                {k + row0 * row_stride, row_stride, hd}, /*w_is_kn=*/false,
                                {scores_.data(), L, L * L}, /*y_float=*/true, L, L, hd, H);
    if (!s.ok()) return s;
    s = kernels::ScaledSoftmaxRowsCuda(scores_.data(), H * L, L, p.scale, probs_.data(),
                                       stream_);
    if (!s.ok()) return s;
    // O_h [L, hd] = P_h [L, L] · V_h [L, hd] (V stored [k, n]: w_is_kn), into columns h·hd.
    s = gemm_->Run({probs_.data(), L, L * L}, {v + row0 * row_stride, row_stride, hd},
                   /*w_is_kn=*/true, {out + row0 * D, D, hd}, /*y_float=*/false, L, hd, L, H);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace sluice::cuda_runner
