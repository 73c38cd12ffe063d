// Image placeholder expansion: the processor step (transformers' LlavaProcessor) that turns
// each image placeholder token of a tokenized prompt into tokens_per_image copies, whose input
// embeddings the model then replaces, in order, with the images' features.
#ifndef SLUICE_ENGINE_VISION_IMAGE_PLACEHOLDERS_H_
#define SLUICE_ENGINE_VISION_IMAGE_PLACEHOLDERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::vision {

struct ExpandedPrompt {
  std::vector<int32_t> token_ids;
  // Per image, in prompt order: the first position of its tokens_per_image placeholder run.
  std::vector<int32_t> image_offsets;
};

// ExpandImagePlaceholders replaces every `image_token_id` in `token_ids` by tokens_per_image
// copies. Errors: InvalidArgument "the prompt has N image placeholders for M images" when the
// number of placeholders differs from num_images (e.g. the text itself contains the
// placeholder string).
absl::StatusOr<ExpandedPrompt> ExpandImagePlaceholders(absl::Span<const int32_t> token_ids,
                                                       int32_t image_token_id,
                                                       int64_t tokens_per_image,
                                                       int64_t num_images);

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_IMAGE_PLACEHOLDERS_H_
