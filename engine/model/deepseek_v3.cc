#include "engine/model/deepseek_v3.h"

#include "absl/status/status.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<Model>> LoadDeepseekV3(const ModelConfig& config,
                                                      const Checkpoint& checkpoint) {
  (void)config;
  (void)checkpoint;
  return absl::UnimplementedError("DeepSeek-V3 model is not implemented yet");
}

}  // namespace sluice
