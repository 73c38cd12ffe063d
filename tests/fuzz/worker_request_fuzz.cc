// A worker's gRPC requests (sluice.v1.PrefillRequest / ReserveRequest / DecodeRequest) with
// arbitrary contents, converted as the prefill and decode handlers convert them
// (SamplingFromWire, MmInputsFromWire) and given to an engine (the fake ChecksumModel, 64 blocks
// of 4 tokens) the way the handler would: a held prefill, a reservation completed by a transfer
// (OK or failed), or a local / migrated decode. Prompts and outputs of any length, token ids
// out of range, sampling values at their limits, images without a vision model, empty ids.
//
// Input: byte 0 the message kind (mod 3: prefill, reserve, decode), byte 1 how a reservation's
// transfer ends (bit 0: OK, else Unavailable; the rest: the first token), then the serialized
// message. Checks beyond "no crash": every sampled token lies in the vocabulary, a reservation
// has blocks for prompt + 1 tokens, all distinct and in range, a first token outside the
// vocabulary is refused, and once the request is aborted the engine holds nothing: every block
// free, no reservation, no pin.
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "engine/sched/llm_engine.h"
#include "services/common/worker_wire.h"
#include "sluice/v1/worker.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/util/fake_models.h"

namespace {

using sluice::EngineRequest;
using sluice::testing::ChecksumModel;

constexpr int64_t kBlocks = 64;
constexpr int64_t kBlockSize = 4;

template <typename Message>
absl::StatusOr<EngineRequest> Common(const Message& m) {
  absl::StatusOr<std::vector<sluice::MultimodalInput>> mm = sluice::MmInputsFromWire(m.mm_inputs());
  if (!mm.ok()) return mm.status();
  EngineRequest er;
  er.request_id = m.request_id();
  er.prompt_token_ids.assign(m.prompt_token_ids().begin(), m.prompt_token_ids().end());
  er.sampling = sluice::SamplingFromWire(m.sampling());
  er.cache_salt = m.cache_salt();
  er.priority = m.priority();
  er.mm_inputs = *std::move(mm);
  // A migration's tokens (every worker call carries them: worker.proto).
  er.resumed_output_token_ids.assign(m.resumed_output_token_ids().begin(),
                                     m.resumed_output_token_ids().end());
  return er;
}

void CheckOutputs(const std::vector<sluice::RequestOutput>& outputs) {
  for (const sluice::RequestOutput& out : outputs) {
    for (const sluice::SampledToken& t : out.new_tokens) {
      if (t.token_id < 0 || t.token_id >= ChecksumModel::kVocab) __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::Input in(data, size);
  const int kind = in.Byte() % 3;
  const uint8_t transfer = in.Byte();
  const std::string_view wire = in.Rest();

  absl::StatusOr<EngineRequest> request = absl::InvalidArgumentError("unparsed");
  if (kind == 0) {
    sluice::v1::PrefillRequest m;
    if (!m.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return 0;
    request = Common(m);
    if (request.ok()) request->hold_kv_blocks = true;
  } else if (kind == 1) {
    sluice::v1::ReserveRequest m;
    if (!m.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return 0;
    request = Common(m);
  } else {
    sluice::v1::DecodeRequest m;
    if (!m.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return 0;
    request = Common(m);
  }
  if (!request.ok()) return 0;
  const std::string id = request->request_id;
  // The KV a transfer brings: the prompt and a migration's resumed tokens.
  const int64_t prompt_len = static_cast<int64_t>(request->prompt_token_ids.size() +
                                                  request->resumed_output_token_ids.size());

  sluice::EngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = kBlocks;
  options.max_model_len = 128;
  options.max_num_batched_tokens = 32;
  auto engine = sluice::LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  if (!engine.ok()) __builtin_trap();
  sluice::LLMEngine& e = **engine;

  if (kind == 1) {
    absl::StatusOr<std::vector<int32_t>> blocks = e.ReserveForTransfer(*request, std::nullopt);
    if (blocks.ok()) {
      if (static_cast<int64_t>(blocks->size()) != sluice::NumBlocksFor(prompt_len + 1, kBlockSize)) {
        __builtin_trap();
      }
      std::set<int32_t> distinct(blocks->begin(), blocks->end());
      if (distinct.size() != blocks->size()) __builtin_trap();
      for (int32_t b : *blocks) {
        if (b < 0 || b >= kBlocks) __builtin_trap();
      }
      // The first token comes off the wire too (PrefillResponse.first_token); ids 64..79 lie
      // outside the vocabulary and must be refused.
      const absl::Status status = (transfer & 1) ? absl::OkStatus()
                                                 : absl::UnavailableError("peer gone");
      const int32_t first = (transfer >> 1) % 80;
      const absl::Status completed = e.CompleteTransfer(id, status, sluice::SampledToken{first});
      if (first >= ChecksumModel::kVocab && !absl::IsInvalidArgument(completed)) __builtin_trap();
    }
  } else {
    (void)e.AddRequest(*request);
  }
  for (int i = 0; i < 12 && e.HasStepWork(); ++i) CheckOutputs(e.Step());
  if (kind == 0) (void)e.ReleaseHeldBlocks(id);
  e.AbortRequest(id);
  for (int i = 0; i < 8 && (e.HasUnfinishedRequests() || e.HasStepWork()); ++i) {
    CheckOutputs(e.Step());
  }
  // Aborted: nothing of the request is left.
  if (e.num_free_blocks() != e.num_total_blocks() || e.num_reserved() != 0 ||
      e.num_held_blocks() != 0) {
    __builtin_trap();
  }
  return 0;
}
