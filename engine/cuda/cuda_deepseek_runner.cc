#include "engine/cuda/cuda_deepseek_runner.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/batched_gemm.h"
#include "engine/cuda/runner_core.h"
#include "engine/model/rope_config.h"
#include "engine/model/weight_loader.h"
#include "kernels/mla_attention/mla_attention_cuda.h"
#include "kernels/mla_attention/mla_invariant_cuda.h"
#include "kernels/mla_attention/mla_plumbing_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_prefill_gemm_cuda.h"
#include "kernels/rms_norm/rms_norm_cuda.h"
#include "kernels/rope/rope_cuda.h"

namespace sluice::cuda_runner {
namespace {

using kernels::AddInPlaceCuda;
using kernels::CopyHeadsCuda;
using kernels::HeadSpans;
using kernels::kMlaAbsorbMaxTokens;
using kernels::MlaAbsorbQueryCuda;
using kernels::MlaAssembleKvCuda;
using kernels::MlaGatherLatentCuda;
using kernels::MlaPrologueAbsorbCuda;
using kernels::MlaPrologueArgs;
using kernels::MlaPrologueCuda;

// One decoder layer on the device.
struct MlaLayer {
  DeviceBuffer<bf16> input_norm, post_norm;  // [H]
  // Fused input projection: rows of q_a_proj [q_lora_rank] (or q_proj [heads · qk] when
  // q_lora_rank = 0), then kv_a_proj_with_mqa [R + dr]; [a_width, H]. Bias: same rows or empty.
  DeviceBuffer<bf16> w_a, b_a;
  DeviceBuffer<bf16> q_a_norm;   // [q_lora_rank] (empty when 0)
  DeviceBuffer<bf16> q_b;        // [heads · qk, q_lora_rank] (empty when 0)
  DeviceBuffer<bf16> kv_a_norm;  // [R]
  // kv_b_proj: per head dn rows of W_UK then dv rows of W_UV, each [R]: [heads, dn + dv, R].
  DeviceBuffer<bf16> kv_b;
  DeviceBuffer<bf16> o_proj, o_bias;  // [H, heads · dv], [H] or empty
  bool is_moe = false;
  // SwiGLU with gate/up fused: the dense MLP, or in MoE layers the shared experts (empty when
  // n_shared_experts = 0). [2 · mlp_inter, H], [H, mlp_inter].
  int64_t mlp_inter = 0;
  DeviceBuffer<bf16> w_gate_up, w_down;
  DeviceBuffer<bf16> router;                 // [E, H]
  DeviceBuffer<float> correction_bias;       // [E]
  DeviceBuffer<bf16> experts_gate_up;        // [E, 2 · mi, H] (per expert gate rows, up rows)
  DeviceBuffer<bf16> experts_down;           // [E, H, mi]
};

class DeepseekCore : public RunnerCore {
 public:
  absl::Status Init(const ModelConfig& c, const CudaRunnerOptions& o);
  absl::Status LoadWeights(WeightSource& src);

  absl::Status Enqueue(const DeviceMeta& m, int64_t T, int64_t S, int64_t N,
                       int64_t max_query_len, int64_t max_seq_len, void* workspace) override;
  size_t AttentionWorkspaceBytes(const kernels::PagedAttentionCudaBatch& batch) const override {
    if (options.batch_invariant) {  // absorbed form only (no MHA scratch in the mode)
      return kernels::MlaLatentAttentionInvariantWorkspaceBytes(batch, dims);
    }
    const size_t absorbed = kernels::MlaLatentAttentionCudaWorkspaceBytes(batch, dims);
    if (mha_blocks == 0) return absorbed;
    // The MHA form's split-KV plan depends on the same host bounds (not the block table).
    return std::max(absorbed, kernels::PagedAttentionCudaWorkspaceBytes(batch, MhaParams(),
                                                                        options.attention));
  }
  absl::Status AllocateCache(int64_t blocks) override;
  std::vector<DeviceKvArray> CacheArrays() const override {
    std::vector<DeviceKvArray> arrays;
    const int64_t block_bytes = options.block_size * latent_w * static_cast<int64_t>(sizeof(bf16));
    for (const auto& layer : cache) arrays.push_back({layer.data(), num_blocks, block_bytes});
    return arrays;
  }
  int64_t WeightBytes() const override { return CountWeightBytes(/*active_only=*/false); }
  int64_t ActiveWeightBytes() const override { return CountWeightBytes(/*active_only=*/true); }
  int64_t KvBytesPerToken() const override {
    return config.num_hidden_layers * latent_w * static_cast<int64_t>(sizeof(bf16));
  }
  KvCacheSpec CacheSpec() const override {
    KvCacheSpec spec;
    spec.num_layers = config.num_hidden_layers;
    spec.k_floats_per_token = latent_w;
    spec.v_floats_per_token = 0;
    return spec;
  }

 private:
  absl::Status ValidateConfig() const;
  int64_t CountWeightBytes(bool active_only) const;
  absl::Status LoadLayer(WeightSource& src, int64_t layer, MlaLayer* L);
  absl::Status EnqueueAttention(size_t li, const DeviceMeta& m, int64_t T,
                                const kernels::PagedAttentionCudaBatch& batch, void* workspace);
  absl::Status EnqueueLatentWrite(size_t li, const DeviceMeta& m, int64_t T);
  kernels::PagedAttentionParams MhaParams() const;
  int64_t MhaBlocksPerSeq(const kernels::PagedAttentionCudaBatch& batch) const;
  absl::Status EnqueueMhaAttention(size_t li, int64_t T,
                                   const kernels::PagedAttentionCudaBatch& batch,
                                   int64_t blocks_per_seq, const bf16* q, int64_t q_stride,
                                   void* workspace);
  absl::Status EnqueueMlp(const MlaLayer& L, int64_t T);
  absl::Status EnqueueSwiGlu(const MlaLayer& L, int64_t T, bf16* out);

