// DeepSeek-V3 forward pass on the CPU backend; see deepseek_v3.h.
//
// Layer structure (transformers' `DeepseekV3DecoderLayer`, modeling_deepseek_v3.py):
//   x = x + o_proj(MLA(input_layernorm(x)))
//   x = x + MLP(post_attention_layernorm(x))      MLP: dense SwiGLU for layers < first_k_dense_replace,
//                                                 else routed experts + shared experts
// logits = lm_head(norm(x)).
//
// MLA runs in the absorbed form over a latent cache (kernels/mla_attention): per token and layer
// the cache holds kv_a_layernorm(c_kv) [kv_lora_rank] and the roped shared key [qk_rope_head_dim].
#include "engine/model/deepseek_v3.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/weight_loader.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/expert_parallel.h"
#include "engine/parallel/sharding.h"
#include "kernels/activation/activation.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/moe/moe_experts.h"
#include "kernels/moe/moe_routing.h"
#include "kernels/rms_norm/rms_norm.h"
#include "kernels/rope/rope.h"

namespace sluice {
namespace {

// SwiGLU MLP with gate and up fused: gate_up [2 * intermediate, hidden], down [hidden,
// intermediate].
struct MlpWeights {
  int64_t intermediate = 0;
  std::vector<float> gate_up;
  std::vector<float> down;
  std::vector<uint16_t> gate_up_bf16, down_bf16;  // as bfloat16 instead (PackLayer)
};

struct MoeWeights {
  std::vector<float> router;           // [n_routed_experts, hidden] (mlp.gate.weight)
  std::vector<float> correction_bias;  // [n_routed_experts] (mlp.gate.e_score_correction_bias)
  std::vector<float> experts_gate_up;  // [n_routed_experts, 2 * moe_intermediate, hidden]
  std::vector<float> experts_down;     // [n_routed_experts, hidden, moe_intermediate]
  // The two above as bfloat16 instead (PackLayer; the float32 vectors are then empty).
  std::vector<uint16_t> experts_gate_up_bf16, experts_down_bf16;
  std::vector<kernels::MoeExpertWeights> views;  // per expert, into the vectors above
  bool has_shared = false;
  MlpWeights shared;  // intermediate = moe_intermediate_size * n_shared_experts
};

struct LayerWeights {
  int64_t index = 0;                       // model.layers.<index>
  std::vector<float> input_norm;           // [hidden]
  std::vector<float> post_attention_norm;  // [hidden]
  // Fused input projection: rows of q_a_proj [q_lora_rank] (or q_proj [heads * qk_head_dim]
  // when q_lora_rank = 0), then kv_a_proj_with_mqa [kv_lora_rank + qk_rope_head_dim]; [*, hidden].
  std::vector<float> w_a;
  std::vector<float> b_a;        // bias of w_a (attention_bias), else empty
  std::vector<float> q_a_norm;   // [q_lora_rank]
  std::vector<float> q_b;        // [heads * qk_head_dim, q_lora_rank]; empty when q_lora_rank = 0
  std::vector<float> kv_a_norm;  // [kv_lora_rank]
  std::vector<float> kv_b;       // [heads, qk_nope_head_dim + v_head_dim, kv_lora_rank]
  std::vector<float> o_proj;     // [hidden, heads * v_head_dim]
  std::vector<float> o_bias;     // [hidden] or empty
  // w_a, q_b, o_proj as bfloat16 instead (PackLayer; the float32 vectors are then empty).
  std::vector<uint16_t> w_a_bf16, q_b_bf16, o_proj_bf16;
  bool is_moe = false;
  MlpWeights dense;
  MoeWeights moe;
};

// One multi-token prediction module (DeepSeek-V3 report, arXiv:2412.19437 §2.2): h'_i =
// M_k[RMSNorm(h_i); RMSNorm(Emb(t_{i+k}))], a Transformer block, then the shared output head.
// Stored as model.layers.<num_hidden_layers>.{enorm, hnorm, eh_proj, <decoder layer>,
// shared_head.norm, shared_head.head, embed_tokens} in the released checkpoints.
struct MtpWeights {
  LayerWeights block;
  std::vector<float> enorm;      // [hidden], applied to the next token's embedding
  std::vector<float> hnorm;      // [hidden], applied to the previous hidden state
  std::vector<float> eh_proj;    // [hidden, 2 * hidden] over [enorm(e) ; hnorm(h)]
  std::vector<float> head_norm;  // [hidden] (shared_head.norm)
  std::vector<float> head;       // [vocab, hidden] or empty: the target's output head
  std::vector<float> embed;      // [vocab, hidden] or empty: the target's embed_tokens
};

// Scratch of one Forward call; vectors only grow, so steady-state steps do not allocate.
struct Workspace {
  std::vector<float> residual, normed, a_out, q_a_normed, q, latent, attn, delta;
  std::vector<float> gate_up, act, router_logits, topk_weights, routed, shared_gate_up,
      shared_act, lm_rows, mtp_cat;
  std::vector<int32_t> topk_ids;
  std::vector<uint8_t> covered;
  std::vector<kernels::MlaSequence> sequences;
  kernels::MoeWorkspace moe;
};

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// AllBf16: every value of w is a bfloat16 value (a bfloat16 checkpoint, widened on load), so a
// bfloat16 copy computes the same bits (kernels::LinearBf16Cpu) from half the bytes.
bool AllBf16(const std::vector<float>& w) {
  for (float v : w) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    if (static_cast<uint32_t>(kernels::ToBf16(v)) << 16 != bits) return false;
  }
  return true;
}

std::vector<uint16_t> Bf16Copy(const std::vector<float>& w) {
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = kernels::ToBf16(w[i]);
  return out;
}

std::vector<float> Widen(const std::vector<uint16_t>& w) {
  std::vector<float> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const uint32_t bits = static_cast<uint32_t>(w[i]) << 16;
    std::memcpy(&out[i], &bits, sizeof(bits));
  }
  return out;
}

// SetExpertViews points m.views at `count` experts of gu + dn values each, in whichever storage
// m holds.
void SetExpertViews(MoeWeights& m, int64_t count, int64_t gu, int64_t dn) {
  m.views.clear();
  const bool bf16 = !m.experts_gate_up_bf16.empty();
  for (int64_t e = 0; e < count; ++e) {
    kernels::MoeExpertWeights v;
    if (bf16) {
      v.gate_up_bf16 = m.experts_gate_up_bf16.data() + e * gu;
      v.down_bf16 = m.experts_down_bf16.data() + e * dn;
    } else {
      v.gate_up = m.experts_gate_up.data() + e * gu;
      v.down = m.experts_down.data() + e * dn;
    }
    m.views.push_back(v);
  }
}

