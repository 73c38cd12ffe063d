#include "services/common/worker_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/kv/swa_replay.h"
#include "services/common/misconfigured_peer.h"

namespace sluice {

SamplingParams SamplingFromWire(const v1::SamplingParams& in) {
  SamplingParams p;
  if (in.has_temperature()) p.temperature = in.temperature();
  if (in.has_top_p()) p.top_p = in.top_p();
  if (in.has_top_k()) p.top_k = in.top_k();
  if (in.has_min_p()) p.min_p = in.min_p();
  if (in.has_presence_penalty()) p.presence_penalty = in.presence_penalty();
  if (in.has_frequency_penalty()) p.frequency_penalty = in.frequency_penalty();
  if (in.has_repetition_penalty()) p.repetition_penalty = in.repetition_penalty();
  if (in.has_seed()) p.seed = in.seed();
  p.choice_index = in.choice_index();
  if (in.has_max_tokens()) p.max_tokens = in.max_tokens();
  if (in.has_min_tokens()) p.min_tokens = in.min_tokens();
  p.ignore_eos = in.ignore_eos();
  p.stop_token_ids.assign(in.stop_token_ids().begin(), in.stop_token_ids().end());
  p.stop.assign(in.stop().begin(), in.stop().end());
  p.include_stop_str_in_output = in.include_stop_str_in_output();
  if (in.has_skip_special_tokens()) p.skip_special_tokens = in.skip_special_tokens();
  if (in.has_logprobs()) p.logprobs = in.logprobs();
  p.allowed_token_ids.assign(in.allowed_token_ids().begin(), in.allowed_token_ids().end());
  for (const v1::LogitBias& b : in.logit_bias()) p.logit_bias.emplace_back(b.token_id(), b.bias());
  for (const v1::BadWord& w : in.bad_words()) {
    p.bad_words_token_ids.emplace_back(w.token_ids().begin(), w.token_ids().end());
  }
  if (in.has_prompt_logprobs()) p.prompt_logprobs = in.prompt_logprobs();
  return p;
}

void SampledTokenToWire(const SampledToken& in, v1::SampledToken* out) {
  out->set_token_id(in.token_id);
  out->set_logprob(in.logprob);
  for (const TokenLogprob& t : in.top_logprobs) {
    v1::TokenLogprob* w = out->add_top_logprobs();
    w->set_token_id(t.token_id);
    w->set_logprob(t.logprob);
  }
}

void PromptLogprobToWire(const PromptLogprob& in, v1::PromptLogprob* out) {
  out->set_token_id(in.token_id);
  out->set_logprob(in.logprob);
  out->set_rank(in.rank);
  for (const TokenLogprob& t : in.top_logprobs) {
    v1::TokenLogprob* w = out->add_top_logprobs();
    w->set_token_id(t.token_id);
    w->set_logprob(t.logprob);
  }
}

v1::FinishReason FinishReasonToWire(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return v1::FINISH_REASON_ABORT;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_ERROR;
}

void OutputToWire(const RequestOutput& in, v1::TokenOutput* out) {
  out->set_request_id(in.request_id);
  for (const SampledToken& t : in.new_tokens) SampledTokenToWire(t, out->add_tokens());
  for (const PromptLogprob& p : in.prompt_logprobs) {
    PromptLogprobToWire(p, out->add_prompt_logprobs());
  }
  out->set_finish_reason(FinishReasonToWire(in.finish_reason));
  const bool first = !in.new_tokens.empty() &&
                     in.num_output_tokens <= static_cast<int32_t>(in.new_tokens.size());
  if (in.queue_seconds >= 0 && (first || in.finished())) out->set_queue_seconds(in.queue_seconds);
  v1::Usage* usage = out->mutable_usage();
  usage->set_prompt_tokens(in.num_prompt_tokens);
  usage->set_completion_tokens(in.num_output_tokens);
  usage->set_cached_tokens(in.num_cached_tokens);
  if (in.finish_reason == FinishReason::kError) {
    ErrorToWire(in.status, out->mutable_error());  // with its cause (misconfigured peers)
  }
}

absl::StatusOr<std::vector<MultimodalInput>> MmInputsFromWire(
    const google::protobuf::RepeatedPtrField<v1::MultimodalInput>& in) {
  std::vector<MultimodalInput> out;
  out.reserve(in.size());
  for (int i = 0; i < in.size(); ++i) {
    const v1::MultimodalInput& w = in.Get(i);
    if (w.content_hash().size() != 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("mm_inputs[", i, "].content_hash must be 16 bytes"));
    }
    if (w.embeddings().size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mm_inputs[", i, "].embeddings is not whole float32 values"));
    }
    MultimodalInput mm;
    mm.offset = w.offset();
    mm.num_tokens = w.num_tokens();
    for (int b = 0; b < 8; ++b) {
      mm.content_hash.lo |= uint64_t{static_cast<uint8_t>(w.content_hash()[b])} << (8 * b);
      mm.content_hash.hi |= uint64_t{static_cast<uint8_t>(w.content_hash()[8 + b])} << (8 * b);
    }
    if (w.embeddings().empty() && !w.image().empty()) {
      // To be encoded by this worker (WorkerImages, the self-encode fallback).
      mm.image = std::make_shared<const std::string>(w.image());
      out.push_back(std::move(mm));
      continue;
    }
    auto values = std::make_shared<std::vector<float>>(w.embeddings().size() / sizeof(float));
    // Neither embeddings nor image: an empty list, which the engine refuses (with num_tokens > 0)
    // as embeddings of the wrong size. memcpy's pointers must be valid even for 0 bytes.
    if (!values->empty()) {
      std::memcpy(values->data(), w.embeddings().data(), w.embeddings().size());  // little-endian
    }
    mm.embeddings = std::move(values);
    out.push_back(std::move(mm));
  }
  return out;
}