  // Dims: H hidden, R kv_lora_rank, dn/dr/dv head dims, qk = dn + dr.
  int64_t H = 0, heads = 0, R = 0, dn = 0, dr = 0, dv = 0, qk = 0, q_lora = 0;
  int64_t q_width = 0;   // heads · qk
  int64_t q_first = 0;   // rows of w_a before kv_a_proj_with_mqa's
  int64_t a_width = 0;   // q_first + R + dr
  int64_t latent_w = 0;  // R + dr: one cache row
  int64_t E = 0, top_k = 0, mi = 0, max_mlp_inter = 0;
  float eps = 1e-6f;
  kernels::MlaDims dims;
  kernels::MoeRoutingParams routing;

  std::unique_ptr<BatchedGemm> gemm;
  DeviceBuffer<bf16> embed, final_norm, lm_head;  // lm_head empty when tied
  std::vector<MlaLayer> layers;
  kernels::DeviceRopeTable rope;

  // Activations for up to max_num_tokens tokens.
  DeviceBuffer<bf16> residual, normed, tmp, routed, a_out, q_a_normed, q, latent, q_lat, out_lat,
      attn, gate_up, act;
  DeviceBuffer<float> router_logits, topk_weights;
  DeviceBuffer<int32_t> topk_ids;
  DeviceBuffer<uint8_t> moe_ws;
  // cuBLASLt expert GEMMs of large steps; null when options.moe turns them off or no step
  // reaches their threshold.
  std::unique_ptr<kernels::MoePrefillGemm> moe_prefill;

  // Paged latent cache, per layer [num_blocks, block_size, R + dr] bf16.
  std::vector<DeviceBuffer<bf16>> cache;

  // MLA prefill in the MHA form (options.mla; all empty and mha_blocks 0 when
  // mha_prefill_min_query_len is 0). Scratch of mha_blocks blocks of block_size context rows, shared by
  // the layers: each step lays sequence s's context out in blocks [s·bps, (s + 1)·bps),
  // bps = ⌈max_seq_len / block_size⌉, read through the identity block table mha_table.
  int64_t mha_blocks = 0;
  DeviceBuffer<int32_t> mha_table;  // [mha_blocks]: 0, 1, 2, ...
  // Per context row: kv_c [R], k_pe [dr], kv_b_proj's output [heads, dn + dv], then the
  // attention's K [heads, dn + dr] and V [heads, dv].
  DeviceBuffer<bf16> mha_kv_c, mha_k_pe, mha_kv_up, mha_k, mha_v;
};

absl::Status DeepseekCore::ValidateConfig() const {
  const ModelConfig& c = config;
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("deepseek_v3 config: ", what));
  };
  if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 ||
      c.vocab_size <= 0) {
    return bad("hidden_size, num_hidden_layers, num_attention_heads, vocab_size must be positive");
  }
  if (c.hidden_act != "silu") return bad(absl::StrCat("unsupported hidden_act ", c.hidden_act));
  if (c.kv_lora_rank <= 0 || c.qk_nope_head_dim <= 0 || c.v_head_dim <= 0 ||
      c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0 || c.q_lora_rank < 0) {
    return bad("MLA dims: kv_lora_rank, qk_nope_head_dim, v_head_dim > 0, qk_rope_head_dim > 0 "
               "and even");
  }
  // kernels/mla_attention/mla_attention_cuda.h limits.
  const int64_t width = c.kv_lora_rank + c.qk_rope_head_dim;
  if (c.kv_lora_rank % 2 != 0 || c.kv_lora_rank > 512 || width % 8 != 0 || width > 1024) {
    return bad(absl::StrCat("the CUDA MLA kernel needs kv_lora_rank even and <= 512 and "
                            "kv_lora_rank + qk_rope_head_dim a multiple of 8 and <= 1024 (got ",
                            c.kv_lora_rank, " + ", c.qk_rope_head_dim, ")"));
  }
  if (c.first_k_dense_replace < c.num_hidden_layers) {
    if (c.n_routed_experts <= 0 || c.moe_intermediate_size <= 0 || c.num_experts_per_tok <= 0) {
      return bad("MoE layers need n_routed_experts, moe_intermediate_size, num_experts_per_tok");
    }
    if (c.scoring_func != "sigmoid" && c.scoring_func != "softmax") {
      return bad(absl::StrCat("unsupported scoring_func ", c.scoring_func));
    }
    if (c.n_shared_experts < 0) return bad("n_shared_experts is negative");
    // kernels/moe/moe_cuda.h limits.
    if (c.n_routed_experts > kernels::kMoeCudaMaxExperts || c.hidden_size % 8 != 0 ||
        c.moe_intermediate_size % 8 != 0) {
      return bad(absl::StrCat("the CUDA MoE kernels need n_routed_experts <= ",
                              kernels::kMoeCudaMaxExperts,
                              " and hidden_size, moe_intermediate_size multiples of 8"));
    }
  }
  if (c.first_k_dense_replace > 0 && c.intermediate_size <= 0) {
    return bad("dense layers need intermediate_size");
  }
  return absl::OkStatus();
}