// Linear: y = x · Wᵀ (+ bias) from W's bfloat16 copy when PackLayer made one (w32 is then
// empty), else from the float32 matrix.
void Linear(const float* x, const std::vector<float>& w32, const std::vector<uint16_t>& w16,
            const std::vector<float>& bias, float* y, int64_t m, int64_t n, int64_t k) {
  const float* b = bias.empty() ? nullptr : bias.data();
  if (!w16.empty()) {
    kernels::LinearBf16Cpu(x, w16.data(), b, y, m, n, k);
  } else {
    kernels::LinearCpu(x, w32.data(), b, y, m, n, k);
  }
}

// Pack moves w32 to w16 when AllBf16; Unpack moves it back (exactly).
void Pack(std::vector<float>& w32, std::vector<uint16_t>& w16) {
  if (w32.empty() || !AllBf16(w32)) return;
  w16 = Bf16Copy(w32);
  std::vector<float>().swap(w32);
}
void Unpack(std::vector<float>& w32, std::vector<uint16_t>& w16) {
  if (w16.empty()) return;
  w32 = Widen(w16);
  std::vector<uint16_t>().swap(w16);
}

// ForEachMatrix calls f(float32, bfloat16) for each of a layer's matrices but the routed experts.
template <typename F>
void ForEachMatrix(LayerWeights& w, F f) {
  f(w.w_a, w.w_a_bf16);
  f(w.q_b, w.q_b_bf16);
  f(w.o_proj, w.o_proj_bf16);
  MlpWeights& mlp = w.is_moe ? w.moe.shared : w.dense;
  f(mlp.gate_up, mlp.gate_up_bf16);
  f(mlp.down, mlp.down_bf16);
}

// PackLayer stores a layer's weight matrices as bfloat16 where that loses nothing (AllBf16):
// a step reads half the bytes (the routed experts: up to top_k · tokens of them per layer in a
// verification step). `experts`: the routed experts too; the expert-parallel paths move float32
// experts between ranks. UnpackLayer restores float32 (exactly) for Shard.
void PackLayer(LayerWeights& w, const ModelConfig& c, bool experts) {
  ForEachMatrix(w, Pack);
  MoeWeights& m = w.moe;
  if (!experts || !w.is_moe || !AllBf16(m.experts_gate_up) || !AllBf16(m.experts_down)) return;
  Pack(m.experts_gate_up, m.experts_gate_up_bf16);
  Pack(m.experts_down, m.experts_down_bf16);
  const int64_t h = c.hidden_size, inter = c.moe_intermediate_size;
  SetExpertViews(m, c.n_routed_experts, 2 * inter * h, h * inter);
}
void UnpackLayer(LayerWeights& w, const ModelConfig& c) {
  ForEachMatrix(w, Unpack);
  MoeWeights& m = w.moe;
  if (m.experts_gate_up_bf16.empty()) return;
  Unpack(m.experts_gate_up, m.experts_gate_up_bf16);
  Unpack(m.experts_down, m.experts_down_bf16);
  const int64_t h = c.hidden_size, inter = c.moe_intermediate_size;
  SetExpertViews(m, c.n_routed_experts, 2 * inter * h, h * inter);
}

class DeepseekV3Model : public Model {
 public:
  explicit DeepseekV3Model(const ModelConfig& config) : config_(config) {}

  absl::Status Load(const Checkpoint& checkpoint);

  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_cache_spec() const override {
    KvCacheSpec spec;
    spec.num_layers = config_.num_hidden_layers;
    spec.k_floats_per_token = config_.kv_lora_rank + config_.qk_rope_head_dim;
    spec.v_floats_per_token = 0;
    return spec;
  }
  int64_t WeightBytesPerToken() const override { return weight_bytes_per_token_; }
  int64_t WeightsPerToken() const override { return weights_per_token_; }
  // The CPU kernels fix every reduction's order per output element (kernels/linear, rms_norm,
  // mla_attention per (token, head) over all keys, MoE combine per token in top-k order).
  bool IsBatchInvariant() const override { return true; }
  bool SupportsLayerKvHook() const override { return true; }
  absl::Status Forward(const ForwardInput& input, KvCache& kv_cache,
                       absl::Span<float> logits) override;
  // ws_.residual holds them after Forward (the last AddRmsNorm adds the last layer's output).
  absl::Span<const float> final_hidden_states() const override {
    return absl::MakeConstSpan(ws_.residual.data(), last_num_tokens_ * config_.hidden_size);
  }
  absl::Status MtpStatus() const override {
    if (!mtp_status_.ok()) return mtp_status_;
    if (group_comm_ != nullptr) {
      return absl::FailedPreconditionError(
          "the model is sharded over tensor/expert-parallel ranks (TP/EP) and the MTP module "
          "drafts on an unsharded model only");
    }
    return absl::OkStatus();
  }
  KvCacheSpec mtp_kv_cache_spec() const override {
    if (!mtp_status_.ok()) return {};
    KvCacheSpec spec = kv_cache_spec();
    spec.num_layers = 1;
    return spec;
  }
  absl::Status ForwardMtp(const ForwardInput& input, absl::Span<const float> previous_hidden,
                          KvCache& kv_cache, absl::Span<float> logits,
                          absl::Span<float> hidden_out) override;
  absl::Status Shard(const ParallelShard& shard) override;
  absl::Status UpdateExpertPlacement(absl::Span<const int32_t> expert_slots) override;
  std::vector<int64_t> TakeExpertLoad() override;

 private:
  absl::Status ShardAttentionAndDense(const ParallelShard& shard);
  absl::Status ShardExperts(const ParallelShard& shard);
  absl::Status ValidateConfig() const;
  absl::Status LoadMlp(const Checkpoint& ckpt, const std::string& prefix, int64_t intermediate,
                       MlpWeights* mlp) const;
  absl::Status LoadLayer(const Checkpoint& ckpt, int64_t layer, LayerWeights* w) const;
  absl::Status LoadMtp(const Checkpoint& ckpt);
  absl::Status ValidatePlan(const ForwardInput& input, const KvCache& kv_cache,
                            const KvCacheSpec& want, absl::Span<float> logits);
  // Attention runs layer `w` with its latent cache in kv_cache's layer `cache_layer`.
  void Attention(const LayerWeights& w, int64_t cache_layer, const ForwardInput& input,
                 KvCache& kv_cache, int64_t num_tokens, absl::Status* status);
  absl::Status Mlp(const LayerWeights& w, int64_t num_tokens);
  void SwiGlu(const MlpWeights& mlp, const float* x, int64_t rows, std::vector<float>& gate_up,
              std::vector<float>& act, float* out);
  // LmHead: logits = ws_.lm_rows · headᵀ over `own_head` (the MTP module's) when not empty, else
  // the target's output head.
  void LmHead(const std::vector<float>& own_head, int64_t num_logits, float* logits) const;

