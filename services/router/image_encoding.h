// The router's side of images (issue 26): which of a request's images still need an encoder
// worker, the Encode reply checked and spliced into the request, and the images as the prefill
// and decode workers receive them (PrefillRequest / ReserveRequest / DecodeRequest.mm_inputs).
#ifndef SLUICE_SERVICES_ROUTER_IMAGE_ENCODING_H_
#define SLUICE_SERVICES_ROUTER_IMAGE_ENCODING_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/sched/request.h"
#include "sluice/v1/encoder.pb.h"
#include "sluice/v1/worker.pb.h"

namespace sluice {

// PendingImages: indices into request.mm_inputs of the images without embeddings.
std::vector<size_t> PendingImages(const EngineRequest& request);

// EncodeRequestFor: the Encode call for those images (their bytes, in order).
v1::EncodeRequest EncodeRequestFor(const EngineRequest& request,
                                   const std::vector<size_t>& pending);

// ApplyEncodeResponse sets the embeddings of request->mm_inputs[pending[i]] from reply
// embedding i and drops their bytes. Errors (nothing is changed): Internal when the reply does
// not answer each image with its content hash, token count and num_tokens x hidden_size floats
// (an encoder serving another model or preprocessing config).
absl::Status ApplyEncodeResponse(const v1::EncodeResponse& reply,
                                 const std::vector<size_t>& pending, EngineRequest* request);

// ContentHashToWire: 16 bytes, lo then hi, little-endian (ImageEmbedding.content_hash).
std::string ContentHashToWire(const BlockHash& hash);

// MmInputsToWire: every image with its embeddings (all must have them).
void MmInputsToWire(const std::vector<MultimodalInput>& in,
                    google::protobuf::RepeatedPtrField<v1::MultimodalInput>* out);

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_IMAGE_ENCODING_H_
