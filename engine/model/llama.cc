#include "engine/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/weight_loader.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/sharding.h"
#include "kernels/activation/activation.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/rms_norm/rms_norm.h"
#include "kernels/rope/rope.h"

namespace sluice {
namespace {

// One decoder layer's weights, float32. q/k/v and gate/up are fused row-wise so each needs one
// GEMM: w_qkv [(nh + 2·nkv)·hd, H] (q rows, then k, then v), w_gate_up [2·I, H] (gate, up).
struct LlamaLayer {
  std::vector<float> input_norm;     // [H]
  std::vector<float> w_qkv;          // [(nh + 2 nkv) hd, H]
  std::vector<float> b_qkv;          // [(nh + 2 nkv) hd] or empty
  std::vector<float> q_norm;         // [hd] (Qwen3) or empty
  std::vector<float> k_norm;         // [hd] (Qwen3) or empty
  std::vector<float> w_o;            // [H, nh hd]
  std::vector<float> b_o;            // [H] or empty
  std::vector<float> post_norm;      // [H]
  std::vector<float> w_gate_up;      // [2 I, H]
  std::vector<float> b_gate_up;      // [2 I] or empty
  std::vector<float> w_down;         // [H, I]
  std::vector<float> b_down;         // [H] or empty
  int64_t sliding_window = 0;        // 0: full attention
};

// Appends the rows of `part` to `fused`.
void Append(std::vector<float>* fused, const std::vector<float>& part) {
  fused->insert(fused->end(), part.begin(), part.end());
}

class LlamaModel : public Model {
 public:
  explicit LlamaModel(const ModelConfig& config) : config_(config) {
    hidden_ = config.hidden_size;
    heads_ = config.num_attention_heads;
    kv_heads_ = config.num_key_value_heads;
    head_dim_ = config.head_dim;
    inter_ = config.intermediate_size;
    vocab_ = config.vocab_size;
    qkv_dim_ = (heads_ + 2 * kv_heads_) * head_dim_;
  }

  absl::Status Load(const Checkpoint& ckpt);

  const ModelConfig& config() const override { return config_; }
  bool SupportsInputEmbeddings() const override { return true; }

  KvCacheSpec kv_cache_spec() const override {
    KvCacheSpec spec;
    spec.num_layers = config_.num_hidden_layers;
    spec.k_floats_per_token = kv_heads_ * head_dim_;
    spec.v_floats_per_token = kv_heads_ * head_dim_;
    return spec;
  }

  int64_t WeightBytesPerToken() const override {
    int64_t floats = hidden_;  // one embedding row
    for (const LlamaLayer& l : layers_) {
      floats += static_cast<int64_t>(l.input_norm.size() + l.w_qkv.size() + l.b_qkv.size() +
                                     l.q_norm.size() + l.k_norm.size() + l.w_o.size() +
                                     l.b_o.size() + l.post_norm.size() + l.w_gate_up.size() +
                                     l.b_gate_up.size() + l.w_down.size() + l.b_down.size());
    }
    int64_t bytes_bf16 = 0;
    for (const Bf16Layer& l : layers_bf16_) {
      bytes_bf16 += 2 * static_cast<int64_t>(l.w_qkv.size() + l.w_o.size() +
                                             l.w_gate_up.size() + l.w_down.size());
    }
    floats += hidden_;  // final norm
    if (bf16_) {
      bytes_bf16 += 2 * logits_width() * hidden_;
    } else {
      floats += logits_width() * hidden_;
    }
    return floats * static_cast<int64_t>(sizeof(float)) + bytes_bf16;
  }

  absl::Status Forward(const ForwardInput& input, KvCache& kv_cache,
                       absl::Span<float> logits) override;
  bool SupportsSwaReplay() const override { return true; }
  bool SupportsLayerKvHook() const override { return true; }
  // The CPU kernels fix every reduction's order per output element (kernels/linear,
  // rms_norm, attention: one pass over all keys per query, no split-KV).
  bool IsBatchInvariant() const override { return true; }
  absl::Status Shard(const ParallelShard& shard) override;
  absl::Status StoreWeightsBf16() override;
  absl::Status RestrictLogits(absl::Span<const int32_t> token_ids) override;
  int64_t logits_width() const override {
    return logit_ids_.empty() ? vocab_ : static_cast<int64_t>(logit_ids_.size());
  }