absl::Status DeepseekCore::Init(const ModelConfig& c, const CudaRunnerOptions& o) {
  if (c.architecture != Architecture::kDeepseekV3) {
    return absl::UnimplementedError(absl::StrCat("CUDA DeepSeek runner: architecture ",
                                                 c.architecture_name, " is not DeepSeek-V3"));
  }
  config = c;
  SLUICE_RETURN_IF_ERROR(ValidateConfig());
  if (o.mla.mha_prefill_min_query_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA DeepSeek runner: mla.mha_prefill_min_query_len must be >= 0, got ",
        o.mla.mha_prefill_min_query_len));
  }
  SLUICE_RETURN_IF_ERROR(InitCore(c, o, c.hidden_size));
  H = c.hidden_size;
  heads = c.num_attention_heads;
  R = c.kv_lora_rank;
  dn = c.qk_nope_head_dim;
  dr = c.qk_rope_head_dim;
  dv = c.v_head_dim;
  qk = dn + dr;
  q_lora = c.q_lora_rank;
  q_width = heads * qk;
  q_first = q_lora > 0 ? q_lora : q_width;
  a_width = q_first + R + dr;
  latent_w = R + dr;
  eps = static_cast<float>(c.rms_norm_eps);
  const bool has_moe = c.first_k_dense_replace < c.num_hidden_layers;
  E = has_moe ? c.n_routed_experts : 0;
  top_k = has_moe ? c.num_experts_per_tok : 0;
  mi = has_moe ? c.moe_intermediate_size : 0;
  max_mlp_inter = std::max(c.first_k_dense_replace > 0 ? c.intermediate_size : int64_t{0},
                           has_moe ? mi * c.n_shared_experts : int64_t{0});

  // Softmax scale as deepseek_v3.cc (transformers' DeepseekV3Attention.__init__): qk^-½, times
  // yarn_get_mscale(factor, mscale_all_dim)² = (0.1·mscale_all_dim·ln(factor) + 1)² when rope
  // scaling sets mscale_all_dim (1 when factor <= 1).
  double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (c.rope.rope_type != "default" && c.rope.mscale_all_dim != 0.0) {
    const double ms =
        c.rope.factor <= 1.0 ? 1.0 : 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
    scale *= ms * ms;
  }
  dims = kernels::MlaDims{heads, R, dn, dr, dv, static_cast<float>(scale)};

  if (has_moe) {
    routing.num_experts = E;
    routing.top_k = top_k;
    routing.n_group = c.n_group;
    routing.topk_group = c.topk_group;
    routing.group_score_max = c.moe_group_score_max;
    routing.scoring = c.scoring_func == "softmax" ? kernels::MoeScoring::kSoftmax
                                                  : kernels::MoeScoring::kSigmoid;
    routing.norm_topk_prob = c.norm_topk_prob;
    routing.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
    if (absl::Status s = kernels::ValidateMoeRoutingParams(routing); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("deepseek_v3 config: ", s.message()));
    }
  }

  auto table = MakeModelRopeTable(c, dr);
  if (!table.ok()) return table.status();
  auto dev_table = kernels::UploadRopeTable(*table);
  if (!dev_table.ok()) return dev_table.status();
  rope = std::move(*dev_table);

  auto g = BatchedGemm::Create(stream.get());
  if (!g.ok()) return g.status();
  gemm = std::move(*g);

  const int64_t T = o.max_num_tokens;
  const std::pair<DeviceBuffer<bf16>*, int64_t> acts[] = {
      {&residual, T * H},
      {&normed, T * H},
      {&tmp, T * H},
      {&routed, has_moe ? T * H : 0},
      {&a_out, T * a_width},
      {&q_a_normed, q_lora > 0 ? T * q_lora : 0},
      {&q, q_lora > 0 ? T * q_width : 0},
      {&latent, T * latent_w},
      {&q_lat, T * heads * latent_w},
      {&out_lat, T * heads * R},
      {&attn, T * heads * dv},
      {&gate_up, T * 2 * max_mlp_inter},
      {&act, T * max_mlp_inter}};
  for (const auto& [buf, n] : acts) {
    auto b = AllocBf16(n);
    if (!b.ok()) return b.status();
    *buf = std::move(*b);
  }
  if (has_moe) {
    auto rl = DeviceBuffer<float>::Create(static_cast<size_t>(T * E));
    auto tw = DeviceBuffer<float>::Create(static_cast<size_t>(T * top_k));
    auto ti = DeviceBuffer<int32_t>::Create(static_cast<size_t>(T * top_k));
    auto ws = DeviceBuffer<uint8_t>::Create(kernels::MoeCudaWorkspaceBytes(T, top_k, E, H, mi));
    for (const absl::Status& s : {rl.status(), tw.status(), ti.status(), ws.status()}) {
      if (!s.ok()) return s;
    }
    router_logits = std::move(*rl);
    topk_weights = std::move(*tw);
    topk_ids = std::move(*ti);
    moe_ws = std::move(*ws);
    const int64_t prefill_min = options.moe.prefill_gemm_min_tokens;
    if (prefill_min > 0 && T >= prefill_min) {
      auto g = kernels::MoePrefillGemm::Create(lt.get(), T, top_k, E, H, mi, options.moe);
      if (!g.ok()) return g.status();
      moe_prefill = std::move(*g);
    }
  }
  if (options.mla.mha_prefill_min_query_len > 0) {
    // Room for the longest sequence plus a full chunk of other sequences' rows.
    const int64_t bs = o.block_size;
    mha_blocks = (T + bs - 1) / bs + max_blocks_per_seq;
    const int64_t rows = mha_blocks * bs;
    const std::pair<DeviceBuffer<bf16>*, int64_t> scratch[] = {
        {&mha_kv_c, rows * R},
        {&mha_k_pe, rows * dr},
        {&mha_kv_up, rows * heads * (dn + dv)},
        {&mha_k, rows * heads * qk},
        {&mha_v, rows * heads * dv}};
    for (const auto& [buf, n] : scratch) {
      auto b = AllocBf16(n);
      if (!b.ok()) return b.status();
      *buf = std::move(*b);
    }
    std::vector<int32_t> iota(static_cast<size_t>(mha_blocks));
    for (size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<int32_t>(i);
    auto table = DeviceBuffer<int32_t>::Create(iota.size());
    if (!table.ok()) return table.status();
    mha_table = std::move(*table);
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpy(mha_table.data(), iota.data(),
                                           iota.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                                "cudaMemcpy mha_table");
  }
  return absl::OkStatus();
}

