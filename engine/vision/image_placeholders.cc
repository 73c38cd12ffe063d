#include "engine/vision/image_placeholders.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sluice::vision {

absl::StatusOr<ExpandedPrompt> ExpandImagePlaceholders(absl::Span<const int32_t> token_ids,
                                                       int32_t image_token_id,
                                                       int64_t tokens_per_image,
                                                       int64_t num_images) {
  int64_t found = 0;
  for (int32_t id : token_ids) found += id == image_token_id;
  if (found != num_images) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", found,
                                                   " image placeholders for ", num_images,
                                                   " images"));
  }
  ExpandedPrompt out;
  out.token_ids.reserve(token_ids.size() + num_images * (tokens_per_image - 1));
  for (int32_t id : token_ids) {
    if (id != image_token_id) {
      out.token_ids.push_back(id);
      continue;
    }
    out.image_offsets.push_back(static_cast<int32_t>(out.token_ids.size()));
    out.token_ids.insert(out.token_ids.end(), tokens_per_image, image_token_id);
  }
  return out;
}

}  // namespace sluice::vision