  ModelConfig config_;
  int64_t q_width_ = 0;  // heads * (qk_nope_head_dim + qk_rope_head_dim)
  int64_t a_width_ = 0;  // rows of w_a
  kernels::MlaDims mla_dims_;
  kernels::MoeRoutingParams routing_;
  kernels::RopeTable rope_;
  std::vector<float> embed_;    // [vocab, hidden]
  std::vector<float> lm_head_;  // [vocab, hidden]; empty when tied (then embed_ is used)
  // The output head (lm_head_ or embed_) as bfloat16 when AllBf16; lm_head_ is then freed.
  std::vector<uint16_t> head_bf16_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  MtpWeights mtp_;
  absl::Status mtp_status_;  // OK when mtp_ is loaded
  int64_t last_num_tokens_ = 0;  // tokens of the last Forward (final_hidden_states)
  int64_t weight_bytes_per_token_ = 0;
  int64_t weights_per_token_ = 0;
  Workspace ws_;
  // Parallelism (Shard): tensor-parallel group completing o_proj and dense down_proj, and per
  // layer the expert-parallel runner of MoE layers (null for dense layers or without EP).
  Communicator* tp_comm_ = nullptr;
  Communicator* group_comm_ = nullptr;  // the group of this shard (set by Shard)
  std::vector<std::unique_ptr<ExpertParallelMoe>> ep_;
};

absl::Status DeepseekV3Model::ValidateConfig() const {
  const ModelConfig& c = config_;
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("deepseek_v3 config: ", what));
  };
  if (c.architecture != Architecture::kDeepseekV3) return bad("not a DeepSeek-V3 config");
  if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 ||
      c.vocab_size <= 0) {
    return bad("hidden_size, num_hidden_layers, num_attention_heads, vocab_size must be positive");
  }
  if (c.hidden_act != "silu") return bad(absl::StrCat("unsupported hidden_act ", c.hidden_act));
  if (c.kv_lora_rank <= 0 || c.qk_nope_head_dim < 0 || c.v_head_dim <= 0 ||
      c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0 || c.q_lora_rank < 0) {
    return bad("MLA dims: kv_lora_rank, v_head_dim > 0, qk_rope_head_dim > 0 and even");
  }
  if (c.first_k_dense_replace < c.num_hidden_layers) {
    if (c.n_routed_experts <= 0 || c.moe_intermediate_size <= 0 || c.num_experts_per_tok <= 0) {
      return bad("MoE layers need n_routed_experts, moe_intermediate_size, num_experts_per_tok");
    }
    if (c.scoring_func != "sigmoid" && c.scoring_func != "softmax") {
      return bad(absl::StrCat("unsupported scoring_func ", c.scoring_func));
    }
    if (c.n_shared_experts < 0) return bad("n_shared_experts is negative");
  }
  if (c.first_k_dense_replace > 0 && c.intermediate_size <= 0) {
    return bad("dense layers need intermediate_size");
  }
  return absl::OkStatus();
}

absl::Status DeepseekV3Model::LoadMlp(const Checkpoint& ckpt, const std::string& prefix,
                                      int64_t intermediate, MlpWeights* mlp) const {
  const int64_t h = config_.hidden_size;
  mlp->intermediate = intermediate;
  std::vector<float> up;
  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, prefix + "gate_proj.weight", {intermediate, h}, &mlp->gate_up));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, prefix + "up_proj.weight", {intermediate, h}, &up));
  mlp->gate_up.insert(mlp->gate_up.end(), up.begin(), up.end());
  return LoadWeightInto(ckpt, prefix + "down_proj.weight", {h, intermediate}, &mlp->down);
}

absl::Status DeepseekV3Model::LoadLayer(const Checkpoint& ckpt, int64_t layer,
                                        LayerWeights* w) const {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t rank = c.kv_lora_rank;
  const int64_t dr = c.qk_rope_head_dim;
  const std::string p = LayerPrefix(layer);
  const std::string attn = p + "self_attn.";
  w->index = layer;
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "input_layernorm.weight", {h}, &w->input_norm));
  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, p + "post_attention_layernorm.weight", {h}, &w->post_attention_norm));

  // Fused input projection [q_a_proj | q_proj ; kv_a_proj_with_mqa].
  std::vector<float> kv_a, q_first, kv_a_bias, q_first_bias;
  const std::string q_first_name = c.q_lora_rank > 0 ? "q_a_proj" : "q_proj";
  const int64_t q_first_rows = c.q_lora_rank > 0 ? c.q_lora_rank : q_width_;
  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, attn + q_first_name + ".weight", {q_first_rows, h}, &q_first));
  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, attn + "kv_a_proj_with_mqa.weight", {rank + dr, h}, &kv_a));
  w->w_a = std::move(q_first);
  w->w_a.insert(w->w_a.end(), kv_a.begin(), kv_a.end());
  if (c.attention_bias) {
    // transformers: q_a_proj and kv_a_proj_with_mqa carry the bias; q_proj has none.
    if (c.q_lora_rank > 0) {
      SLUICE_RETURN_IF_ERROR(
          LoadWeightInto(ckpt, attn + "q_a_proj.bias", {c.q_lora_rank}, &q_first_bias));
    } else {
      q_first_bias.assign(q_width_, 0.0f);
    }
    SLUICE_RETURN_IF_ERROR(
        LoadWeightInto(ckpt, attn + "kv_a_proj_with_mqa.bias", {rank + dr}, &kv_a_bias));
    w->b_a = std::move(q_first_bias);
    w->b_a.insert(w->b_a.end(), kv_a_bias.begin(), kv_a_bias.end());
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, attn + "o_proj.bias", {h}, &w->o_bias));
  }
  if (c.q_lora_rank > 0) {
    SLUICE_RETURN_IF_ERROR(
        LoadWeightInto(ckpt, attn + "q_a_layernorm.weight", {c.q_lora_rank}, &w->q_a_norm));
    SLUICE_RETURN_IF_ERROR(
        LoadWeightInto(ckpt, attn + "q_b_proj.weight", {q_width_, c.q_lora_rank}, &w->q_b));
  }
  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, attn + "kv_a_layernorm.weight", {rank}, &w->kv_a_norm));
  // kv_b_proj rows are per head [k_nope (qk_nope_head_dim) ; v (v_head_dim)]: exactly the
  // [heads, dn + dv, R] layout of W_UK / W_UV that the absorbed kernel reads.
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, attn + "kv_b_proj.weight",
                                        {heads * (c.qk_nope_head_dim + c.v_head_dim), rank},
                                        &w->kv_b));
  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, attn + "o_proj.weight", {h, heads * c.v_head_dim}, &w->o_proj));

  w->is_moe = layer >= c.first_k_dense_replace;
  if (!w->is_moe) return LoadMlp(ckpt, p + "mlp.", c.intermediate_size, &w->dense);

  MoeWeights& m = w->moe;
  const int64_t e_count = c.n_routed_experts;
  const int64_t inter = c.moe_intermediate_size;
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "mlp.gate.weight", {e_count, h}, &m.router));
  if (c.has_score_correction_bias) {
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "mlp.gate.e_score_correction_bias", {e_count},
                                          &m.correction_bias));
  } else {
    m.correction_bias.assign(static_cast<size_t>(e_count), 0.0f);  // DeepSeek-V2: none
  }
  m.experts_gate_up.resize(e_count * 2 * inter * h);
  m.experts_down.resize(e_count * h * inter);
  for (int64_t e = 0; e < e_count; ++e) {
    MlpWeights expert;
    SLUICE_RETURN_IF_ERROR(LoadMlp(ckpt, absl::StrCat(p, "mlp.experts.", e, "."), inter, &expert));
    std::memcpy(m.experts_gate_up.data() + e * 2 * inter * h, expert.gate_up.data(),
                expert.gate_up.size() * sizeof(float));
    std::memcpy(m.experts_down.data() + e * h * inter, expert.down.data(),
                expert.down.size() * sizeof(float));
  }
  SetExpertViews(m, e_count, 2 * inter * h, h * inter);
  m.has_shared = c.n_shared_experts > 0;
  if (m.has_shared) {
    SLUICE_RETURN_IF_ERROR(
        LoadMlp(ckpt, p + "mlp.shared_experts.", inter * c.n_shared_experts, &m.shared));
  }
  return absl::OkStatus();
}