absl::Status DeepseekCore::LoadLayer(WeightSource& src, int64_t layer, MlaLayer* L) {
  const ModelConfig& c = config;
  cudaStream_t st = stream.get();
  const std::string p = LayerPrefix(layer);
  const std::string a = p + "self_attn.";
  auto alloc_fill = [&](DeviceBuffer<bf16>* buf, const std::string& name,
                        std::vector<int64_t> shape, DummyInit init) {
    return AllocFill(src, buf, name, shape, init, st);
  };
  SLUICE_RETURN_IF_ERROR(
      alloc_fill(&L->input_norm, p + "input_layernorm.weight", {H}, DummyInit::kOnes));
  SLUICE_RETURN_IF_ERROR(
      alloc_fill(&L->post_norm, p + "post_attention_layernorm.weight", {H}, DummyInit::kOnes));
  const std::string q_name = q_lora > 0 ? "q_a_proj" : "q_proj";
  SLUICE_RETURN_IF_ERROR(AllocFillFused(
      src, &L->w_a, {{a + q_name + ".weight", q_first}, {a + "kv_a_proj_with_mqa.weight", R + dr}},
      H, DummyInit::kNormal, st));
  if (c.attention_bias) {
    // transformers: q_a_proj and kv_a_proj_with_mqa carry the bias; q_proj has none (zeros).
    if (q_lora > 0) {
      SLUICE_RETURN_IF_ERROR(AllocFillFused(
          src, &L->b_a, {{a + "q_a_proj.bias", q_lora}, {a + "kv_a_proj_with_mqa.bias", R + dr}}, 1,
          DummyInit::kZeros, st));
    } else {
      auto b = AllocBf16(a_width);
      if (!b.ok()) return b.status();
      L->b_a = std::move(*b);
      SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(L->b_a.data(), 0, L->b_a.bytes()), "cudaMemset");
      SLUICE_RETURN_IF_ERROR(src.Fill(a + "kv_a_proj_with_mqa.bias", {R + dr}, DummyInit::kZeros,
                                      L->b_a.data() + q_first, st));
    }
    SLUICE_RETURN_IF_ERROR(alloc_fill(&L->o_bias, a + "o_proj.bias", {H}, DummyInit::kZeros));
  }
  if (q_lora > 0) {
    SLUICE_RETURN_IF_ERROR(
        alloc_fill(&L->q_a_norm, a + "q_a_layernorm.weight", {q_lora}, DummyInit::kOnes));
    SLUICE_RETURN_IF_ERROR(
        alloc_fill(&L->q_b, a + "q_b_proj.weight", {q_width, q_lora}, DummyInit::kNormal));
  }
  SLUICE_RETURN_IF_ERROR(
      alloc_fill(&L->kv_a_norm, a + "kv_a_layernorm.weight", {R}, DummyInit::kOnes));
  SLUICE_RETURN_IF_ERROR(
      alloc_fill(&L->kv_b, a + "kv_b_proj.weight", {heads * (dn + dv), R}, DummyInit::kNormal));
  SLUICE_RETURN_IF_ERROR(
      alloc_fill(&L->o_proj, a + "o_proj.weight", {H, heads * dv}, DummyInit::kNormal));

  L->is_moe = layer >= c.first_k_dense_replace;
  auto swiglu = [&](const std::string& prefix, int64_t inter) -> absl::Status {
    L->mlp_inter = inter;
    const std::vector<WeightPart> gate_up = {{prefix + "gate_proj.weight", inter},
                                             {prefix + "up_proj.weight", inter}};
    SLUICE_RETURN_IF_ERROR(AllocFillFused(src, &L->w_gate_up, gate_up, H, DummyInit::kNormal, st));
    return alloc_fill(&L->w_down, prefix + "down_proj.weight", {H, inter}, DummyInit::kNormal);
  };
  if (!L->is_moe) return swiglu(p + "mlp.", c.intermediate_size);

  SLUICE_RETURN_IF_ERROR(alloc_fill(&L->router, p + "mlp.gate.weight", {E, H}, DummyInit::kNormal));
  auto bias = DeviceBuffer<float>::Create(static_cast<size_t>(E));
  if (!bias.ok()) return bias.status();
  L->correction_bias = std::move(*bias);
  if (c.has_score_correction_bias) {
    SLUICE_RETURN_IF_ERROR(src.FillFloat(p + "mlp.gate.e_score_correction_bias", {E},
                                         DummyInit::kZeros, L->correction_bias.data()));
  } else {  // DeepSeek-V2: routed as with a zero bias
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(L->correction_bias.data(), 0, L->correction_bias.bytes()),
                                "cudaMemset correction bias");
  }
  auto gu = AllocBf16(E * 2 * mi * H);
  auto dn_buf = AllocBf16(E * H * mi);
  if (!gu.ok()) return gu.status();
  if (!dn_buf.ok()) return dn_buf.status();
  L->experts_gate_up = std::move(*gu);
  L->experts_down = std::move(*dn_buf);
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = absl::StrCat(p, "mlp.experts.", e, ".");
    bf16* gate = L->experts_gate_up.data() + e * 2 * mi * H;
    SLUICE_RETURN_IF_ERROR(src.Fill(x + "gate_proj.weight", {mi, H}, DummyInit::kNormal, gate, st));
    SLUICE_RETURN_IF_ERROR(
        src.Fill(x + "up_proj.weight", {mi, H}, DummyInit::kNormal, gate + mi * H, st));
    SLUICE_RETURN_IF_ERROR(src.Fill(x + "down_proj.weight", {H, mi}, DummyInit::kNormal,
                                    L->experts_down.data() + e * H * mi, st));
  }
  if (c.n_shared_experts > 0) {
    SLUICE_RETURN_IF_ERROR(swiglu(p + "mlp.shared_experts.", mi * c.n_shared_experts));
  }
  return absl::OkStatus();
}