 private:
  // The bfloat16 copies of one layer's matrices (StoreWeightsBf16; the float32 ones are freed).
  struct Bf16Layer {
    std::vector<uint16_t> w_qkv, w_o, w_gate_up, w_down;
  };
  // y = x · Wᵀ (+ bias) from W's bfloat16 copy when it has one, else from the float32 matrix.
  static void Linear(const float* x, const std::vector<float>& w32,
                     const std::vector<uint16_t>& w16, const std::vector<float>& bias, float* y,
                     int64_t m, int64_t n, int64_t k) {
    const float* b = bias.empty() ? nullptr : bias.data();
    if (!w16.empty()) {
      kernels::LinearBf16Cpu(x, w16.data(), b, y, m, n, k);
    } else {
      kernels::LinearCpu(x, w32.data(), b, y, m, n, k);
    }
  }
  // Rebuilds head_f32_ / head_bf16_ (the LM head rows Forward uses) after either option.
  void BuildHead();

  // Attention of one sliding-window layer when some sequence's window reaches below its
  // ForwardInput::sliding_kv_start (SWA bounded replay, and the first decode steps after a
  // replay shorter than the window). Each such sequence's present keys
  // [sliding_kv_start, context + queries) are gathered into a contiguous scratch cache and the
  // unchanged kernel attends there with the context shortened by sliding_kv_start: the window
  // mask is relative (keys j with i - window < j <= i), RoPE is already applied to the cached
  // keys, and the keys keep their order, so each query sees exactly the keys
  // max(sliding_kv_start, i - window + 1)..i. Other sequences use the cache directly.
  void SlidingAttentionBounded(const ForwardInput& in, const float* k_layer,
                               const float* v_layer, int64_t block_size,
                               const kernels::PagedAttentionParams& ap);
  absl::Status Validate(const ForwardInput& input, const KvCache& kv_cache,
                        absl::Span<float> logits) const;
  static void Grow(std::vector<float>* v, int64_t n) {
    if (static_cast<int64_t>(v->size()) < n) v->resize(static_cast<size_t>(n));
  }

  // The checkpoint name of a Hugging Face Llama tensor name: "model.X" lives under
  // model_prefix_ and lm_head under lm_head_name_ (different in vision-language checkpoints,
  // whose language model is nested).
  std::string Name(const std::string& hf) const {
    if (hf.rfind("model.", 0) == 0) return model_prefix_ + hf.substr(6);
    return hf == "lm_head.weight" ? lm_head_name_ : hf;
  }

  ModelConfig config_;
  std::string model_prefix_ = "model.";
  std::string lm_head_name_ = "lm_head.weight";
  int64_t hidden_, heads_, kv_heads_, head_dim_, inter_, vocab_, qkv_dim_;
  std::vector<float> embed_;      // [V, H]
  std::vector<float> final_norm_;  // [H]
  std::vector<float> lm_head_;    // [V, H]; empty when tied to embed_
  std::vector<LlamaLayer> layers_;
  bool bf16_ = false;               // StoreWeightsBf16
  std::vector<Bf16Layer> layers_bf16_;  // [layers] when bf16_
  std::vector<int32_t> logit_ids_;  // RestrictLogits; empty: every id
  // The LM head rows of logit_ids_ (float32), or of logit_ids_ / every id (bfloat16); both
  // empty when Forward uses lm_head_ / embed_ directly.
  std::vector<float> head_f32_;
  std::vector<uint16_t> head_bf16_;
  kernels::RopeTable rope_;
  // Tensor parallelism (Shard): the group whose all-reduce completes o_proj and down_proj.
  Communicator* tp_comm_ = nullptr;

