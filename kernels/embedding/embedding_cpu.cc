#include <cstring>
#include <vector>

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

absl::Status ScatterRowsCpu(const float* values, const int32_t* rows, int64_t num_rows,
                            int64_t dim, float* out, int64_t num_tokens) {
  if (dim < 1 || num_rows < 0 || num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ScatterRowsCpu: bad shape num_rows=",
                                                   num_rows, " dim=", dim, " num_tokens=",
                                                   num_tokens));
  }
  std::vector<bool> seen(static_cast<size_t>(num_tokens), false);
  for (int64_t r = 0; r < num_rows; ++r) {
    const int32_t row = rows[r];
    if (row < 0 || row >= num_tokens || seen[static_cast<size_t>(row)]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input embedding ", r, ": row ", row,
          row < 0 || row >= num_tokens ? absl::StrCat(" is outside [0, ", num_tokens, ")")
                                       : std::string(" is named twice")));
    }
    seen[static_cast<size_t>(row)] = true;
    std::memcpy(out + int64_t{row} * dim, values + r * dim,
                static_cast<size_t>(dim) * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace sluice::kernels
