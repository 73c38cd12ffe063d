// Model: a causal LM forward pass over a paged KV cache.
//
// One Forward call runs a step of continuous batching: any mix of prefill chunks and decode
// tokens from several sequences, flattened into one token list. The scheduler plans the step
// (block tables, slot mapping) on the host; the model only consumes the plan.
#ifndef SLUICE_ENGINE_MODEL_MODEL_H_
#define SLUICE_ENGINE_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/model_config.h"
#include "kernels/sampling/logits_processing.h"
#include "kernels/sampling/sampling.h"

namespace sluice {

class Communicator;  // engine/parallel/communicator.h

// KvCacheSpec describes what one token stores per layer. A standard attention layer stores
// K [num_kv_heads, head_dim] and V [num_kv_heads, v_head_dim]; an MLA layer stores the
// compressed latent [kv_lora_rank] and the shared rope key [qk_rope_head_dim] as "K" and
// nothing as "V" (v_floats_per_token = 0).
struct KvCacheSpec {
  int64_t num_layers = 0;
  int64_t k_floats_per_token = 0;  // per layer
  int64_t v_floats_per_token = 0;  // per layer
  int64_t BytesPerToken() const {  // over all layers, float32 storage
    return num_layers * (k_floats_per_token + v_floats_per_token) * 4;
  }
};

// KvCache owns the paged KV storage on the CPU backend:
//   k(layer): [num_blocks, block_size, k_floats_per_token], float32
//   v(layer): [num_blocks, block_size, v_floats_per_token], float32
// Slot s = block_id * block_size + offset_in_block addresses one token's entry.
// Not thread-safe; the engine owns it and runs one step at a time.
class KvCache {
 public:
  // allocate_storage false: geometry only, k()/v() are null — for models that keep their KV
  // elsewhere (the CUDA runners hold it in device memory and read only num_blocks/block_size).
  KvCache(const KvCacheSpec& spec, int64_t num_blocks, int64_t block_size,
          bool allocate_storage = true);
  const KvCacheSpec& spec() const { return spec_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  bool has_storage() const { return !k_.empty(); }
  float* k(int64_t layer) { return has_storage() ? k_[layer].data() : nullptr; }
  float* v(int64_t layer) { return has_storage() ? v_[layer].data() : nullptr; }
  const float* k(int64_t layer) const { return has_storage() ? k_[layer].data() : nullptr; }
  const float* v(int64_t layer) const { return has_storage() ? v_[layer].data() : nullptr; }
  // Bytes of one block over all layers.
  int64_t BlockBytes() const { return spec_.BytesPerToken() * block_size_; }

 private:
  KvCacheSpec spec_;
  int64_t num_blocks_;
  int64_t block_size_;
  std::vector<std::vector<float>> k_;
  std::vector<std::vector<float>> v_;
};

// SequenceSlice is one sequence's part of a step: tokens
// [query_start, query_start + num_query_tokens) of the flattened batch are this sequence's
// positions [num_context_tokens, num_context_tokens + num_query_tokens). The first
// num_context_tokens tokens are already in the KV cache. block_table lists the sequence's KV
// blocks in order (it covers at least num_context_tokens + num_query_tokens tokens).
struct SequenceSlice {
  int32_t query_start = 0;
  int32_t num_query_tokens = 0;
  int32_t num_context_tokens = 0;
  absl::Span<const int32_t> block_table;
};

// LayerKvWait: blocks until a layer's K/V written by a step is complete in memory (a device
// backend's event on its compute stream); OK, or the device's error.
using LayerKvWait = std::function<absl::Status()>;
// LayerKvHook: ForwardInput::on_layer_kv_written.
using LayerKvHook = std::function<void(int32_t layer, const LayerKvWait& wait)>;

// ForwardInput is one step's plan.
struct ForwardInput {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens], absolute position in its sequence
  std::vector<int64_t> slot_mapping;  // [num_tokens], KV slot each token's K/V is written to
  std::vector<SequenceSlice> sequences;
  std::vector<int32_t> logits_indices;  // flattened token indices whose logits are wanted