  // Scratch buffers, grown on demand and reused across Forward calls (one caller at a time).
  std::vector<float> residual_, normed_, qkv_, q_, k_, v_, attn_, tmp_, gate_up_, act_, gathered_;
  std::vector<kernels::PagedSequence> seqs_;
  // SWA bounded replay scratch (SlidingAttentionBounded).
  std::vector<kernels::PagedSequence> plain_seqs_, bounded_seqs_;
  std::vector<int32_t> scratch_table_;
  std::vector<float> scratch_k_, scratch_v_;
};

absl::Status LlamaModel::Load(const Checkpoint& ckpt) {
  const ModelConfig& c = config_;
  if (c.architecture != Architecture::kLlama && c.architecture != Architecture::kQwen3) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadLlama: architecture ", c.architecture_name, " is not Llama or Qwen3"));
  }
  if (c.hidden_act != "silu") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported hidden_act ", c.hidden_act, " (only silu)"));
  }
  if (inter_ <= 0 || head_dim_ <= 0) {
    return absl::InvalidArgumentError("intermediate_size and head_dim must be positive");
  }
  kernels::RopeParams rp;
  rp.rope_type = c.rope.rope_type;
  rp.theta = c.rope.rope_theta;
  rp.rotary_dim = head_dim_;
  rp.factor = c.rope.factor;
  rp.original_max_position_embeddings = c.rope.original_max_position_embeddings > 0
                                            ? c.rope.original_max_position_embeddings
                                            : c.max_position_embeddings;
  rp.beta_fast = c.rope.beta_fast;
  rp.beta_slow = c.rope.beta_slow;
  rp.mscale = c.rope.mscale;
  rp.mscale_all_dim = c.rope.mscale_all_dim;
  rp.low_freq_factor = c.rope.low_freq_factor;
  rp.high_freq_factor = c.rope.high_freq_factor;
  auto table = kernels::MakeRopeTable(rp);
  if (!table.ok()) return table.status();
  rope_ = std::move(*table);