absl::Status DeepseekV3Model::Load(const Checkpoint& ckpt) {
  SLUICE_RETURN_IF_ERROR(ValidateConfig());
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  q_width_ = c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim);
  a_width_ = (c.q_lora_rank > 0 ? c.q_lora_rank : q_width_) + c.kv_lora_rank + c.qk_rope_head_dim;

  // Softmax scale: transformers' DeepseekV3Attention.__init__ uses qk_head_dim^-0.5 and, when
  // rope scaling is configured with mscale_all_dim, multiplies it by yarn_get_mscale(factor,
  // mscale_all_dim)² where yarn_get_mscale(s, m) = 1 if s <= 1 else 0.1·m·ln(s) + 1.
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (c.rope.rope_type != "default" && c.rope.mscale_all_dim != 0.0) {
    const double m =
        c.rope.factor <= 1.0 ? 1.0 : 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
    scale *= m * m;
  }
  mla_dims_ = kernels::MlaDims{c.num_attention_heads, c.kv_lora_rank,     c.qk_nope_head_dim,
                               c.qk_rope_head_dim,    c.v_head_dim,       static_cast<float>(scale)};

  kernels::RopeParams rp;
  rp.rope_type = c.rope.rope_type;
  rp.theta = c.rope.rope_theta;
  rp.rotary_dim = c.qk_rope_head_dim;
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

  if (c.first_k_dense_replace < c.num_hidden_layers) {
    routing_.num_experts = c.n_routed_experts;
    routing_.top_k = c.num_experts_per_tok;
    routing_.n_group = c.n_group;
    routing_.topk_group = c.topk_group;
    routing_.group_score_max = c.moe_group_score_max;
    routing_.scoring =
        c.scoring_func == "softmax" ? kernels::MoeScoring::kSoftmax : kernels::MoeScoring::kSigmoid;
    routing_.norm_topk_prob = c.norm_topk_prob;
    routing_.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
    if (absl::Status s = kernels::ValidateMoeRoutingParams(routing_); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("deepseek_v3 config: ", s.message()));
    }
  }

  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, "model.embed_tokens.weight", {c.vocab_size, h}, &embed_));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, "model.norm.weight", {h}, &final_norm_));
  if (!c.tie_word_embeddings) {
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, "lm_head.weight", {c.vocab_size, h}, &lm_head_));
  }
  layers_.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    SLUICE_RETURN_IF_ERROR(LoadLayer(ckpt, l, &layers_[l]));
  }
  SLUICE_RETURN_IF_ERROR(LoadMtp(ckpt));

  // Weights one decode token reads: every attention/norm/dense weight, the
  // router, num_experts_per_tok routed experts and the shared experts per MoE layer, the final
  // norm, lm_head and one embedding row.
  int64_t floats = h + final_norm_.size() + static_cast<int64_t>(c.vocab_size) * h;
  for (const LayerWeights& w : layers_) {
    floats += w.input_norm.size() + w.post_attention_norm.size() + w.w_a.size() + w.b_a.size() +
              w.q_a_norm.size() + w.q_b.size() + w.kv_a_norm.size() + w.kv_b.size() +
              w.o_proj.size() + w.o_bias.size();
    if (!w.is_moe) {
      floats += w.dense.gate_up.size() + w.dense.down.size();
    } else {
      floats += w.moe.router.size() + w.moe.correction_bias.size() +
                c.num_experts_per_tok * 3 * c.moe_intermediate_size * h +
                w.moe.shared.gate_up.size() + w.moe.shared.down.size();
    }
  }
  weights_per_token_ = floats;

  // The weight matrices in bfloat16 where that is exact (AllBf16).
  const float* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
  std::vector<float> head_values(head, head + c.vocab_size * h);
  if (AllBf16(head_values)) {
    head_bf16_ = Bf16Copy(head_values);
    std::vector<float>().swap(lm_head_);
  }
  for (LayerWeights& w : layers_) PackLayer(w, c, /*experts=*/true);
  if (mtp_status_.ok()) PackLayer(mtp_.block, c, /*experts=*/true);

  // The same weights in bytes, as stored now: 2 per bfloat16 value, 4 per float32 one.
  const int64_t bf16_saved = 2;  // bytes per value a bfloat16 copy saves
  int64_t saved = head_bf16_.empty() ? 0 : static_cast<int64_t>(c.vocab_size) * h * bf16_saved;
  for (const LayerWeights& w : layers_) {
    const MlpWeights& mlp = w.is_moe ? w.moe.shared : w.dense;
    saved += bf16_saved * static_cast<int64_t>(w.w_a_bf16.size() + w.q_b_bf16.size() +
                                                w.o_proj_bf16.size() + mlp.gate_up_bf16.size() +
                                                mlp.down_bf16.size());
    if (w.is_moe && !w.moe.experts_gate_up_bf16.empty()) {
      saved += bf16_saved * c.num_experts_per_tok * 3 * c.moe_intermediate_size * h;
    }
  }
  weight_bytes_per_token_ = floats * static_cast<int64_t>(sizeof(float)) - saved;
  return absl::OkStatus();
}