  // Optional hooks for SWA bounded replay (engine/kv/swa_replay.h, docs/design.md "SWA bounded
  // replay"); both empty in ordinary steps, which then run exactly as without them. Only models
  // whose SupportsSwaReplay() is true honour them; callers must check it (swa_replay.cc does).
  //
  // kv_frozen_layers [num_layers] or empty: a non-zero entry keeps that layer's cache entries
  // untouched by this step (its new K/V are computed but not written); its attention reads the
  // cache as it is, the query tokens' own entries included. Replay uses it to make
  // full-attention layers attend the exact transferred K/V instead of recomputed ones. It holds
  // for every sequence of the step, so a replay runs as a Forward of its own.
  std::vector<uint8_t> kv_frozen_layers;
  // sliding_kv_start [sequences.size()] or empty: the first position whose sliding-window
  // layers' K/V is present in the cache for that sequence (0..num_context_tokens). A query at
  // position i of a sliding layer then attends keys max(sliding_kv_start, i - window + 1)..i
  // instead of i - window + 1..i. Full-attention layers are unaffected.
  std::vector<int32_t> sliding_kv_start;

  // Input embeddings given instead of looked up (vision-language models: image features at
  // their placeholder tokens; Model::SupportsInputEmbeddings). Row r of embedding_values
  // [embedding_rows.size(), hidden_size] (float32) is the input embedding of flattened token
  // embedding_rows[r]; its token id is still validated and hashed but not embedded. Both empty
  // in text-only steps.
  std::vector<int32_t> embedding_rows;
  std::vector<float> embedding_values;