  const int64_t H = hidden_, hd = head_dim_;
  // LlavaForConditionalGeneration nests the language model: transformers 4.x / 5 save
  // `language_model.model.*` + `language_model.lm_head.weight`, 4.52+ in-memory names are
  // `model.language_model.*` + `lm_head.weight`.
  if (!c.multimodal_architecture.empty()) {
    if (ckpt.Contains("language_model.model.embed_tokens.weight")) {
      model_prefix_ = "language_model.model.";
      lm_head_name_ = "language_model.lm_head.weight";
    } else if (ckpt.Contains("model.language_model.embed_tokens.weight")) {
      model_prefix_ = "model.language_model.";
    }
  }
  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, Name("model.embed_tokens.weight"), {vocab_, H}, &embed_));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, Name("model.norm.weight"), {H}, &final_norm_));
  if (!c.tie_word_embeddings) {
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, Name("lm_head.weight"), {vocab_, H}, &lm_head_));
  }
  const bool qwen3 = c.architecture == Architecture::kQwen3;
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  std::vector<float> tmp;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LlamaLayer& L = layers_[static_cast<size_t>(i)];
    const std::string p = Name(LayerPrefix(i));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "input_layernorm.weight", {H}, &L.input_norm));
    SLUICE_RETURN_IF_ERROR(
        LoadWeightInto(ckpt, p + "post_attention_layernorm.weight", {H}, &L.post_norm));
    const std::pair<const char*, int64_t> qkv[] = {
        {"q_proj", heads_ * hd}, {"k_proj", kv_heads_ * hd}, {"v_proj", kv_heads_ * hd}};
    L.w_qkv.reserve(static_cast<size_t>(qkv_dim_ * H));
    for (const auto& [name, rows] : qkv) {
      SLUICE_RETURN_IF_ERROR(
          LoadWeightInto(ckpt, p + "self_attn." + name + ".weight", {rows, H}, &tmp));
      Append(&L.w_qkv, tmp);
      if (c.attention_bias) {
        SLUICE_RETURN_IF_ERROR(
            LoadWeightInto(ckpt, p + "self_attn." + name + ".bias", {rows}, &tmp));
        Append(&L.b_qkv, tmp);
      }
    }
    SLUICE_RETURN_IF_ERROR(
        LoadWeightInto(ckpt, p + "self_attn.o_proj.weight", {H, heads_ * hd}, &L.w_o));
    if (c.attention_bias) {
      SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "self_attn.o_proj.bias", {H}, &L.b_o));
    }
    if (qwen3) {
      SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "self_attn.q_norm.weight", {hd}, &L.q_norm));
      SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "self_attn.k_norm.weight", {hd}, &L.k_norm));
    }
    for (const char* name : {"gate_proj", "up_proj"}) {
      SLUICE_RETURN_IF_ERROR(
          LoadWeightInto(ckpt, p + "mlp." + name + ".weight", {inter_, H}, &tmp));
      Append(&L.w_gate_up, tmp);
      if (c.mlp_bias) {
        SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "mlp." + name + ".bias", {inter_}, &tmp));
        Append(&L.b_gate_up, tmp);
      }
    }
    SLUICE_RETURN_IF_ERROR(
        LoadWeightInto(ckpt, p + "mlp.down_proj.weight", {H, inter_}, &L.w_down));
    if (c.mlp_bias) {
      SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "mlp.down_proj.bias", {H}, &L.b_down));
    }
    if (static_cast<size_t>(i) < c.layer_is_sliding.size() && c.layer_is_sliding[i]) {
      L.sliding_window = c.sliding_window;
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Validate(const ForwardInput& in, const KvCache& cache,
                                  absl::Span<float> logits) const {
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  if (static_cast<int64_t>(in.positions.size()) != T ||
      static_cast<int64_t>(in.slot_mapping.size()) != T) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardInput: token_ids (", T, "), positions (", in.positions.size(),
        ") and slot_mapping (", in.slot_mapping.size(), ") must have the same length"));
  }
  const KvCacheSpec spec = kv_cache_spec();
  if (cache.spec().num_layers != spec.num_layers ||
      cache.spec().k_floats_per_token != spec.k_floats_per_token ||
      cache.spec().v_floats_per_token != spec.v_floats_per_token) {
    return absl::InvalidArgumentError("KV cache spec does not match the model");
  }
  if (static_cast<int64_t>(logits.size()) !=
      static_cast<int64_t>(in.logits_indices.size()) * logits_width()) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits span has ", logits.size(), " floats, expected ",
                     in.logits_indices.size(), " x ", logits_width()));
  }
  for (int32_t idx : in.logits_indices) {
    if (idx < 0 || idx >= T) {
      return absl::InvalidArgumentError(absl::StrCat("logits index ", idx, " outside [0, ", T, ")"));
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    if (in.token_ids[t] < 0 || in.token_ids[t] >= vocab_) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", in.token_ids[t],
                                                     " is outside the vocabulary [0, ", vocab_,
                                                     ")"));
    }
  }
  if (!in.embedding_rows.empty() || !in.embedding_values.empty()) {
    if (static_cast<int64_t>(in.embedding_values.size()) !=
        static_cast<int64_t>(in.embedding_rows.size()) * hidden_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding_values has ", in.embedding_values.size(), " floats, expected ",
          in.embedding_rows.size(), " x ", hidden_));
    }
    for (int32_t row : in.embedding_rows) {
      if (row < 0 || row >= T) {
        return absl::InvalidArgumentError(
            absl::StrCat("embedding row ", row, " outside [0, ", T, ")"));
      }
    }
  }
  const int64_t bs = cache.block_size();
  std::vector<bool> covered(static_cast<size_t>(T), false);
  for (size_t s = 0; s < in.sequences.size(); ++s) {
    const SequenceSlice& seq = in.sequences[s];
    if (seq.query_start < 0 || seq.num_query_tokens < 0 || seq.num_context_tokens < 0 ||
        seq.query_start + seq.num_query_tokens > T) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, ": query range outside the batch"));
    }
    const int64_t total = int64_t{seq.num_context_tokens} + seq.num_query_tokens;
    if (static_cast<int64_t>(seq.block_table.size()) * bs < total) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": block table of ",
                                                     seq.block_table.size(),
                                                     " blocks does not cover ", total, " tokens"));
    }
    for (int64_t b = 0; b < (total + bs - 1) / bs; ++b) {
      if (seq.block_table[b] < 0 || seq.block_table[b] >= cache.num_blocks()) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": block id ", seq.block_table[b], " out of range"));
      }
    }
    for (int32_t i = 0; i < seq.num_query_tokens; ++i) {
      const int64_t t = seq.query_start + i;
      const int64_t pos = int64_t{seq.num_context_tokens} + i;
      if (covered[t]) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, " belongs to more than one sequence"));
      }
      covered[t] = true;
      if (in.positions[t] != pos) {
        return absl::InvalidArgumentError(absl::StrCat("token ", t, ": position ",
                                                       in.positions[t], " expected ", pos));
      }
      const int64_t slot = int64_t{seq.block_table[pos / bs]} * bs + pos % bs;
      if (in.slot_mapping[t] != slot) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", t, ": slot ", in.slot_mapping[t], " does not match block table slot ",
            slot));
      }
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    if (!covered[t]) {
      return absl::InvalidArgumentError(absl::StrCat("token ", t, " belongs to no sequence"));
    }
  }
  if (!in.kv_frozen_layers.empty() &&
      static_cast<int64_t>(in.kv_frozen_layers.size()) != spec.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("kv_frozen_layers has ",
                                                   in.kv_frozen_layers.size(),
                                                   " entries, expected ", spec.num_layers));
  }
  if (!in.sliding_kv_start.empty()) {
    if (in.sliding_kv_start.size() != in.sequences.size()) {
      return absl::InvalidArgumentError(absl::StrCat("sliding_kv_start has ",
                                                     in.sliding_kv_start.size(),
                                                     " entries, expected one per sequence (",
                                                     in.sequences.size(), ")"));
    }
    for (size_t s = 0; s < in.sequences.size(); ++s) {
      if (in.sliding_kv_start[s] < 0 ||
          in.sliding_kv_start[s] > in.sequences[s].num_context_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", s, ": sliding_kv_start ", in.sliding_kv_start[s], " outside [0, ",
            in.sequences[s].num_context_tokens, "]"));
      }
    }
  }
  return absl::OkStatus();
}