absl::Status DeepseekCore::LoadWeights(WeightSource& src) {
  const ModelConfig& c = config;
  cudaStream_t st = stream.get();
  const int64_t vocab_rows = vocab;
  SLUICE_RETURN_IF_ERROR(
      AllocFill(src, &embed, "model.embed_tokens.weight", {vocab_rows, H}, DummyInit::kNormal, st));
  SLUICE_RETURN_IF_ERROR(
      AllocFill(src, &final_norm, "model.norm.weight", {H}, DummyInit::kOnes, st));
  if (!c.tie_word_embeddings) {
    SLUICE_RETURN_IF_ERROR(
        AllocFill(src, &lm_head, "lm_head.weight", {vocab_rows, H}, DummyInit::kNormal, st));
  }
  layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    SLUICE_RETURN_IF_ERROR(LoadLayer(src, l, &layers[static_cast<size_t>(l)]));
  }
  return stream.Synchronize();
}

int64_t DeepseekCore::CountWeightBytes(bool active_only) const {
  // One embedding row, the final norm, the head (the embedding when tied).
  int64_t elems = H + static_cast<int64_t>(final_norm.size()) +
                  static_cast<int64_t>(lm_head.size() != 0 ? lm_head.size() : embed.size());
  int64_t bytes = 0;
  for (const MlaLayer& L : layers) {
    for (const auto* b : {&L.input_norm, &L.post_norm, &L.w_a, &L.b_a, &L.q_a_norm, &L.q_b,
                          &L.kv_a_norm, &L.kv_b, &L.o_proj, &L.o_bias, &L.w_gate_up, &L.w_down,
                          &L.router}) {
      elems += static_cast<int64_t>(b->size());
    }
    bytes += static_cast<int64_t>(L.correction_bias.bytes());
    const int64_t experts =
        static_cast<int64_t>(L.experts_gate_up.size() + L.experts_down.size());
    // A batch-1 step reads num_experts_per_tok of the E routed experts.
    elems += active_only && E > 0 ? experts / E * top_k : experts;
  }
  return bytes + elems * static_cast<int64_t>(sizeof(bf16));
}

absl::Status DeepseekCore::AllocateCache(int64_t blocks) {
  cache.clear();
  const int64_t elems = blocks * options.block_size * latent_w;
  for (size_t l = 0; l < layers.size(); ++l) {
    auto b = AllocBf16(elems);
    if (!b.ok()) return b.status();
    // Zeroed so inert padding rows (which read block 0) only ever see finite values.
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(b->data(), 0, b->bytes()), "cudaMemset KV");
    cache.push_back(std::move(*b));
  }
  return absl::OkStatus();
}

