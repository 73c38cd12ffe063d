// ImageEncoder: how an engine gets the embeddings of images it was handed as bytes
// (MultimodalInput::image, the self-encode fallback of disaggregated workers), only when it must
// compute positions of their placeholder runs, and without blocking its thread.
//
// Scheduler side (engine thread, never blocks), as the KV connector's loads:
//   * a waiting sequence about to compute prompt positions that an input without embeddings
//     covers (a new prompt, a preempted or migrated sequence, a KV transfer that failed and is
//     recomputed) is parked in an "encoding" state (not in the waiting queue, holding no blocks
//     it did not already hold) while StartEncode runs; the engine keeps stepping the others;
//   * PollEncodes hands finished encodes back: the sequence gets the embeddings (kept for any
//     later recompute) and returns to the front of the waiting queue; an error finishes the
//     request with kError and that status.
// A sequence that never computes those positions (a decode worker whose KV transfer landed)
// never encodes its images.
#ifndef SLUICE_ENGINE_SCHED_IMAGE_ENCODER_H_
#define SLUICE_ENGINE_SCHED_IMAGE_ENCODER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sched/request.h"

namespace sluice {

struct ImageEncodeResult {
  uint64_t ticket = 0;  // StartEncode's ticket
  // All of StartEncode's inputs, each with embeddings of num_tokens x hidden_size floats; or
  // why they could not be computed (InvalidArgument for an image that does not decode, ...).
  absl::StatusOr<std::vector<MultimodalInput>> inputs;
};

class ImageEncoder {
 public:
  virtual ~ImageEncoder() = default;
  // StartEncode: compute the embeddings of each input of `inputs` that has none, from its
  // image. Never blocks; the result comes from PollEncodes under `ticket`, always.
  virtual void StartEncode(uint64_t ticket, std::vector<MultimodalInput> inputs) = 0;
  // PollEncodes: encodes finished since the last call. Never blocks.
  virtual std::vector<ImageEncodeResult> PollEncodes() = 0;
};

// NeedsImageEncode: some input of `request` without embeddings covers a position at or after
// `from` (a computation starting there needs them).
inline bool NeedsImageEncode(const EngineRequest& request, int32_t from) {
  for (const MultimodalInput& mm : request.mm_inputs) {
    if (mm.embeddings == nullptr && mm.offset + mm.num_tokens > from) return true;
  }
  return false;
}

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_IMAGE_ENCODER_H_