void LlamaModel::SlidingAttentionBounded(const ForwardInput& in, const float* k_layer,
                                         const float* v_layer, int64_t bs,
                                         const kernels::PagedAttentionParams& ap) {
  const int64_t kv_dim = kv_heads_ * head_dim_;
  plain_seqs_.clear();
  bounded_seqs_.clear();
  // First pass: which sequences need the gather, and how many scratch blocks they take.
  int64_t scratch_blocks = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const int64_t start = in.sliding_kv_start[s];
    const int64_t ctx = seqs_[s].num_context_tokens;
    if (start == 0 || ctx - ap.sliding_window + 1 >= start) {
      plain_seqs_.push_back(seqs_[s]);  // every query's window starts at or after `start`
    } else {
      const int64_t keys = ctx + seqs_[s].num_query_tokens - start;
      scratch_blocks += (keys + bs - 1) / bs;
    }
  }
  Grow(&scratch_k_, scratch_blocks * bs * kv_dim);
  Grow(&scratch_v_, scratch_blocks * bs * kv_dim);
  scratch_table_.resize(static_cast<size_t>(scratch_blocks));
  for (int64_t b = 0; b < scratch_blocks; ++b) scratch_table_[b] = static_cast<int32_t>(b);
  int64_t next_block = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const int64_t start = in.sliding_kv_start[s];
    const kernels::PagedSequence& seq = seqs_[s];
    if (start == 0 || seq.num_context_tokens - ap.sliding_window + 1 >= start) continue;
    const int64_t end = int64_t{seq.num_context_tokens} + seq.num_query_tokens;
    for (int64_t p = start; p < end; ++p) {
      const int64_t src = int64_t{seq.block_table[p / bs]} * bs + p % bs;
      const int64_t dst = next_block * bs + (p - start);
      std::memcpy(scratch_k_.data() + dst * kv_dim, k_layer + src * kv_dim,
                  kv_dim * sizeof(float));
      std::memcpy(scratch_v_.data() + dst * kv_dim, v_layer + src * kv_dim,
                  kv_dim * sizeof(float));
    }
    bounded_seqs_.push_back({seq.query_start, seq.num_query_tokens,
                             static_cast<int32_t>(seq.num_context_tokens - start),
                             scratch_table_.data() + next_block});
    next_block += (end - start + bs - 1) / bs;
  }
  if (!plain_seqs_.empty()) {
    kernels::PagedAttentionCpu(q_.data(), heads_ * head_dim_, k_layer, v_layer,
                               plain_seqs_.data(), static_cast<int64_t>(plain_seqs_.size()), ap,
                               attn_.data());
  }
  if (!bounded_seqs_.empty()) {
    kernels::PagedAttentionCpu(q_.data(), heads_ * head_dim_, scratch_k_.data(),
                               scratch_v_.data(), bounded_seqs_.data(),
                               static_cast<int64_t>(bounded_seqs_.size()), ap, attn_.data());
  }
}