std::vector<transfer::KvRegion> KvRegionsOf(KvCache& cache) {
  std::vector<transfer::KvRegion> regions;
  const KvCacheSpec& spec = cache.spec();
  const int64_t k_bytes = cache.block_size() * spec.k_floats_per_token * 4;
  const int64_t v_bytes = cache.block_size() * spec.v_floats_per_token * 4;
  for (int64_t layer = 0; layer < spec.num_layers; ++layer) {
    regions.push_back({cache.k(layer), cache.num_blocks(), k_bytes});
    if (v_bytes > 0) regions.push_back({cache.v(layer), cache.num_blocks(), v_bytes});
  }
  return regions;
}

std::vector<int32_t> TransferRegionIndices(const Model& model, int64_t swa_replay_tokens) {
  const KvCacheSpec spec = model.kv_cache_spec();
  absl::StatusOr<KvTransferLayout> layout = MakeKvTransferLayout(
      model.config(), spec,
      swa_replay_tokens > 0 ? KvLayerSelection::kFullAttentionOnly : KvLayerSelection::kAllLayers);
  if (layout.ok()) return layout->region_indices;
  // A spec that does not follow the config's layers (not a replayable model): every region.
  std::vector<int32_t> all;
  const int32_t per_layer = spec.v_floats_per_token > 0 ? 2 : 1;
  for (int32_t i = 0; i < spec.num_layers * per_layer; ++i) all.push_back(i);
  return all;
}

absl::StatusOr<KvTransferMemory> KvTransferMemoryOf(const Model& model, KvCache& cache) {
  KvTransferMemory out;
  std::vector<DeviceKvArray> device = model.DeviceKvArrays();
  if (!device.empty()) {
    for (const DeviceKvArray& a : device) {
      out.regions.push_back({a.base, a.num_blocks, a.block_bytes});
    }
    out.type = transfer::MemoryType::kCuda;
    return out;
  }
  out.regions = KvRegionsOf(cache);
  for (const transfer::KvRegion& r : out.regions) {
    if (r.base == nullptr) {
      return absl::FailedPreconditionError(
          "the KV cache has no memory to transfer yet (a device cache is allocated by the "
          "first step)");
    }
  }
  return out;
}

v1::KvLayout LayoutOf(const KvCache& cache, int64_t dtype_bytes) {
  v1::KvLayout layout;
  layout.set_num_layers(static_cast<int32_t>(cache.spec().num_layers));
  layout.set_block_size(static_cast<int32_t>(cache.block_size()));
  layout.set_floats_per_token(
      static_cast<int32_t>(cache.spec().k_floats_per_token + cache.spec().v_floats_per_token));
  layout.set_dtype_bytes(static_cast<int32_t>(dtype_bytes));
  layout.set_num_blocks(cache.num_blocks());
  return layout;
}

bool SameKvLayout(const v1::KvLayout& a, const v1::KvLayout& b) {
  return a.block_size() == b.block_size() && a.num_layers() == b.num_layers() &&
         a.floats_per_token() == b.floats_per_token() && a.dtype_bytes() == b.dtype_bytes();
}

std::string DescribeKvLayout(const v1::KvLayout& layout) {
  return absl::StrCat("block_size ", layout.block_size(), ", ", layout.num_layers(),
                      " layers, ", layout.floats_per_token(), " values/token of ",
                      layout.dtype_bytes(), " bytes");
}

}  // namespace sluice
