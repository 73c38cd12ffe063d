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

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_EMBEDDING_EMBEDDING_H_