absl::Status LlamaModel::Forward(const ForwardInput& in, KvCache& cache,
                                 absl::Span<float> logits) {
  SLUICE_RETURN_IF_ERROR(Validate(in, cache, logits));
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  if (T == 0) return absl::OkStatus();
  const int64_t H = hidden_, hd = head_dim_;
  const int64_t q_dim = heads_ * hd, kv_dim = kv_heads_ * hd;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Grow(&residual_, T * H);
  Grow(&normed_, T * H);
  Grow(&qkv_, T * qkv_dim_);
  Grow(&q_, T * q_dim);
  Grow(&k_, T * kv_dim);
  Grow(&v_, T * kv_dim);
  Grow(&attn_, T * q_dim);
  Grow(&tmp_, T * H);
  Grow(&gate_up_, T * 2 * inter_);
  Grow(&act_, T * inter_);

  seqs_.clear();
  for (const SequenceSlice& s : in.sequences) {
    seqs_.push_back({s.query_start, s.num_query_tokens, s.num_context_tokens, s.block_table.data()});
  }
  kernels::PagedAttentionParams ap;
  ap.num_heads = heads_;
  ap.num_kv_heads = kv_heads_;
  ap.head_dim = hd;
  ap.v_head_dim = hd;
  ap.block_size = cache.block_size();
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool bounded = std::any_of(in.sliding_kv_start.begin(), in.sliding_kv_start.end(),
                                   [](int32_t start) { return start > 0; });

  SLUICE_RETURN_IF_ERROR(
      kernels::EmbeddingCpu(embed_.data(), vocab_, H, in.token_ids.data(), T, residual_.data()));
  // Multimodal embeddings replace the looked-up rows of their placeholder tokens.
  for (size_t r = 0; r < in.embedding_rows.size(); ++r) {
    std::memcpy(residual_.data() + int64_t{in.embedding_rows[r]} * H,
                in.embedding_values.data() + static_cast<int64_t>(r) * H, H * sizeof(float));
  }
  for (size_t li = 0; li < layers_.size(); ++li) {
    const LlamaLayer& L = layers_[li];
    // Pre-attention norm; from layer 1 on it is fused with the previous MLP's residual add.
    if (li == 0) {
      kernels::RmsNormCpu(residual_.data(), H, L.input_norm.data(), normed_.data(), H, T, H, eps);
    } else {
      kernels::AddRmsNormCpu(tmp_.data(), residual_.data(), L.input_norm.data(), normed_.data(),
                             T, H, eps);
    }
    static const Bf16Layer kNoBf16;
    const Bf16Layer& L16 = bf16_ ? layers_bf16_[li] : kNoBf16;
    Linear(normed_.data(), L.w_qkv, L16.w_qkv, L.b_qkv, qkv_.data(), T, qkv_dim_, H);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = qkv_.data() + t * qkv_dim_;
      std::memcpy(q_.data() + t * q_dim, row, q_dim * sizeof(float));
      std::memcpy(k_.data() + t * kv_dim, row + q_dim, kv_dim * sizeof(float));
      std::memcpy(v_.data() + t * kv_dim, row + q_dim + kv_dim, kv_dim * sizeof(float));
    }
    if (!L.q_norm.empty()) {  // Qwen3: RMSNorm over each head's channels, before RoPE
      kernels::RmsNormCpu(q_.data(), hd, L.q_norm.data(), q_.data(), hd, T * heads_, hd, eps);
      kernels::RmsNormCpu(k_.data(), hd, L.k_norm.data(), k_.data(), hd, T * kv_heads_, hd, eps);
    }
    kernels::RopeCpu(q_.data(), T, heads_, q_dim, hd, 0, in.positions.data(), rope_, false);
    kernels::RopeCpu(k_.data(), T, kv_heads_, kv_dim, hd, 0, in.positions.data(), rope_, false);
    const bool frozen = !in.kv_frozen_layers.empty() && in.kv_frozen_layers[li] != 0;
    if (!frozen) {
      kernels::WriteKvCacheCpu(k_.data(), kv_dim, v_.data(), kv_dim, in.slot_mapping.data(), T,
                               kv_dim, kv_dim, cache.k(static_cast<int64_t>(li)),
                               cache.v(static_cast<int64_t>(li)));
    }
    // The layer's K/V are in the cache: a layer-by-layer push may move them from here on.
    if (in.on_layer_kv_written) in.on_layer_kv_written(static_cast<int32_t>(li), nullptr);
    ap.sliding_window = L.sliding_window;
    if (L.sliding_window > 0 && bounded) {
      SlidingAttentionBounded(in, cache.k(static_cast<int64_t>(li)),
                              cache.v(static_cast<int64_t>(li)), cache.block_size(), ap);
    } else {
      kernels::PagedAttentionCpu(q_.data(), q_dim, cache.k(static_cast<int64_t>(li)),
                                 cache.v(static_cast<int64_t>(li)), seqs_.data(),
                                 static_cast<int64_t>(seqs_.size()), ap, attn_.data());
    }
    Linear(attn_.data(), L.w_o, L16.w_o, L.b_o, tmp_.data(), T, H, q_dim);
    if (tp_comm_ != nullptr) {  // row-parallel o_proj: sum the ranks' partial outputs
      SLUICE_RETURN_IF_ERROR(tp_comm_->AllReduceSum(absl::MakeSpan(tmp_.data(), T * H)));
    }
    kernels::AddRmsNormCpu(tmp_.data(), residual_.data(), L.post_norm.data(), normed_.data(), T,
                           H, eps);
    Linear(normed_.data(), L.w_gate_up, L16.w_gate_up, L.b_gate_up, gate_up_.data(), T,
           2 * inter_, H);
    kernels::SiluMulCpu(gate_up_.data(), act_.data(), T, inter_);
    Linear(act_.data(), L.w_down, L16.w_down, L.b_down, tmp_.data(), T, H, inter_);
    if (tp_comm_ != nullptr) {  // row-parallel down_proj
      SLUICE_RETURN_IF_ERROR(tp_comm_->AllReduceSum(absl::MakeSpan(tmp_.data(), T * H)));
    }
  }
  // Final residual add + norm, only for the rows whose logits are wanted.
  const int64_t n_out = static_cast<int64_t>(in.logits_indices.size());
  if (n_out == 0) return absl::OkStatus();
  Grow(&gathered_, 2 * n_out * H);
  float* g_res = gathered_.data();
  float* g_norm = gathered_.data() + n_out * H;
  for (int64_t r = 0; r < n_out; ++r) {
    const int64_t t = in.logits_indices[r];
    const float* res = residual_.data() + t * H;
    const float* x = tmp_.data() + t * H;
    for (int64_t j = 0; j < H; ++j) g_res[r * H + j] = res[j] + x[j];
  }
  kernels::RmsNormCpu(g_res, H, final_norm_.data(), g_norm, H, n_out, H, eps);
  if (!head_bf16_.empty()) {
    kernels::LinearBf16Cpu(g_norm, head_bf16_.data(), nullptr, logits.data(), n_out,
                           logits_width(), H);
  } else if (!head_f32_.empty()) {
    kernels::LinearCpu(g_norm, head_f32_.data(), nullptr, logits.data(), n_out, logits_width(),
                       H);
  } else {
    const float* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
    kernels::LinearCpu(g_norm, head, nullptr, logits.data(), n_out, vocab_, H);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::StoreWeightsBf16() {
  if (tp_comm_ != nullptr) {
    return absl::FailedPreconditionError("bfloat16 weight storage of a sharded model");
  }
  if (bf16_) return absl::OkStatus();
  auto convert = [](std::vector<float>& from, std::vector<uint16_t>& to) {
    to.resize(from.size());
    for (size_t i = 0; i < from.size(); ++i) to[i] = kernels::ToBf16(from[i]);
    std::vector<float>().swap(from);
  };
  layers_bf16_.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    convert(layers_[i].w_qkv, layers_bf16_[i].w_qkv);
    convert(layers_[i].w_o, layers_bf16_[i].w_o);
    convert(layers_[i].w_gate_up, layers_bf16_[i].w_gate_up);
    convert(layers_[i].w_down, layers_bf16_[i].w_down);
  }
  bf16_ = true;
  BuildHead();
  return absl::OkStatus();
}