// EnqueueAttention reads `normed` and writes o_proj's output to `tmp`.
absl::Status DeepseekCore::EnqueueAttention(size_t li, const DeviceMeta& m, int64_t T,
                                            const kernels::PagedAttentionCudaBatch& batch,
                                            void* workspace) {
  const MlaLayer& L = layers[li];
  cudaStream_t st = stream.get();
  SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(*lt, normed.data(), L.w_a.data(), L.b_a.data(),
                                             a_out.data(), T, a_width, H, st));
  Mark("a_gemm");
  // Query rows: q_b_proj(q_a_layernorm(q_a)), or q_proj's rows of the fused output.
  const bf16* q_src = a_out.data();
  int64_t q_stride = a_width;
  if (q_lora > 0) {
    SLUICE_RETURN_IF_ERROR(kernels::RmsNormCuda(a_out.data(), a_width, L.q_a_norm.data(),
                                                q_a_normed.data(), q_lora, T, q_lora, eps, st,
                                                pdl.common));
    SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(*lt, q_a_normed.data(), L.q_b.data(), nullptr,
                                               q.data(), T, q_width, q_lora, st));
    q_src = q.data();
    q_stride = q_width;
    Mark("q_b_gemm");
  }
  const int64_t q_lat_stride = heads * latent_w;
  // Large steps (options.mla): the MHA form (EnqueueMhaAttention).
  const int64_t mha_bps = MhaBlocksPerSeq(batch);
  const bool mha = mha_bps > 0;
  // The latent cache row and the queries' rope channels in one launch (MlaPrologueCuda) when
  // the rope covers the whole rope head dim (else separate norm, copy, rope and cache write).
  const bool fused_prologue = rope.rotary_dim == dr;
  // At decode sizes a GEMV kernel instead of cuBLAS's batched GEMM for the absorbed queries,
  // with the prologue in the same launch (MlaPrologueAbsorbCuda).
  // Batch-invariant mode: the same per-head kernels (HeadGemmInvariantCuda) and attention
  // (MlaLatentAttentionInvariantCuda) at every step size (mla_invariant_cuda.h).
  const bool invariant = options.batch_invariant;
  const bool absorb_gemv =
      !invariant && !mha && fused_prologue && T <= kMlaAbsorbMaxTokens && R % 8 == 0;
  const bool merged = absorb_gemv;
  MlaPrologueArgs pa;
  if (fused_prologue) {
    pa.kv = a_out.data() + q_first;
    pa.kv_stride = a_width;
    pa.kv_norm = L.kv_a_norm.data();
    pa.eps = eps;
    pa.q_pe = q_src + dn;
    pa.q_token_stride = q_stride;
    pa.q_head_stride = qk;
    pa.q_out = q_lat.data() + R;
    pa.q_out_token_stride = q_lat_stride;
    pa.q_out_head_stride = latent_w;
    pa.heads = mha ? 0 : heads;  // the MHA form rotates its queries in place below
    pa.R = R;
    pa.dr = dr;
    pa.positions = m.positions;
    pa.slots = m.slots;
    pa.inv_freq = rope.inv_freq.data();
    pa.scaling = rope.attention_scaling;
    pa.interleave = config.rope_interleave;
    pa.cache = cache[li].data();
    if (!merged) {
      SLUICE_RETURN_IF_ERROR(MlaPrologueCuda(pa, T, st, pdl.mla));
      Mark("latent_write");
    }
  } else {
    SLUICE_RETURN_IF_ERROR(EnqueueLatentWrite(li, m, T));
  }
  // Absorbed query per head h: q_lat[t, h, :R] = q_nope[t, h] · W_UK_h (W_UK_h: rows [dn, R]
  // of kv_b), q_lat[t, h, R:] = rope(q_pe[t, h]).
  if (merged) {
    SLUICE_RETURN_IF_ERROR(MlaPrologueAbsorbCuda(pa, q_src, q_stride, qk, L.kv_b.data(),
                                                 (dn + dv) * R, q_lat.data(), q_lat_stride,
                                                 latent_w, T, heads, dn, R, st, pdl.mla_bits));
  } else if (absorb_gemv) {
    SLUICE_RETURN_IF_ERROR(MlaAbsorbQueryCuda(q_src, q_stride, qk, L.kv_b.data(), (dn + dv) * R,
                                              q_lat.data(), q_lat_stride, latent_w, T, heads, dn, R,
                                              st, pdl.mla));
  } else if (!mha && invariant) {
    // W_UK_h as [k = dn, n = R] rows of kv_b.
    SLUICE_RETURN_IF_ERROR(kernels::HeadGemmInvariantCuda(
        q_src, q_stride, qk, L.kv_b.data(), (dn + dv) * R, 1, R, q_lat.data(), q_lat_stride,
        latent_w, T, heads, R, dn, st));
  } else if (!mha) {
    SLUICE_RETURN_IF_ERROR(gemm->Run({q_src, q_stride, qk}, {L.kv_b.data(), R, (dn + dv) * R},
                                     /*w_is_kn=*/true, {q_lat.data(), q_lat_stride, latent_w},
                                     /*y_float=*/false, T, R, dn, heads));
  }
  if (!fused_prologue && !mha) {
    SLUICE_RETURN_IF_ERROR(CopyHeadsCuda(q_src + dn, {q_stride, qk}, q_lat.data() + R,
                                         {q_lat_stride, latent_w}, T, heads, dr, st, pdl.mla));
    SLUICE_RETURN_IF_ERROR(kernels::RopeCuda(q_lat.data(), T, heads, q_lat_stride, latent_w, R,
                                             m.positions, rope, config.rope_interleave, st,
                                             pdl.common));
  }
  // The MHA form's queries [T, heads, dn + dr] are the query projection's rows themselves
  // (q_src: q or a_out, this layer's scratch) with q_pe rotated in place.
  bf16* const q_rows = q_lora > 0 ? q.data() : a_out.data();
  if (mha) {
    SLUICE_RETURN_IF_ERROR(kernels::RopeCuda(q_rows, T, heads, q_stride, qk, dn, m.positions, rope,
                                             config.rope_interleave, st, pdl.common));
    Mark("q_rope");
  } else {
    Mark("q_absorb");
  }
  // attn[t, h, :] = W_UV_h · out_lat[t, h] (W_UV_h: rows [dv, R] of kv_b after W_UK_h).
  if (mha) {
    SLUICE_RETURN_IF_ERROR(EnqueueMhaAttention(li, T, batch, mha_bps, q_rows, q_stride, workspace));
  } else if (invariant) {
    SLUICE_RETURN_IF_ERROR(kernels::MlaLatentAttentionInvariantCuda(
        q_lat.data(), q_lat_stride, cache[li].data(), options.block_size, batch, dims, workspace,
        out_lat.data(), st));
    Mark("attention");
    // W_UV_h as [n = dv, k = R] rows of kv_b after W_UK_h.
    SLUICE_RETURN_IF_ERROR(kernels::HeadGemmInvariantCuda(
        out_lat.data(), heads * R, R, L.kv_b.data() + dn * R, (dn + dv) * R, R, 1, attn.data(),
        heads * dv, dv, T, heads, dv, R, st));
    Mark("v_up");
  } else if (T <= kMlaAbsorbMaxTokens) {
    // The split-KV combine and W_UV in one launch after the attention kernel.
    SLUICE_RETURN_IF_ERROR(kernels::MlaLatentAttentionVUpCuda(
        q_lat.data(), q_lat_stride, cache[li].data(), options.block_size, batch, dims, workspace,
        out_lat.data(), L.kv_b.data() + dn * R, (dn + dv) * R, dv, attn.data(), heads * dv, st,
        pdl.mla_bits));
    Mark("attention_v_up");
  } else {
    SLUICE_RETURN_IF_ERROR(kernels::MlaLatentAttentionCuda(
        q_lat.data(), q_lat_stride, cache[li].data(), options.block_size, batch, dims, workspace,
        out_lat.data(), st));
    Mark("attention");
    SLUICE_RETURN_IF_ERROR(gemm->Run({out_lat.data(), heads * R, R},
                                     {L.kv_b.data() + dn * R, R, (dn + dv) * R},
                                     /*w_is_kn=*/false, {attn.data(), heads * dv, dv},
                                     /*y_float=*/false, T, dv, R, heads));
    Mark("v_up");
  }
  SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(*lt, attn.data(), L.o_proj.data(), L.o_bias.data(),
                                             tmp.data(), T, H, heads * dv, st));
  Mark("o_gemm");
  return absl::OkStatus();
}

kernels::PagedAttentionParams DeepseekCore::MhaParams() const {
  kernels::PagedAttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = heads;
  p.head_dim = qk;
  p.v_head_dim = dv;
  p.block_size = options.block_size;
  p.scale = dims.softmax_scale;  // the absorbed kernel's: the same scores, factored otherwise
  return p;
}

