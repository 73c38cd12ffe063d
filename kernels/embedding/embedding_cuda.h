// CUDA token embedding gather (bf16). Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_EMBEDDING_EMBEDDING_CUDA_H_
#define SLUICE_KERNELS_EMBEDDING_EMBEDDING_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// EmbeddingCuda: out[t, :] = table[ids[t], :] for t < num_tokens. table: [vocab_size, dim] bf16,
// ids: [num_tokens] int32 (device), out: [num_tokens, dim] bf16.
// Ids are only known on the device, so a bad id cannot fail the call: a row whose id is
// outside [0, vocab_size) is zero-filled and, when `bad_index` (device, one int32) is not null,
// atomicMin(bad_index, t) records the first such token. Callers set *bad_index to INT32_MAX
// beforehand and check it when they next synchronize (EmbeddingCpu's InvalidArgument case).
// Errors: InvalidArgument for vocab_size < 1, dim < 1 or num_tokens < 0; Internal for launch
// errors. As a programmatic dependent (`pdl`) the kernel reads nothing before its wait.
absl::Status EmbeddingCuda(const bf16* table, int64_t vocab_size, int64_t dim, const int32_t* ids,
                           int64_t num_tokens, bf16* out, int32_t* bad_index, cudaStream_t stream,
                           bool pdl = false);

// EmbeddingFeedbackCuda: EmbeddingCuda where a negative ids[t] = -(r + 1) stands for
// feedback[r] (e.g. the token the previous decode step sampled for its logits row r, so a
// step needs no host round trip): such ids are replaced by feedback[r] in place (ids is
// [num_tokens] int32, device, read-write) and the row of the resolved id is gathered, in one
// launch. feedback: device int32, indexed by every r so named. Non-negative ids are left alone.
// Errors: those of EmbeddingCuda, and InvalidArgument for null ids or feedback (num_tokens > 0).
absl::Status EmbeddingFeedbackCuda(const bf16* table, int64_t vocab_size, int64_t dim,
                                   int32_t* ids, const int32_t* feedback, int64_t num_tokens,
                                   bf16* out, int32_t* bad_index, cudaStream_t stream,
                                   bool pdl = false);

// ScatterRowsCuda: out[rows[r], :] = bf16(values[r, :]) (round to nearest even) for
// r < num_rows — ScatterRowsCpu on the device, for the input embeddings of a vision-language
// model's image placeholder tokens (values: the projected image features, fp32). values:
// [num_rows, dim] fp32, rows: [num_rows] int32 (both device), out: [num_tokens, dim] bf16.
// Rows are only known on the device: one outside [0, num_tokens) is skipped, and a row named
// twice gets either value — callers validate on the host (ScatterRowsCpu's errors).
// Errors: InvalidArgument for dim < 1, num_rows < 0 or num_tokens < 0; Internal for launch
// errors.
absl::Status ScatterRowsCuda(const float* values, const int32_t* rows, int64_t num_rows,
                             int64_t dim, bf16* out, int64_t num_tokens, cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_EMBEDDING_EMBEDDING_CUDA_H_