  // Per-layer completion hook (layer-by-layer KV push from a prefill worker; empty in ordinary
  // steps, which then run exactly as without it). When set, Forward/ForwardGreedy call it once
  // per layer, in order 0..num_layers-1, on the forward's thread, after that layer's K/V of this
  // step were written to the cache and before later layers' compute. `wait` is null when the
  // K/V are already in memory (the CPU models); a device model passes one that blocks until
  // they are (CUDA: an event recorded on the compute stream right after the write). The hook
  // must not block (queue the work). Only models whose SupportsLayerKvHook() is true call it.
  LayerKvHook on_layer_kv_written;
};

// ParallelShard names one rank's part of a tensor/expert-parallel model replica (issue 4;
// engine/parallel/). Every rank holds its own Model instance, loaded in full and then cut down
// by Model::Shard, and calls Forward with the same ForwardInput at the same time.
struct ParallelShard {
  int32_t rank = 0;
  int32_t world_size = 1;
  // The group's communicator (not owned; must outlive the model). Used only inside Forward.
  Communicator* comm = nullptr;
  // Tensor parallelism: attention heads and dense MLPs split (q/k/v and gate/up by output rows,
  // o_proj and down_proj by input columns, each followed by an all-reduce). Embeddings,
  // norms and lm_head stay replicated.
  bool tensor_parallel = true;
  // Expert parallelism (MoE models): routed experts sharded over the ranks, routed tokens
  // dispatched to and combined from the experts' owners with AllToAllV.
  bool expert_parallel = false;
  // Expert parallelism: the logical expert of every physical slot, rank-major
  // [world_size * slots_per_rank] (engine/parallel/eplb.h ExpertPlacement::physical_to_logical,
  // the same for every MoE layer); empty: experts split contiguously, E / world_size per rank.
  std::vector<int32_t> expert_slots;
};

// GreedyToken is one logits row's greedy choice (Model::ForwardGreedy): the argmax id of the raw
// logits (lowest id on ties, NaN never wins, an all -inf/NaN row gives 0) and its
// log_softmax value, logit_max - logsumexp(logits).
struct GreedyToken {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

// DeviceKvArray: one array of a KV cache that lives in device memory (Model::DeviceKvArrays):
// num_blocks equally sized blocks, block b at base + b * block_bytes.
struct DeviceKvArray {
  void* base = nullptr;
  int64_t num_blocks = 0;
  int64_t block_bytes = 0;
};

// Model is implemented per architecture (llama.cc, qwen3 via llama.cc, deepseek_v3.cc).
class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvCacheSpec kv_cache_spec() const = 0;
  // Bytes of weights read by one decode step of one token (routed experts counted only for the
  // experts a token uses). Used for the memory-bandwidth roofline in bench/.
  virtual int64_t WeightBytesPerToken() const = 0;
  // The same weights as a count of values (bench/ estimates 2 FLOPs per value and token); the
  // default holds for float32 storage.
  virtual int64_t WeightsPerToken() const { return WeightBytesPerToken() / 4; }
  // Forward runs one step: writes every token's K/V into `kv_cache` at its slot, attends over
  // each sequence's cached context plus its new tokens (causal, sliding window where the layer
  // has one), and writes logits for each of `input.logits_indices` into
  // `logits` [logits_indices.size(), vocab_size], float32.
  // Errors: InvalidArgument for a token id outside the vocabulary or an inconsistent plan.
  virtual absl::Status Forward(const ForwardInput& input, KvCache& kv_cache,
                               absl::Span<float> logits) = 0;
  // True when Forward honours ForwardInput::embedding_rows / embedding_values (required for
  // requests with images; the engine refuses them otherwise).
  virtual bool SupportsInputEmbeddings() const { return false; }
  // True when Forward is batch invariant: every logits row and every K/V entry it writes is,
  // bit for bit, a function of its own sequence's tokens and cached K/V alone — not of the
  // other sequences in the step, the step's token count, how the prompt was split into chunks,
  // or whether the context's K/V was computed in this step, earlier, taken from the prefix
  // cache or transferred in. Every reduction then has one fixed order (EngineOptions::
  // batch_invariant requires it).
  virtual bool IsBatchInvariant() const { return false; }
  // True when ForwardGreedy is implemented (a model that can pick greedy tokens where its
  // logits are, e.g. on the GPU, and skip shipping [rows, vocab] logits to the host).
  virtual bool SupportsDeviceGreedy() const { return false; }
  // ForwardGreedy runs the step as Forward does but returns, instead of the logits, one
  // GreedyToken per logits row (out [logits_indices.size()]): what engine/sample's SampleToken
  // would pick and report as the chosen token's logprob for greedy params without penalties,
  // min_tokens suppression or top logprobs, given the logits Forward would have written
  // (logprob equal up to float rounding of the log-sum-exp). Errors: those of Forward;
  // InvalidArgument when out has the wrong size; Unimplemented when !SupportsDeviceGreedy().
  virtual absl::Status ForwardGreedy(const ForwardInput& input, KvCache& kv_cache,
                                     absl::Span<GreedyToken> out) {
    return absl::UnimplementedError("this model does not support ForwardGreedy");
  }
  // --- Asynchronous sampled steps (the engine's async scheduling; CUDA models) ---
  // True when EnqueueSampledStep / ReadSampledStep are implemented.
  virtual bool SupportsAsyncSteps() const { return false; }
  // EnqueueSampledStep starts the step `input` and the sampling of its logits rows where the
  // logits are, one kernels::SamplingRow per row (rows [logits_indices.size()]; temperature 0
  // = greedy), and returns without waiting for it. A token id t < 0 in input.token_ids stands
  // for -(t + 1) = row r of the previous enqueued step's sampled tokens, read where they were
  // sampled (no host round trip). At most kMaxUnreadSteps steps may be unread.
  // Errors (nothing enqueued): those of Forward; InvalidArgument for rows.size() !=
  // logits_indices.size() or a row reference beyond the previous step's rows;
  // FailedPrecondition with kMaxUnreadSteps steps unread; Unimplemented when unsupported.
  static constexpr int kMaxUnreadSteps = 2;
  virtual absl::Status EnqueueSampledStep(const ForwardInput& input, KvCache& kv_cache,
                                          absl::Span<const kernels::SamplingRow> rows) {
    return absl::UnimplementedError("this model does not support asynchronous steps");
  }
  // ReadSampledStep waits for the oldest unread enqueued step and writes its tokens and their
  // logprobs (log_softmax of the raw logits at the chosen token), one per logits row.
  // Errors: FailedPrecondition when no step is unread; InvalidArgument when out.size() differs
  // from that step's rows (the step stays unread); Internal for device errors.
  virtual absl::Status ReadSampledStep(absl::Span<GreedyToken> out) {
    return absl::UnimplementedError("this model does not support asynchronous steps");
  }
  virtual int NumUnreadSteps() const { return 0; }

