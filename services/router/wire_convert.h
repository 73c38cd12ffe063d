// Conversions between the engine's request/output types and the sluice.v1 wire
// messages, as the router sends and receives them.
#ifndef SLUICE_SERVICES_ROUTER_WIRE_CONVERT_H_
#define SLUICE_SERVICES_ROUTER_WIRE_CONVERT_H_

#include "absl/status/status.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "engine/sched/request.h"
#include "sluice/v1/common.pb.h"

namespace sluice {

// ToWire copies every field of `params` (unset optionals stay unset).
void ToWire(const SamplingParams& params, v1::SamplingParams* out);
// PromptLogprobsFromWire: a worker's prompt logprobs (PrefillResponse, TokenOutput).
std::vector<PromptLogprob> PromptLogprobsFromWire(
    const google::protobuf::RepeatedPtrField<v1::PromptLogprob>& in);
// ToWire converts one sampled token with its top logprobs.
void ToWire(const SampledToken& token, v1::SampledToken* out);
// FromWire converts one sampled token with its top logprobs.
SampledToken FromWire(const v1::SampledToken& token);
// FromWire maps the wire finish reason (UNSPECIFIED → kNone).
FinishReason FromWire(v1::FinishReason reason);
// StatusFromWire turns a stream's Error (absl::StatusCode numbers) into a
// Status with the Error's cause (services/common/misconfigured_peer.h); an unset or zero
// code yields Internal with the message, so an error event is never OK.
absl::Status StatusFromWire(const v1::Error& error);

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_WIRE_CONVERT_H_