// LoadMtp loads the first MTP module when the config declares one and the checkpoint has it
// (its eh_proj present); a declared but absent module leaves mtp_status_ NotFound and the target
// loads as usual. A module present in part is an error.
absl::Status DeepseekV3Model::LoadMtp(const Checkpoint& ckpt) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  const std::string p = LayerPrefix(c.num_hidden_layers);
  if (c.num_nextn_predict_layers <= 0) {
    mtp_status_ = absl::NotFoundError(
        "the checkpoint declares no MTP module (num_nextn_predict_layers is 0)");
    return absl::OkStatus();
  }
  if (!ckpt.Contains(p + "eh_proj.weight")) {
    mtp_status_ = absl::NotFoundError(absl::StrCat(
        "the checkpoint declares num_nextn_predict_layers = ", c.num_nextn_predict_layers,
        " but has no MTP weights (missing ", p, "eh_proj.weight, ", p, "enorm.weight, ", p,
        "hnorm.weight, ", p, "shared_head.norm.weight and the ", p, "self_attn/mlp tensors)"));
    return absl::OkStatus();
  }
  MtpWeights& m = mtp_;
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "enorm.weight", {h}, &m.enorm));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "hnorm.weight", {h}, &m.hnorm));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "eh_proj.weight", {h, 2 * h}, &m.eh_proj));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "shared_head.norm.weight", {h}, &m.head_norm));
  bool present = false;
  SLUICE_RETURN_IF_ERROR(LoadOptionalWeightInto(ckpt, p + "shared_head.head.weight",
                                                {c.vocab_size, h}, &m.head, &present));
  SLUICE_RETURN_IF_ERROR(LoadOptionalWeightInto(ckpt, p + "embed_tokens.weight",
                                                {c.vocab_size, h}, &m.embed, &present));
  SLUICE_RETURN_IF_ERROR(LoadLayer(ckpt, c.num_hidden_layers, &m.block));
  mtp_status_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status DeepseekV3Model::ValidatePlan(const ForwardInput& input, const KvCache& kv_cache,
                                           const KvCacheSpec& want, absl::Span<float> logits) {
  const int64_t num_tokens = static_cast<int64_t>(input.token_ids.size());
  if (static_cast<int64_t>(input.positions.size()) != num_tokens ||
      static_cast<int64_t>(input.slot_mapping.size()) != num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward: ", num_tokens, " token ids but ", input.positions.size(), " positions and ",
        input.slot_mapping.size(), " slots"));
  }
  const KvCacheSpec& have = kv_cache.spec();
  if (have.num_layers != want.num_layers || have.k_floats_per_token != want.k_floats_per_token ||
      have.v_floats_per_token != want.v_floats_per_token || kv_cache.block_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward: KV cache spec (layers ", have.num_layers, ", k ", have.k_floats_per_token,
        ", v ", have.v_floats_per_token, ") does not match the model's (", want.num_layers, ", ",
        want.k_floats_per_token, ", 0)"));
  }
  if (logits.size() != input.logits_indices.size() * static_cast<size_t>(config_.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: logits buffer of ", logits.size(), " floats, expected ",
                     input.logits_indices.size(), " x ", config_.vocab_size));
  }
  for (int32_t idx : input.logits_indices) {
    if (idx < 0 || idx >= num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: logits index ", idx, " outside [0, ", num_tokens, ")"));
    }
  }
  ws_.covered.assign(num_tokens, 0);
  ws_.sequences.clear();
  for (const SequenceSlice& s : input.sequences) {
    if (s.query_start < 0 || s.num_query_tokens < 0 || s.num_context_tokens < 0 ||
        int64_t{s.query_start} + s.num_query_tokens > num_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward: sequence tokens [", s.query_start, ", +", s.num_query_tokens,
          ") outside the batch of ", num_tokens));
    }
    for (int32_t i = 0; i < s.num_query_tokens; ++i) {
      const int64_t t = s.query_start + i;
      if (ws_.covered[t]) {
        return absl::InvalidArgumentError(absl::StrCat("forward: token ", t, " in two sequences"));
      }
      ws_.covered[t] = 1;
      if (input.positions[t] != s.num_context_tokens + i) {
        return absl::InvalidArgumentError(absl::StrCat(
            "forward: token ", t, " has position ", input.positions[t], ", expected ",
            s.num_context_tokens + i, " from its sequence's context length"));
      }
    }
    ws_.sequences.push_back(
        {s.query_start, s.num_query_tokens, s.num_context_tokens, s.block_table});
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (!ws_.covered[t]) {
      return absl::InvalidArgumentError(absl::StrCat("forward: token ", t, " in no sequence"));
    }
  }
  return absl::OkStatus();
}

void DeepseekV3Model::SwiGlu(const MlpWeights& mlp, const float* x, int64_t rows,
                             std::vector<float>& gate_up, std::vector<float>& act, float* out) {
  const int64_t h = config_.hidden_size;
  Grow(gate_up, rows * 2 * mlp.intermediate);
  Grow(act, rows * mlp.intermediate);
  Linear(x, mlp.gate_up, mlp.gate_up_bf16, {}, gate_up.data(), rows, 2 * mlp.intermediate, h);
  kernels::SiluMulCpu(gate_up.data(), act.data(), rows, mlp.intermediate);
  Linear(act.data(), mlp.down, mlp.down_bf16, {}, out, rows, h, mlp.intermediate);
}

void DeepseekV3Model::LmHead(const std::vector<float>& own_head, int64_t num_logits,
                             float* logits) const {
  const int64_t h = config_.hidden_size, vocab = config_.vocab_size;
  if (!own_head.empty()) {
    kernels::LinearCpu(ws_.lm_rows.data(), own_head.data(), nullptr, logits, num_logits, vocab, h);
  } else if (!head_bf16_.empty()) {
    kernels::LinearBf16Cpu(ws_.lm_rows.data(), head_bf16_.data(), nullptr, logits, num_logits,
                           vocab, h);
  } else {
    const float* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
    kernels::LinearCpu(ws_.lm_rows.data(), head, nullptr, logits, num_logits, vocab, h);
  }
}