  // --- Logits processing and top logprobs in asynchronous steps ---
  // DeviceLogitsProcessing is what EnqueueProcessedSampledStep adds to a step: per sampling row,
  // engine/sample's SampleToken processing before the choice (min_tokens suppression,
  // repetition / frequency / presence penalties; kernels/sampling/logits_processing.h) and the
  // number of top logprobs wanted.
  struct DeviceLogitsProcessing {
    // Empty (no processing) or one per sampling row; lists index `ids`. An id -(r + 1) in a
    // list is row r of the previous enqueued step's sampled tokens (its placeholder).
    std::vector<kernels::LogitsProcessingRow> rows;
    std::vector<int32_t> ids;
    // The grammar-constrained rows' token bitmasks (LogitsProcessingRow::mask_begin indexes
    // here; kernels::MaskWords(vocab) words each); empty when no row has one.
    std::vector<uint32_t> masks;
    // Empty (none) or one per sampling row: top logprobs wanted, 0..kernels' kMaxTopLogprobs
    // (20, SamplingParams' limit).
    std::vector<int32_t> top_logprobs;
  };
  // True when EnqueueProcessedSampledStep / ReadSampledStepWithTop are implemented: every
  // sampling row SampleToken handles (penalties, min_tokens, top logprobs included) can be
  // sampled where the logits are. False: only sampler.h's IsDeviceSamplable rows can.
  virtual bool SupportsDeviceLogitsProcessing() const { return false; }
  // EnqueueProcessedSampledStep is EnqueueSampledStep with `processing` applied to the rows'
  // logits before the choice; chosen-token logprobs stay those of the raw logits (as
  // SampleToken's). Errors: those of EnqueueSampledStep; InvalidArgument when processing.rows
  // or processing.top_logprobs is neither empty nor one per row, a list range is outside ids,
  // a mask outside masks, or a top count is outside [0, 20]; Unimplemented when
  // !SupportsDeviceLogitsProcessing().
  virtual absl::Status EnqueueProcessedSampledStep(const ForwardInput& input, KvCache& kv_cache,
                                                   absl::Span<const kernels::SamplingRow> rows,
                                                   const DeviceLogitsProcessing& processing) {
    return absl::UnimplementedError("this model does not support device logits processing");
  }
  // ReadSampledStepWithTop is ReadSampledStep plus, per row, the top logprobs its step asked
  // for (top [rows]: resized; empty for rows that asked none), ordered as SampleToken's
  // (descending, the lower id first on ties). Errors: those of ReadSampledStep; Unimplemented
  // when !SupportsDeviceLogitsProcessing().
  virtual absl::Status ReadSampledStepWithTop(
      absl::Span<GreedyToken> out, absl::Span<std::vector<kernels::TopLogprob>> top) {
    return absl::UnimplementedError("this model does not support device logits processing");
  }