absl::Status LlamaModel::RestrictLogits(absl::Span<const int32_t> token_ids) {
  if (tp_comm_ != nullptr) return absl::FailedPreconditionError("restricted logits of a sharded model");
  for (int32_t id : token_ids) {
    if (id < 0 || id >= vocab_) {
      return absl::InvalidArgumentError(
          absl::StrCat("logits restricted to token id ", id, " outside [0, ", vocab_, ")"));
    }
  }
  logit_ids_.assign(token_ids.begin(), token_ids.end());
  BuildHead();
  return absl::OkStatus();
}

void LlamaModel::BuildHead() {
  // lm_head_ / embed_ stay float32: the embedding lookup reads embed_, and the rows are
  // gathered again whenever the restriction changes.
  const float* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
  const int64_t H = hidden_, rows = logits_width();
  head_f32_.clear();
  head_bf16_.clear();
  if (!bf16_ && logit_ids_.empty()) return;
  if (bf16_) {
    head_bf16_.resize(static_cast<size_t>(rows * H));
  } else {
    head_f32_.resize(static_cast<size_t>(rows * H));
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = head + (logit_ids_.empty() ? r : logit_ids_[r]) * H;
    if (bf16_) {
      for (int64_t j = 0; j < H; ++j) head_bf16_[r * H + j] = kernels::ToBf16(src[j]);
    } else {
      std::memcpy(head_f32_.data() + r * H, src, H * sizeof(float));
    }
  }
}