// Attention reads ws_.normed and writes o_proj's output to ws_.delta.
void DeepseekV3Model::Attention(const LayerWeights& w, int64_t cache_layer,
                                const ForwardInput& input, KvCache& kv_cache, int64_t num_tokens,
                                absl::Status* status) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  const int64_t rank = c.kv_lora_rank;
  const int64_t dr = c.qk_rope_head_dim;
  const int64_t q_first = c.q_lora_rank > 0 ? c.q_lora_rank : q_width_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t latent_width = rank + dr;

  Linear(ws_.normed.data(), w.w_a, w.w_a_bf16, w.b_a, ws_.a_out.data(), num_tokens, a_width_, h);
  // Query: q_b_proj(q_a_layernorm(q_a)) or q_proj's rows of the fused output.
  float* q = nullptr;
  int64_t q_stride = 0;
  if (c.q_lora_rank > 0) {
    kernels::RmsNormCpu(ws_.a_out.data(), a_width_, w.q_a_norm.data(), ws_.q_a_normed.data(),
                        c.q_lora_rank, num_tokens, c.q_lora_rank, eps);
    Linear(ws_.q_a_normed.data(), w.q_b, w.q_b_bf16, {}, ws_.q.data(), num_tokens, q_width_,
           c.q_lora_rank);
    q = ws_.q.data();
    q_stride = q_width_;
  } else {
    q = ws_.a_out.data();
    q_stride = a_width_;
  }
  // Latent cache entry: [kv_a_layernorm(c_kv) ; rope(k_pe)].
  kernels::RmsNormCpu(ws_.a_out.data() + q_first, a_width_, w.kv_a_norm.data(),
                      ws_.latent.data(), latent_width, num_tokens, rank, eps);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::memcpy(ws_.latent.data() + t * latent_width + rank,
                ws_.a_out.data() + t * a_width_ + q_first + rank, dr * sizeof(float));
  }
  kernels::RopeCpu(ws_.latent.data(), num_tokens, 1, latent_width, 0, rank,
                   input.positions.data(), rope_, c.rope_interleave);
  kernels::RopeCpu(q, num_tokens, c.num_attention_heads, q_stride,
                   c.qk_nope_head_dim + c.qk_rope_head_dim, c.qk_nope_head_dim,
                   input.positions.data(), rope_, c.rope_interleave);

  kernels::MlaPagedCache cache{kv_cache.k(cache_layer), kv_cache.num_blocks(),
                               kv_cache.block_size()};
  *status = kernels::MlaWriteCacheCpu(ws_.latent.data(), input.slot_mapping.data(), num_tokens,
                                      mla_dims_, cache);
  if (!status->ok()) return;
  *status = kernels::MlaAttentionCpu(q, q_stride, w.kv_b.data(), ws_.sequences, mla_dims_, cache,
                                     ws_.attn.data());
  if (!status->ok()) return;
  Linear(ws_.attn.data(), w.o_proj, w.o_proj_bf16, w.o_bias, ws_.delta.data(), num_tokens, h,
         c.num_attention_heads * c.v_head_dim);
  if (tp_comm_ != nullptr) {  // row-parallel o_proj over this rank's heads
    *status = tp_comm_->AllReduceSum(absl::MakeSpan(ws_.delta.data(), num_tokens * h));
  }
}

// Mlp reads ws_.normed and writes the MLP output to ws_.delta.
absl::Status DeepseekV3Model::Mlp(const LayerWeights& w, int64_t num_tokens) {
  const int64_t h = config_.hidden_size;
  if (!w.is_moe) {
    SwiGlu(w.dense, ws_.normed.data(), num_tokens, ws_.gate_up, ws_.act, ws_.delta.data());
    if (tp_comm_ != nullptr) {  // row-parallel down_proj
      return tp_comm_->AllReduceSum(absl::MakeSpan(ws_.delta.data(), num_tokens * h));
    }
    return absl::OkStatus();
  }
  const MoeWeights& m = w.moe;
  const int64_t e_count = config_.n_routed_experts;
  const int64_t top_k = config_.num_experts_per_tok;
  Grow(ws_.router_logits, num_tokens * e_count);
  Grow(ws_.topk_ids, num_tokens * top_k);
  Grow(ws_.topk_weights, num_tokens * top_k);
  Grow(ws_.routed, num_tokens * h);
  // Router logits in float32 (transformers upcasts the router to float32 as well).
  kernels::LinearCpu(ws_.normed.data(), m.router.data(), nullptr, ws_.router_logits.data(),
                     num_tokens, e_count, h);
  SLUICE_RETURN_IF_ERROR(kernels::MoeRoutingCpu(ws_.router_logits.data(), m.correction_bias.data(),
                                                num_tokens, routing_, ws_.topk_ids.data(),
                                                ws_.topk_weights.data()));
  // The MTP block (index num_hidden_layers) is never expert-parallel (MtpStatus when sharded).
  ExpertParallelMoe* ep =
      w.index < static_cast<int64_t>(ep_.size()) ? ep_[w.index].get() : nullptr;
  if (ep != nullptr) {  // m.views holds this rank's expert slots only
    SLUICE_RETURN_IF_ERROR(ep->Run(ws_.normed.data(), num_tokens, h, config_.moe_intermediate_size,
                                   ws_.topk_ids.data(), ws_.topk_weights.data(), top_k, m.views,
                                   ws_.routed.data()));
  } else {
    SLUICE_RETURN_IF_ERROR(kernels::MoeExpertsCpu(
        ws_.normed.data(), num_tokens, h, config_.moe_intermediate_size, ws_.topk_ids.data(),
        ws_.topk_weights.data(), top_k, m.views, ws_.routed.data(), ws_.moe));
  }
  if (!m.has_shared) {
    std::memcpy(ws_.delta.data(), ws_.routed.data(), num_tokens * h * sizeof(float));
    return absl::OkStatus();
  }
  SwiGlu(m.shared, ws_.normed.data(), num_tokens, ws_.shared_gate_up, ws_.shared_act,
         ws_.delta.data());
  // transformers: moe(hidden) + shared_experts(residuals).
  float* d = ws_.delta.data();
  const float* r = ws_.routed.data();
  for (int64_t i = 0; i < num_tokens * h; ++i) d[i] = r[i] + d[i];
  return absl::OkStatus();
}