  // --- Processing supplied after the forward (grammar masks built while the step runs) ---
  // EnqueueProcessedSampledStep in two calls: EnqueueForwardStep enqueues the step's forward
  // (token ids -(r + 1) read the previous enqueued step's tokens, as there), and the next
  // EnqueueStepSampling its processing, sampling and token copies; the step is readable (and
  // counts as unread) from then on. Between the two the host may read older steps — so the
  // grammar masks of a step whose rows' newest tokens are still in flight are built from those
  // tokens while its forward runs (xgrammar's overlap of mask generation with the GPU's step).
  // Errors: those of EnqueueProcessedSampledStep, split between the two; FailedPrecondition for
  // a forward already awaiting its sampling, or a sampling without one (a failed
  // EnqueueStepSampling drops its forward's sampling: the next call is a forward again).
  virtual bool SupportsDeferredSampling() const { return false; }
  virtual absl::Status EnqueueForwardStep(const ForwardInput& input, KvCache& kv_cache) {
    return absl::UnimplementedError("this model does not support deferred sampling");
  }
  virtual absl::Status EnqueueStepSampling(absl::Span<const kernels::SamplingRow> rows,
                                           const DeviceLogitsProcessing& processing) {
    return absl::UnimplementedError("this model does not support deferred sampling");
  }
  // True when Forward and ForwardGreedy call ForwardInput::on_layer_kv_written.
  virtual bool SupportsLayerKvHook() const { return false; }
  // True when Forward honours ForwardInput::kv_frozen_layers and sliding_kv_start.
  virtual bool SupportsSwaReplay() const { return false; }
  // DeviceKvArrays: for a model that keeps its KV cache in device memory (the CUDA runners),
  // its arrays in the order of the host KvCache's transfer regions: per layer K then V (V
  // absent when kv_cache_spec().v_floats_per_token is 0, e.g. the MLA latent cache), each
  // block holding block_size tokens' rows of KvDtypeBytes elements. Valid until the cache is
  // reallocated (a different block count); empty until the first step allocated it, and for
  // models whose KV is the host KvCache.
  virtual std::vector<DeviceKvArray> DeviceKvArrays() const { return {}; }
  // Bytes of one KV element: 4 for the host KvCache (float32), 2 for bf16 device caches.
  virtual int64_t KvDtypeBytes() const { return 4; }
  // KV block copies for a device KV cache, so a KV connector (the kvstore) can sit behind it:
  // GatherKvBlocks copies blocks `blocks` into `out`, ScatterKvBlocks `in` into them, in the
  // connector's serialization over `layers` (empty: all; engine/kv/staged_kv_blocks.h). The
  // device cache is allocated from `geometry` (the engine's KvCache) if it is not yet. Ordered
  // on the device, not by waiting for steps in flight: a gather after the steps run or read back
  // (ReadSampledStep; the engine gathers only blocks those committed), a scatter after every
  // step enqueued (its blocks were free: a step in flight may still write them). Both return
  // once their copies are done. Errors: Unimplemented without support (SupportsKvBlockCopies
  // false); InvalidArgument for a bad block id or buffer size; Internal for device errors.
  virtual bool SupportsKvBlockCopies() const { return false; }
  virtual absl::Status GatherKvBlocks(const KvCache& geometry, absl::Span<const int32_t> blocks,
                                      absl::Span<const int32_t> layers,
                                      absl::Span<uint8_t> out) {
    return absl::UnimplementedError("this model's KV cache is the engine's host KvCache");
  }
  virtual absl::Status ScatterKvBlocks(const KvCache& geometry, absl::Span<const int32_t> blocks,
                                       absl::Span<const int32_t> layers,
                                       absl::Span<const uint8_t> in) {
    return absl::UnimplementedError("this model's KV cache is the engine's host KvCache");
  }
  // Shard turns this fully loaded model into rank `shard.rank`'s part (drops the other ranks'
  // weight slices). Call once, before the first Forward. Afterwards kv_cache_spec() and
  // config()'s num_attention_heads / num_key_value_heads / intermediate_size describe this rank, Forward is collective (all ranks, same input, same
  // order) and every rank writes the same full-vocabulary logits.
  // Errors: Unimplemented for architectures without parallel support; FailedPrecondition when
  // already sharded; InvalidArgument for a head/channel/expert count the world size does not
  // divide, a missing communicator, or expert parallelism on a model without MoE layers.
  virtual absl::Status Shard(const ParallelShard& shard) {
    return absl::UnimplementedError("this model does not support tensor/expert parallelism");
  }
  // UpdateExpertPlacement re-places the routed experts of an expert-parallel model onto
  // `expert_slots` (ParallelShard::expert_slots format, e.g. RebalancePlan::placement's
  // physical_to_logical), moving expert weights between ranks. Collective; call between steps:
  // KV caches are untouched, so sequences in flight continue with the next Forward.
  // Errors: FailedPrecondition when the model is not expert-parallel; InvalidArgument for a
  // malformed placement (every rank reaches the same verdict); those of the communicator.
  virtual absl::Status UpdateExpertPlacement(absl::Span<const int32_t> expert_slots) {
    return absl::FailedPreconditionError("the model is not expert-parallel");
  }
  // TakeExpertLoad returns [n_routed_experts] tokens routed to each logical expert, summed over
  // MoE layers, since the previous call (EPLB's input), and restarts the count. A shard counts
  // its own share of the tokens; a whole replica (LoadCpuParallelModel) sums its ranks. Empty
  // when the model is not expert-parallel.
  virtual std::vector<int64_t> TakeExpertLoad() { return {}; }

