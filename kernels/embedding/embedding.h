// Token embedding lookup.
#ifndef SLUICE_KERNELS_EMBEDDING_EMBEDDING_H_
#define SLUICE_KERNELS_EMBEDDING_EMBEDDING_H_

#include <cstdint>

#include "absl/status/status.h"

namespace sluice::kernels {

// EmbeddingCpu copies rows of `table` [vocab_size, dim] (float32, row-major) into
// out [num_tokens, dim]: out[t, :] = table[ids[t], :].
// Errors: InvalidArgument naming the first token id outside [0, vocab_size) (out is then
// partially written).
absl::Status EmbeddingCpu(const float* table, int64_t vocab_size, int64_t dim, const int32_t* ids,
                          int64_t num_tokens, float* out);

// ScatterRowsCpu overwrites whole rows of out [num_tokens, dim] (float32, row-major):
// out[rows[r], :] = values[r, :] for r < num_rows. Vision-language models put the projected
// image features (values [num_rows, dim]) at their placeholder tokens' looked-up embeddings
// this way (engine/model/model.h ForwardInput::embedding_rows).
// Errors: InvalidArgument naming the first row outside [0, num_tokens) or named twice (a
// repeated row has no single value; out is then partially written), or dim < 1.
absl::Status ScatterRowsCpu(const float* values, const int32_t* rows, int64_t num_rows,
                            int64_t dim, float* out, int64_t num_tokens);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_EMBEDDING_EMBEDDING_H_