// MhaBlocksPerSeq: the scratch blocks per sequence of a step that takes the MHA form, or 0
// when it stays absorbed (mode off or no scratch, queries below the threshold, contexts too
// long for the scratch).
int64_t DeepseekCore::MhaBlocksPerSeq(const kernels::PagedAttentionCudaBatch& batch) const {
  const int64_t min_q = options.mla.mha_prefill_min_query_len;
  if (mha_blocks == 0 || min_q == 0 || batch.max_query_len < min_q) return 0;
  const int64_t bps = (batch.max_seq_len + options.block_size - 1) / options.block_size;
  return bps > 0 && batch.num_sequences * bps <= mha_blocks ? bps : 0;
}

// EnqueueMhaAttention: MLA attention of a large step in the MHA form, after the prologue has
// written this step's latent rows; q: the queries [T, heads, dn + dr] (q_nope, rotated q_pe)
// at row stride q_stride.
// Every sequence's whole context (cached prefix + new tokens) is up-projected:
//   k[c, h] = [W_UK_h · kv_c[c] ; k_pe[c]],  v[c, h] = W_UV_h · kv_c[c]
// and attn = softmax(scale · [q_nope ; q_pe] · kᵀ) · v per head, causal over (context_lens,
// query_start_loc), which equals the absorbed form's W_UV_h · (softmax(scale · (q_nope·W_UK_h ·
// kv_cᵀ + q_pe · k_peᵀ)) · kv_c) up to where bf16 rounds (transformers' DeepseekV3Attention
// computes this form). Writes attn [T, heads, dv] (o_proj's input).
absl::Status DeepseekCore::EnqueueMhaAttention(size_t li, int64_t T,
                                               const kernels::PagedAttentionCudaBatch& batch,
                                               int64_t blocks_per_seq, const bf16* q,
                                               int64_t q_stride, void* workspace) {
  const MlaLayer& L = layers[li];
  cudaStream_t st = stream.get();
  const int64_t bs = options.block_size;
  const int64_t rows_per_seq = blocks_per_seq * bs;
  const int64_t C = batch.num_sequences * rows_per_seq;
  SLUICE_RETURN_IF_ERROR(MlaGatherLatentCuda(cache[li].data(), R, dr, batch.context_lens,
                                             batch.query_start_loc, batch.block_tables,
                                             batch.max_blocks_per_seq, bs, batch.num_sequences,
                                             rows_per_seq, mha_kv_c.data(), mha_k_pe.data(), st));
  Mark("mha_gather");
  // kv_b_proj over every context row: [C, R] · [heads · (dn + dv), R]ᵀ.
  SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(*lt, mha_kv_c.data(), L.kv_b.data(), nullptr,
                                             mha_kv_up.data(), C, heads * (dn + dv), R, st));
  Mark("kv_b_gemm");
  SLUICE_RETURN_IF_ERROR(MlaAssembleKvCuda(mha_kv_up.data(), mha_k_pe.data(), C, heads, dn, dr, dv,
                                           mha_k.data(), mha_v.data(), st));
  Mark("mha_kv");
  kernels::PagedAttentionCudaBatch mb = batch;
  mb.block_tables = mha_table.data();
  mb.max_blocks_per_seq = blocks_per_seq;
  SLUICE_RETURN_IF_ERROR(kernels::PagedAttentionCuda(q, q_stride, mha_k.data(), mha_v.data(), mb,
                                                     MhaParams(), workspace, attn.data(), st,
                                                     options.attention));
  Mark("attention");
  return absl::OkStatus();
}

// EnqueueLatentWrite: token rows [kv_a_layernorm(c_kv) ; rope(k_pe)] of `a_out` into the
// layer's latent cache, through `latent` (the separate-launch path).
absl::Status DeepseekCore::EnqueueLatentWrite(size_t li, const DeviceMeta& m, int64_t T) {
  const MlaLayer& L = layers[li];
  cudaStream_t st = stream.get();
  SLUICE_RETURN_IF_ERROR(kernels::RmsNormCuda(a_out.data() + q_first, a_width, L.kv_a_norm.data(),
                                              latent.data(), latent_w, T, R, eps, st, pdl.common));
  SLUICE_RETURN_IF_ERROR(CopyHeadsCuda(a_out.data() + q_first + R, {a_width, 0}, latent.data() + R,
                                       {latent_w, 0}, T, 1, dr, st, pdl.mla));
  SLUICE_RETURN_IF_ERROR(kernels::RopeCuda(latent.data(), T, 1, latent_w, latent_w, R, m.positions,
                                           rope, config.rope_interleave, st, pdl.common));
  SLUICE_RETURN_IF_ERROR(kernels::WriteKvCacheCuda(latent.data(), latent_w, nullptr, 0, m.slots, T,
                                                   latent_w, 0, cache[li].data(), nullptr, st));
  Mark("latent_write");
  return absl::OkStatus();
}

// EnqueueSwiGlu: out = down(silu(gate(normed)) · up(normed)) with L's dense / shared weights.
absl::Status DeepseekCore::EnqueueSwiGlu(const MlaLayer& L, int64_t T, bf16* out) {
  cudaStream_t st = stream.get();
  // gate/up GEMM and SiLU·mul: one kernel when the tuned plan is a GEMV (decode; bit-equal),
  // else the GEMM into gate_up and SiLU·mul after it.
  SLUICE_RETURN_IF_ERROR(kernels::LinearSiluMulCuda(*lt, normed.data(), L.w_gate_up.data(), nullptr,
                                                    gate_up.data(), act.data(), T, L.mlp_inter, H,
                                                    st));
  Mark("gate_up_silu_mul");
  SLUICE_RETURN_IF_ERROR(
      kernels::LinearCuda(*lt, act.data(), L.w_down.data(), nullptr, out, T, H, L.mlp_inter, st));
  Mark("down_gemm");
  return absl::OkStatus();
}