  // Options for a model that drafts for speculative decoding (engine/spec), set before its
  // first Forward.
  //
  // StoreWeightsBf16 keeps the weight matrices of the linear layers and the LM head as
  // bfloat16 and computes in float32 (kernels::LinearBf16Cpu): half the weight bytes per step.
  // Logits are bit-identical for a bfloat16 checkpoint; other weights are rounded to nearest
  // even. Errors: Unimplemented for models without it; FailedPrecondition when sharded.
  virtual absl::Status StoreWeightsBf16() {
    return absl::UnimplementedError("this model keeps float32 weights");
  }
  // RestrictLogits makes Forward compute logits only for `token_ids` (FR-Spec's reduced LM
  // head): the logits span is then [logits_indices.size(), token_ids.size()], column c holding
  // token_ids[c]'s logit (bit-identical to that column of the full logits). Empty restores the
  // full vocabulary. Errors: InvalidArgument for an id outside the vocabulary; Unimplemented
  // for models without it; FailedPrecondition when sharded.
  virtual absl::Status RestrictLogits(absl::Span<const int32_t> token_ids) {
    return absl::UnimplementedError("this model computes full-vocabulary logits only");
  }
  // The logits width Forward writes per row: vocab_size, or RestrictLogits' count.
  virtual int64_t logits_width() const { return config().vocab_size; }
  // The most logits rows (ForwardInput::logits_indices) one step may ask for: a backend with
  // fixed-size logits buffers refuses larger steps (the CUDA runners: CudaRunnerOptions::
  // max_num_logits, at least max_num_seqs). The engine's scheduler keeps every step within it
  // (EngineOptions::max_num_logits). 0: no limit (the CPU models).
  virtual int64_t max_num_logits() const { return 0; }
  // Host seconds the backend has spent so far setting up kernels for shapes met the first time
  // (the CUDA runner's cuBLASLt plans: heuristic query and first launch, which loads the
  // kernel's module). One-off costs: the engine nets them out of the step times its
  // speculation measurements price (engine/spec/speculation_regime.h). 0: no such costs.
  virtual double kernel_setup_seconds() const { return 0.0; }

  // --- Multi-token prediction (DeepSeek-V3 report, arXiv:2412.19437 §2.2; engine/spec's
  // MtpDrafter) ---
  // final_hidden_states: the last Forward's hidden states [input.token_ids.size(), hidden_size]
  // (float32, flattened token order), the last decoder layer's output before the final norm.
  // Valid until the next Forward or ForwardMtp; empty for models that do not expose them.
  virtual absl::Span<const float> final_hidden_states() const { return {}; }
  // MtpStatus: OK when the model can draft with its own MTP module; else why not (NotFound
  // naming the missing weights, FailedPrecondition when sharded, Unimplemented).
  virtual absl::Status MtpStatus() const {
    return absl::UnimplementedError("this model architecture has no MTP module");
  }
  // The MTP module's KV cache layout (one layer); zero when MtpStatus() is not OK.
  virtual KvCacheSpec mtp_kv_cache_spec() const { return {}; }
  // ForwardMtp runs the MTP module over a step planned like Forward's, in its own `kv_cache`
  // (mtp_kv_cache_spec()). Token t of the batch sits at position positions[t] and combines
  // previous_hidden row t (the target's final_hidden_states of that position, or the module's
  // own hidden_out for a recursive draft) with the embedding of token_ids[t] (the token at
  // position positions[t] + 1); its logits predict the token at positions[t] + 2. Writes
  // logits [logits_indices.size(), vocab_size] and hidden_out [logits_indices.size(),
  // hidden_size] (the module's output before its head norm). Errors: those of Forward,
  // InvalidArgument for a wrong previous_hidden / hidden_out size, MtpStatus() when not OK.
  virtual absl::Status ForwardMtp(const ForwardInput& input,
                                  absl::Span<const float> previous_hidden, KvCache& kv_cache,
                                  absl::Span<float> logits, absl::Span<float> hidden_out) {
    return MtpStatus();
  }
};

// LoadModel reads config.json + safetensors from `dir` and builds the model (weights
// converted to float32). Errors: those of ModelConfig::Load and Checkpoint, plus
// NotFound/InvalidArgument naming any missing tensor or one with the wrong shape/dtype.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir);

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_MODEL_H_
