#include "engine/model/weight_loader.h"

#include "absl/strings/str_cat.h"

namespace sluice {

absl::StatusOr<std::vector<float>> LoadWeight(const Checkpoint& checkpoint,
                                              const std::string& name,
                                              const std::vector<int64_t>& shape) {
  return checkpoint.ReadFloat32(name, shape);
}

absl::Status LoadWeightInto(const Checkpoint& checkpoint, const std::string& name,
                            const std::vector<int64_t>& shape, std::vector<float>* out) {
  auto w = checkpoint.ReadFloat32(name, shape);
  if (!w.ok()) return w.status();
  *out = std::move(*w);
  return absl::OkStatus();
}

absl::Status LoadOptionalWeightInto(const Checkpoint& checkpoint, const std::string& name,
                                    const std::vector<int64_t>& shape, std::vector<float>* out,
                                    bool* present) {
  out->clear();
  *present = checkpoint.Contains(name);
  if (!*present) return absl::OkStatus();
  return LoadWeightInto(checkpoint, name, shape, out);
}

std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

}  // namespace sluice