// EnqueueMlp reads `normed` and writes the MLP output to `tmp`.
absl::Status DeepseekCore::EnqueueMlp(const MlaLayer& L, int64_t T) {
  cudaStream_t st = stream.get();
  if (!L.is_moe) return EnqueueSwiGlu(L, T, tmp.data());
  const bool shared = L.w_gate_up.size() != 0;
  const kernels::MoeCudaWorkspace ws{moe_ws.data(), moe_ws.bytes(), moe_prefill.get()};
  // Batch-invariant mode: the grouped experts at every step size (each expert row's sums in a
  // fixed k order whatever the rows around it; moe_cuda.h), never the token-count-chosen paths.
  const bool invariant = options.batch_invariant;
  if (!invariant && kernels::MoeFusedDecodeSupported(T, routing)) {
    // Fused decode path: routing + sort over many blocks, which also compute the shared experts'
    // gate/up while the routing waits for its last block, then the routed experts' gate/up and
    // down + combine, the shared experts' down folded into them (same bits as the separate
    // launches below, except the shared experts' SwiGLU, whose GEMV sums differ from cuBLAS's).
    const kernels::MoeSharedExpert shared_expert{L.w_gate_up.data(), L.w_down.data(),
                                                 L.mlp_inter, act.data(), /*act_ready=*/true};
    const kernels::MoeSharedExpert* const shared_ptr = shared ? &shared_expert : nullptr;
    SLUICE_RETURN_IF_ERROR(kernels::MoeFusedRouteCuda(normed.data(), L.router.data(),
                                                      L.correction_bias.data(), T, H, routing,
                                                      topk_ids.data(), topk_weights.data(), ws, st,
                                                      shared_ptr, pdl.moe));
    Mark("routing");
    SLUICE_RETURN_IF_ERROR(kernels::MoeFusedExpertsCuda(
        normed.data(), topk_weights.data(), T, H, mi, top_k, E, L.experts_gate_up.data(),
        L.experts_down.data(), /*add=*/nullptr, tmp.data(), ws, st, shared_ptr, pdl.moe));
    Mark("experts");
    return absl::OkStatus();
  }
  // Router logits in fp32 (transformers upcasts the router to float32 as well).
  SLUICE_RETURN_IF_ERROR(kernels::MoeRouterLogitsCuda(normed.data(), L.router.data(), T, H, E,
                                                      router_logits.data(), st));
  SLUICE_RETURN_IF_ERROR(kernels::MoeRoutingCuda(static_cast<const float*>(router_logits.data()),
                                                 L.correction_bias.data(), T, routing,
                                                 topk_ids.data(), topk_weights.data(), st));
  Mark("routing");
  // Without shared experts the routed output is the MLP output.
  bf16* routed_out = shared ? routed.data() : tmp.data();
  SLUICE_RETURN_IF_ERROR(kernels::MoeExpertsCuda(
      normed.data(), topk_ids.data(), topk_weights.data(), T, H, mi, top_k, E,
      L.experts_gate_up.data(), L.experts_down.data(), routed_out, ws, st,
      invariant ? kernels::MoeExpertsPath::kGrouped : kernels::MoeExpertsPath::kAuto));
  Mark("experts");
  if (!shared) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(EnqueueSwiGlu(L, T, tmp.data()));
  // transformers: moe(hidden) + shared_experts(residuals).
  SLUICE_RETURN_IF_ERROR(AddInPlaceCuda(tmp.data(), routed.data(), T * H, st, pdl.mla));
  Mark("moe_add");
  return absl::OkStatus();
}

absl::Status DeepseekCore::Enqueue(const DeviceMeta& m, int64_t T, int64_t S, int64_t N,
                                   int64_t max_query_len, int64_t max_seq_len, void* workspace) {
  cudaStream_t st = stream.get();
  const kernels::PagedAttentionCudaBatch batch = AttnBatch(m, T, S, max_query_len, max_seq_len);
  bf16* res = residual.data();
  SLUICE_RETURN_IF_ERROR(EnqueueEmbedding(m, T, embed.data(), res));
  for (size_t li = 0; li < layers.size(); ++li) {
    const MlaLayer& L = layers[li];
    // Pre-attention norm; from layer 1 on fused with the previous MLP's residual add.
    if (li == 0) {
      SLUICE_RETURN_IF_ERROR(kernels::RmsNormCuda(res, H, L.input_norm.data(), normed.data(), H,
                                                  T, H, eps, st, pdl.common));
    } else {
      SLUICE_RETURN_IF_ERROR(kernels::AddRmsNormCuda(tmp.data(), res, L.input_norm.data(),
                                                     normed.data(), T, H, eps, st, pdl.common));
    }
    Mark("add_rmsnorm");
    SLUICE_RETURN_IF_ERROR(EnqueueAttention(li, m, T, batch, workspace));
    SLUICE_RETURN_IF_ERROR(LayerKvWritten(static_cast<int32_t>(li)));  // layerwise KV push
    SLUICE_RETURN_IF_ERROR(
        kernels::AddRmsNormCuda(tmp.data(), res, L.post_norm.data(), normed.data(), T, H, eps, st,
                                pdl.common));
    Mark("add_rmsnorm");
    SLUICE_RETURN_IF_ERROR(EnqueueMlp(L, T));
  }
  const bf16* head = lm_head.data() != nullptr ? lm_head.data() : embed.data();
  return EnqueueLogits(m, T, N, tmp.data(), res, final_norm.data(), eps, normed.data(), head);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDeepseekRunner>> CudaDeepseekRunner::Load(
    const std::string& dir, const CudaRunnerOptions& options) {
  auto core = LoadCore<DeepseekCore>(dir, options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<CudaDeepseekRunner>(new CudaDeepseekRunner(std::move(*core)));
}

absl::StatusOr<std::unique_ptr<CudaDeepseekRunner>> CudaDeepseekRunner::CreateDummy(
    const ModelConfig& config, uint64_t seed, const CudaRunnerOptions& options) {
  auto core = DummyCore<DeepseekCore>(config, seed, options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<CudaDeepseekRunner>(new CudaDeepseekRunner(std::move(*core)));
}

}  // namespace sluice::cuda_runner
