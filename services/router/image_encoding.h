// The router's side of images (issue 26): which of a request's images still need an encoder
// worker, the Encode reply checked and spliced into the request, and the images as the prefill
// and decode workers receive them (PrefillRequest / ReserveRequest / DecodeRequest.mm_inputs).
#ifndef SLUICE_SERVICES_ROUTER_IMAGE_ENCODING_H_
#define SLUICE_SERVICES_ROUTER_IMAGE_ENCODING_H_

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/sched/request.h"
#include "services/router/worker_registry.h"
#include "sluice/v1/encoder.pb.h"
#include "sluice/v1/worker.pb.h"

namespace sluice {

// PendingImages: indices into request.mm_inputs of the images without embeddings.
std::vector<size_t> PendingImages(const EngineRequest& request);

// EncodeRequestFor: the Encode call for those images (their bytes, in order).
v1::EncodeRequest EncodeRequestFor(const EngineRequest& request,
                                   const std::vector<size_t>& pending);

// ApplyEncodeResponse sets the embeddings of request->mm_inputs[pending[i]] from reply
// embedding i and drops their bytes. An embedding answered as a reference (staged on the
// encoder, EmbeddingRef) instead goes to (*refs)[pending[i]] (refs is resized to the inputs;
// its encoder_address set to `encoder_address`), and that input keeps its bytes and no
// embeddings: the workers read the embeddings from the encoder, or encode the bytes if that
// fails. Errors (nothing is changed): Internal when the reply does not answer each image with
// its content hash, token count and num_tokens x hidden_size floats (an encoder serving another
// model or preprocessing config), or answers a reference with no `refs` to take it.
absl::Status ApplyEncodeResponse(const v1::EncodeResponse& reply,
                                 const std::vector<size_t>& pending, EngineRequest* request,
                                 std::vector<v1::EmbeddingRef>* refs = nullptr,
                                 const std::string& encoder_address = "");

// PickEncoder chooses the encoder worker for a request's images by cache affinity on
// `affinity` (the first image's content hash): rendezvous hashing over the live encoders'
// addresses, so an image goes to the encoder that encoded (and cached) it while the pool stays
// the same — unless that encoder has more than `max_extra_load` calls in flight beyond the least
// loaded one, which then gets it (Pick's choice; affinity must not build hotspots). Counts one
// assignment like WorkerRegistry::Pick (undo with Release). nullopt when no encoder outside
// `exclude` is live.
std::optional<WorkerSnapshot> PickEncoder(WorkerRegistry* registry, const BlockHash& affinity,
                                          const std::set<std::string>& exclude,
                                          int64_t max_extra_load = 2);

// ContentHashToWire: 16 bytes, lo then hi, little-endian (ImageEmbedding.content_hash).
std::string ContentHashToWire(const BlockHash& hash);

// MmInputsToWire: every image with its embeddings, or its bytes where it has none (the prefill
// and decode workers then encode it themselves: the self-encode fallback), with its staged
// embeddings' reference where `refs` has one (ApplyEncodeResponse's; may be empty).
void MmInputsToWire(const std::vector<MultimodalInput>& in,
                    google::protobuf::RepeatedPtrField<v1::MultimodalInput>* out,
                    const std::vector<v1::EmbeddingRef>& refs = {});

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_IMAGE_ENCODING_H_
