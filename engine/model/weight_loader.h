// Weight-loading helpers shared by the architecture files (llama.cc, deepseek_v3.cc).
#ifndef SLUICE_ENGINE_MODEL_WEIGHT_LOADER_H_
#define SLUICE_ENGINE_MODEL_WEIGHT_LOADER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/safetensors.h"

namespace sluice {

// LoadWeight reads tensor `name` from `checkpoint`, checks that its shape equals `shape`
// exactly, and returns it converted to float32 (row-major, exact for f32/f16/bf16).
// Errors (the message always names the tensor):
//   NotFound        "missing tensor <name>"
//   InvalidArgument "tensor <name>: shape [a, b] expected [c, d]"
//   InvalidArgument "tensor <name>: dtype I64 is not a float type"
absl::StatusOr<std::vector<float>> LoadWeight(const Checkpoint& checkpoint,
                                              const std::string& name,
                                              const std::vector<int64_t>& shape);

// LoadWeightInto is LoadWeight writing into *out (replacing its contents); returns the status.
// Convenient for loading many tensors: `if (auto s = LoadWeightInto(...); !s.ok()) return s;`.
absl::Status LoadWeightInto(const Checkpoint& checkpoint, const std::string& name,
                            const std::vector<int64_t>& shape, std::vector<float>* out);

// LoadOptionalWeightInto loads `name` if the checkpoint has it (then the shape/dtype checks of
// LoadWeight apply) and leaves *out empty otherwise; *present tells which happened.
absl::Status LoadOptionalWeightInto(const Checkpoint& checkpoint, const std::string& name,
                                    const std::vector<int64_t>& shape, std::vector<float>* out,
                                    bool* present);

// LayerPrefix returns "model.layers.<layer>." — the Hugging Face name prefix of a decoder layer.
std::string LayerPrefix(int64_t layer);

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_WEIGHT_LOADER_H_