// Column-parallel q/k/v (by heads) and gate/up (by channels), row-parallel o_proj and
// down_proj (engine/parallel/sharding.h); their biases are added by rank 0 only so the
// all-reduce counts them once.
absl::Status LlamaModel::Shard(const ParallelShard& shard) {
  if (shard.expert_parallel) {
    return absl::InvalidArgumentError("expert parallelism: Llama/Qwen3 have no MoE layers");
  }
  if (tp_comm_ != nullptr) return absl::FailedPreconditionError("the model is already sharded");
  if (!shard.tensor_parallel || shard.world_size == 1) return absl::OkStatus();
  if (bf16_ || !logit_ids_.empty()) {
    return absl::FailedPreconditionError("sharding a model with drafting options set");
  }
  if (shard.comm == nullptr) return absl::InvalidArgumentError("ParallelShard: no communicator");
  auto heads = ShardAttentionHeads(heads_, kv_heads_, shard.rank, shard.world_size);
  if (!heads.ok()) return heads.status();
  auto inter = EvenShard(inter_, shard.rank, shard.world_size, "intermediate_size");
  if (!inter.ok()) return inter.status();
  const int64_t H = hidden_, hd = head_dim_;
  const Range qkv_rows[] = {Scale(heads->q_heads, hd),
                            Offset(Scale(heads->kv_heads, hd), heads_ * hd),
                            Offset(Scale(heads->kv_heads, hd), (heads_ + kv_heads_) * hd)};
  const Range gate_up_rows[] = {*inter, Offset(*inter, inter_)};
  for (LlamaLayer& L : layers_) {
    L.w_qkv = GatherRows(L.w_qkv, H, qkv_rows);
    if (!L.b_qkv.empty()) L.b_qkv = GatherRows(L.b_qkv, 1, qkv_rows);
    L.w_o = SliceColumns(L.w_o, H, heads_ * hd, Scale(heads->q_heads, hd));
    L.w_gate_up = GatherRows(L.w_gate_up, H, gate_up_rows);
    if (!L.b_gate_up.empty()) L.b_gate_up = GatherRows(L.b_gate_up, 1, gate_up_rows);
    L.w_down = SliceColumns(L.w_down, H, inter_, *inter);
    if (shard.rank != 0) {
      L.b_o.clear();
      L.b_down.clear();
    }
  }
  heads_ = heads->q_heads.count;
  kv_heads_ = heads->kv_heads.count;
  inter_ = inter->count;
  qkv_dim_ = (heads_ + 2 * kv_heads_) * head_dim_;
  config_.num_attention_heads = heads_;
  config_.num_key_value_heads = kv_heads_;
  config_.intermediate_size = inter_;
  tp_comm_ = shard.comm;
  return absl::OkStatus();
}

#undef SLUICE_RETURN_IF_ERROR

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadLlama(const ModelConfig& config,
                                                 const Checkpoint& checkpoint) {
  auto model = std::make_unique<LlamaModel>(config);
  if (absl::Status s = model->Load(checkpoint); !s.ok()) return s;
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace sluice
