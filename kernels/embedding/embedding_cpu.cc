#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/embedding/embedding.h"

namespace sluice::kernels {

absl::Status EmbeddingCpu(const float* table, int64_t vocab_size, int64_t dim, const int32_t* ids,
                          int64_t num_tokens, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[t], " at index ", t,
                                                     " is outside the vocabulary [0, ",
                                                     vocab_size, ")"));
    }
    std::memcpy(out + t * dim, table + static_cast<int64_t>(ids[t]) * dim,
                static_cast<size_t>(dim) * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace sluice::kernels