absl::Status DeepseekV3Model::Forward(const ForwardInput& input, KvCache& kv_cache,
                                      absl::Span<float> logits) {
  SLUICE_RETURN_IF_ERROR(ValidatePlan(input, kv_cache, kv_cache_spec(), logits));
  const ModelConfig& c = config_;
  const int64_t num_tokens = static_cast<int64_t>(input.token_ids.size());
  last_num_tokens_ = num_tokens;
  if (num_tokens == 0) return absl::OkStatus();
  const int64_t h = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  Grow(ws_.residual, num_tokens * h);
  Grow(ws_.normed, num_tokens * h);
  Grow(ws_.delta, num_tokens * h);
  Grow(ws_.a_out, num_tokens * a_width_);
  Grow(ws_.q_a_normed, num_tokens * std::max<int64_t>(c.q_lora_rank, 1));
  Grow(ws_.q, num_tokens * q_width_);
  Grow(ws_.latent, num_tokens * (c.kv_lora_rank + c.qk_rope_head_dim));
  Grow(ws_.attn, num_tokens * c.num_attention_heads * c.v_head_dim);

  SLUICE_RETURN_IF_ERROR(kernels::EmbeddingCpu(
      embed_.data(), c.vocab_size, h, input.token_ids.data(), num_tokens, ws_.residual.data()));
  kernels::RmsNormCpu(ws_.residual.data(), h, layers_[0].input_norm.data(), ws_.normed.data(), h,
                      num_tokens, h, eps);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = layers_[l];
    absl::Status status;
    Attention(w, l, input, kv_cache, num_tokens, &status);
    SLUICE_RETURN_IF_ERROR(status);
    // The layer's latent KV is in the cache: a layer-by-layer push may move it from here on.
    if (input.on_layer_kv_written) input.on_layer_kv_written(static_cast<int32_t>(l), nullptr);
    kernels::AddRmsNormCpu(ws_.delta.data(), ws_.residual.data(), w.post_attention_norm.data(),
                           ws_.normed.data(), num_tokens, h, eps);
    SLUICE_RETURN_IF_ERROR(Mlp(w, num_tokens));
    const float* next_norm =
        l + 1 < c.num_hidden_layers ? layers_[l + 1].input_norm.data() : final_norm_.data();
    kernels::AddRmsNormCpu(ws_.delta.data(), ws_.residual.data(), next_norm, ws_.normed.data(),
                           num_tokens, h, eps);
  }

  const int64_t num_logits = static_cast<int64_t>(input.logits_indices.size());
  if (num_logits == 0) return absl::OkStatus();
  Grow(ws_.lm_rows, num_logits * h);
  for (int64_t i = 0; i < num_logits; ++i) {
    std::memcpy(ws_.lm_rows.data() + i * h, ws_.normed.data() + input.logits_indices[i] * h,
                h * sizeof(float));
  }
  LmHead({}, num_logits, logits.data());
  return absl::OkStatus();
}

// ForwardMtp: the MTP module (arXiv:2412.19437 §2.2) over the step. The concatenation order
// [enorm(embedding of the next token) ; hnorm(previous hidden state)] is that of the released
// checkpoints' eh_proj as vLLM's deepseek_mtp serves them.
absl::Status DeepseekV3Model::ForwardMtp(const ForwardInput& input,
                                         absl::Span<const float> previous_hidden,
                                         KvCache& kv_cache, absl::Span<float> logits,
                                         absl::Span<float> hidden_out) {
  SLUICE_RETURN_IF_ERROR(MtpStatus());
  SLUICE_RETURN_IF_ERROR(ValidatePlan(input, kv_cache, mtp_kv_cache_spec(), logits));
  const ModelConfig& c = config_;
  const int64_t num_tokens = static_cast<int64_t>(input.token_ids.size());
  const int64_t num_logits = static_cast<int64_t>(input.logits_indices.size());
  const int64_t h = c.hidden_size;
  if (static_cast<int64_t>(previous_hidden.size()) != num_tokens * h ||
      static_cast<int64_t>(hidden_out.size()) != num_logits * h) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward_mtp: previous hidden of ", previous_hidden.size(), " floats and hidden_out of ",
        hidden_out.size(), ", expected ", num_tokens, " and ", num_logits, " rows of ", h));
  }
  last_num_tokens_ = 0;  // the scratch no longer holds the target's hidden states
  if (num_tokens == 0) return absl::OkStatus();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const MtpWeights& m = mtp_;
  Grow(ws_.residual, num_tokens * h);
  Grow(ws_.normed, num_tokens * h);
  Grow(ws_.delta, num_tokens * h);
  Grow(ws_.mtp_cat, num_tokens * 2 * h);
  Grow(ws_.a_out, num_tokens * a_width_);
  Grow(ws_.q_a_normed, num_tokens * std::max<int64_t>(c.q_lora_rank, 1));
  Grow(ws_.q, num_tokens * q_width_);
  Grow(ws_.latent, num_tokens * (c.kv_lora_rank + c.qk_rope_head_dim));
  Grow(ws_.attn, num_tokens * c.num_attention_heads * c.v_head_dim);

  const float* embed = m.embed.empty() ? embed_.data() : m.embed.data();
  SLUICE_RETURN_IF_ERROR(kernels::EmbeddingCpu(embed, c.vocab_size, h, input.token_ids.data(),
                                               num_tokens, ws_.delta.data()));
  kernels::RmsNormCpu(ws_.delta.data(), h, m.enorm.data(), ws_.mtp_cat.data(), 2 * h, num_tokens,
                      h, eps);
  kernels::RmsNormCpu(previous_hidden.data(), h, m.hnorm.data(), ws_.mtp_cat.data() + h, 2 * h,
                      num_tokens, h, eps);
  kernels::LinearCpu(ws_.mtp_cat.data(), m.eh_proj.data(), nullptr, ws_.residual.data(),
                     num_tokens, h, 2 * h);
  kernels::RmsNormCpu(ws_.residual.data(), h, m.block.input_norm.data(), ws_.normed.data(), h,
                      num_tokens, h, eps);
  absl::Status status;
  Attention(m.block, 0, input, kv_cache, num_tokens, &status);
  SLUICE_RETURN_IF_ERROR(status);
  kernels::AddRmsNormCpu(ws_.delta.data(), ws_.residual.data(), m.block.post_attention_norm.data(),
                         ws_.normed.data(), num_tokens, h, eps);
  SLUICE_RETURN_IF_ERROR(Mlp(m.block, num_tokens));
  kernels::AddRmsNormCpu(ws_.delta.data(), ws_.residual.data(), m.head_norm.data(),
                         ws_.normed.data(), num_tokens, h, eps);
  if (num_logits == 0) return absl::OkStatus();
  Grow(ws_.lm_rows, num_logits * h);
  for (int64_t i = 0; i < num_logits; ++i) {
    const int64_t t = input.logits_indices[i];
    std::memcpy(ws_.lm_rows.data() + i * h, ws_.normed.data() + t * h, h * sizeof(float));
    std::memcpy(hidden_out.data() + i * h, ws_.residual.data() + t * h, h * sizeof(float));
  }
  LmHead(m.head, num_logits, logits.data());
  return absl::OkStatus();
}

absl::Status DeepseekV3Model::Shard(const ParallelShard& shard) {
  if (shard.world_size == 1) return absl::OkStatus();
  if (shard.comm == nullptr) return absl::InvalidArgumentError("ParallelShard: no communicator");
  if (group_comm_ != nullptr) return absl::FailedPreconditionError("the model is already sharded");
  group_comm_ = shard.comm;
  // The splits below move float32 rows and columns; packed again after, but for the experts of
  // an expert-parallel model (ExpertParallelMoe moves float32 experts).
  for (LayerWeights& w : layers_) UnpackLayer(w, config_);
  if (shard.tensor_parallel) SLUICE_RETURN_IF_ERROR(ShardAttentionAndDense(shard));
  if (shard.expert_parallel) SLUICE_RETURN_IF_ERROR(ShardExperts(shard));
  for (LayerWeights& w : layers_) PackLayer(w, config_, /*experts=*/!shard.expert_parallel);
  return absl::OkStatus();
}

