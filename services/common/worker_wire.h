// Conversions between engine types and sluice.v1 messages used by the prefill and decode
// workers (the router's services/router/wire_convert.h covers the other direction).
#ifndef SLUICE_SERVICES_COMMON_WORKER_WIRE_H_
#define SLUICE_SERVICES_COMMON_WORKER_WIRE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_block_allocator.h"
#include "engine/model/model.h"
#include "engine/sched/request.h"
#include "sluice/v1/common.pb.h"
#include "services/common/peer_kv_blocks.h"
#include "sluice/v1/kv.pb.h"
#include "sluice/v1/worker.pb.h"
#include "transfer/kv_transfer.h"

namespace sluice {

// SamplingFromWire: unset optional fields keep sluice::SamplingParams' defaults.
SamplingParams SamplingFromWire(const v1::SamplingParams& in);
// EngineRequestFromWire: the engine request of a worker call (a PrefillRequest, ReserveRequest
// or DecodeRequest: the fields they share) under `request_id`, with the call's grammar and
// images as already checked (RequestGrammar, MmInputsFromWire).
template <typename WireRequest>
EngineRequest EngineRequestFromWire(const WireRequest& in, std::string request_id,
                                    std::shared_ptr<const grammar::CompiledGrammar> grammar,
                                    std::vector<MultimodalInput> mm_inputs) {
  EngineRequest er;
  er.request_id = std::move(request_id);
  er.prompt_token_ids.assign(in.prompt_token_ids().begin(), in.prompt_token_ids().end());
  er.sampling = SamplingFromWire(in.sampling());
  er.grammar = std::move(grammar);
  er.cache_salt = in.cache_salt();
  er.priority = in.priority();
  er.mm_inputs = std::move(mm_inputs);
  // A migration: the outputs the client already has (see worker.proto).
  er.resumed_output_token_ids.assign(in.resumed_output_token_ids().begin(),
                                     in.resumed_output_token_ids().end());
  return er;
}
void SampledTokenToWire(const SampledToken& in, v1::SampledToken* out);
void PromptLogprobToWire(const PromptLogprob& in, v1::PromptLogprob* out);
v1::FinishReason FinishReasonToWire(FinishReason reason);
// OutputToWire: one engine output as a stream message (usage totals, error for kError).
void OutputToWire(const RequestOutput& in, v1::TokenOutput* out);

// MmInputsFromWire: a request's images (PrefillRequest / ReserveRequest / DecodeRequest
// .mm_inputs) with their embeddings, or with their image bytes (`image`, no embeddings) where
// the router sent bytes for the worker to encode (CheckImages, worker_images.h).
// Errors: InvalidArgument for a content hash that is not 16 bytes, or embeddings that are not
// whole float32 values (the engine checks the shape).
absl::StatusOr<std::vector<MultimodalInput>> MmInputsFromWire(
    const google::protobuf::RepeatedPtrField<v1::MultimodalInput>& in);

// KvRegionsOf: the transfer regions of a KV cache, in the order both workers use: for each
// layer its k array, then its v array (omitted when v_floats_per_token is 0).
std::vector<transfer::KvRegion> KvRegionsOf(KvCache& cache);
// KvTransferMemory: the transfer regions of an engine's KV and where they live: the model's
// device arrays (Model::DeviceKvArrays, same order) when it keeps its KV in device memory
// (CUDA), else KvRegionsOf(cache). Errors: FailedPrecondition when neither holds memory (a
// device model before its first step allocated the cache).
struct KvTransferMemory {
  std::vector<transfer::KvRegion> regions;
  transfer::MemoryType type = transfer::MemoryType::kHost;
};
absl::StatusOr<KvTransferMemory> KvTransferMemoryOf(const Model& model, KvCache& cache);
// TransferRegionIndices: the indices into KvRegionsOf's list that a KV transfer moves:
// with swa_replay_tokens > 0 (EffectiveSwaReplayTokens) only the full-attention layers'
// (KvTransferLayout::region_indices of kFullAttentionOnly), else every region.
std::vector<int32_t> TransferRegionIndices(const Model& model, int64_t swa_replay_tokens);
// LayoutOf: the cache geometry for KvBlocks.layout; `dtype_bytes`: Model::KvDtypeBytes (4 for
// the host float32 cache, 2 for a bf16 device cache), so a CPU and a CUDA worker never pair.
v1::KvLayout LayoutOf(const KvCache& cache, int64_t dtype_bytes);
// SameKvLayout: block size, layers, floats per token and dtype all equal (blocks of one side can
// be copied byte for byte into the other's). DescribeKvLayout names them for error messages.
bool SameKvLayout(const v1::KvLayout& a, const v1::KvLayout& b);
std::string DescribeKvLayout(const v1::KvLayout& layout);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_WORKER_WIRE_H_