// MLA heads split (q_b_proj or q_proj rows and kv_b_proj rows by head, o_proj columns); the
// latent projection kv_a_proj_with_mqa, its norm and hence the latent KV cache stay replicated.
// Dense MLPs: gate/up rows and down columns by channel. Shared and routed experts of MoE layers
// are not split here (replicated, or sharded whole by ShardExperts).
absl::Status DeepseekV3Model::ShardAttentionAndDense(const ParallelShard& shard) {
  ModelConfig& c = config_;
  auto heads = EvenShard(c.num_attention_heads, shard.rank, shard.world_size,
                         "num_attention_heads");
  if (!heads.ok()) return heads.status();
  const int64_t h = c.hidden_size, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const int64_t latent = c.kv_lora_rank + c.qk_rope_head_dim;
  for (LayerWeights& w : layers_) {
    if (c.q_lora_rank > 0) {
      w.q_b = GatherRows(w.q_b, c.q_lora_rank, {Scale(*heads, qk)});
    } else {  // w_a = [q_proj ; kv_a_proj_with_mqa]: keep this rank's q rows and all kv_a rows
      const Range rows[] = {Scale(*heads, qk), {q_width_, latent}};
      w.w_a = GatherRows(w.w_a, h, rows);
      if (!w.b_a.empty()) w.b_a = GatherRows(w.b_a, 1, rows);
    }
    w.kv_b = GatherRows(w.kv_b, c.kv_lora_rank, {Scale(*heads, c.qk_nope_head_dim + c.v_head_dim)});
    w.o_proj = SliceColumns(w.o_proj, h, c.num_attention_heads * c.v_head_dim,
                            Scale(*heads, c.v_head_dim));
    if (shard.rank != 0) w.o_bias.clear();
    if (!w.is_moe) {
      auto inter = EvenShard(w.dense.intermediate, shard.rank, shard.world_size,
                             "intermediate_size");
      if (!inter.ok()) return inter.status();
      const Range rows[] = {*inter, Offset(*inter, w.dense.intermediate)};
      w.dense.gate_up = GatherRows(w.dense.gate_up, h, rows);
      w.dense.down = SliceColumns(w.dense.down, h, w.dense.intermediate, *inter);
      w.dense.intermediate = inter->count;
    }
  }
  c.num_attention_heads = heads->count;
  c.num_key_value_heads = heads->count;
  c.intermediate_size /= shard.world_size;
  q_width_ = heads->count * qk;
  a_width_ = (c.q_lora_rank > 0 ? c.q_lora_rank : q_width_) + latent;
  mla_dims_.num_heads = heads->count;
  tp_comm_ = shard.comm;
  return absl::OkStatus();
}

// Routed experts: each rank keeps the weights of its expert slots (shard.expert_slots, or a
// contiguous split) and runs MoE layers through ExpertParallelMoe. Router and shared experts
// stay replicated.
absl::Status DeepseekV3Model::ShardExperts(const ParallelShard& shard) {
  const ModelConfig& c = config_;
  if (c.first_k_dense_replace >= c.num_hidden_layers) {
    return absl::InvalidArgumentError("expert parallelism: the model has no MoE layers");
  }
  auto placement = PlacementFromSlots(shard.expert_slots, static_cast<int32_t>(c.n_routed_experts),
                                      shard.world_size);
  if (!placement.ok()) return placement.status();
  const std::vector<int32_t> mine = placement->RankExperts(shard.rank);
  const int64_t h = c.hidden_size, inter = c.moe_intermediate_size;
  const int64_t gu = 2 * inter * h, dn = h * inter;  // floats per expert
  ep_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!layers_[l].is_moe) continue;
    MoeWeights& m = layers_[l].moe;
    std::vector<float> gate_up(mine.size() * gu), down(mine.size() * dn);
    for (size_t s = 0; s < mine.size(); ++s) {
      std::memcpy(gate_up.data() + s * gu, m.experts_gate_up.data() + mine[s] * gu,
                  gu * sizeof(float));
      std::memcpy(down.data() + s * dn, m.experts_down.data() + mine[s] * dn, dn * sizeof(float));
    }
    m.experts_gate_up = std::move(gate_up);
    m.experts_down = std::move(down);
    SetExpertViews(m, static_cast<int64_t>(mine.size()), gu, dn);
    ep_[l] = std::make_unique<ExpertParallelMoe>(shard.comm, *placement);
  }
  return absl::OkStatus();
}

absl::Status DeepseekV3Model::UpdateExpertPlacement(absl::Span<const int32_t> expert_slots) {
  const ExpertParallelMoe* any = nullptr;
  for (const auto& ep : ep_) any = any != nullptr ? any : ep.get();
  if (any == nullptr) return absl::FailedPreconditionError("the model is not expert-parallel");
  const ExpertPlacement from = any->placement();
  auto to = PlacementFromSlots(expert_slots, from.num_logical_experts, from.num_ranks);
  if (!to.ok()) return to.status();
  const int64_t h = config_.hidden_size, inter = config_.moe_intermediate_size;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (ep_[l] == nullptr) continue;
    MoeWeights& m = layers_[l].moe;
    Communicator& comm = *group_comm_;
    auto gate_up = RedistributeExperts(comm, from, *to, m.experts_gate_up, 2 * inter * h);
    if (!gate_up.ok()) return gate_up.status();
    auto down = RedistributeExperts(comm, from, *to, m.experts_down, h * inter);
    if (!down.ok()) return down.status();
    m.experts_gate_up = std::move(*gate_up);
    m.experts_down = std::move(*down);
    SetExpertViews(m, to->slots_per_rank, 2 * inter * h, h * inter);
    std::vector<int64_t> load = ep_[l]->load();  // keep counting across the swap
    ep_[l] = std::make_unique<ExpertParallelMoe>(&comm, *to);
    ep_[l]->AddLoad(load);
  }
  return absl::OkStatus();
}

std::vector<int64_t> DeepseekV3Model::TakeExpertLoad() {
  std::vector<int64_t> total;
  for (const auto& ep : ep_) {
    if (ep == nullptr) continue;
    total.resize(ep->load().size(), 0);
    for (size_t e = 0; e < total.size(); ++e) total[e] += ep->load()[e];
    ep->ResetLoad();
  }
  return total;
}

#undef SLUICE_RETURN_IF_ERROR

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadDeepseekV3(const ModelConfig& config,
                                                      const Checkpoint& checkpoint) {
  auto model = std::make_unique<DeepseekV3Model>(config);
  if (absl::Status s = model->Load(checkpoint); !s.ok()) return s;
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace sluice
