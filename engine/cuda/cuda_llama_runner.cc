#include "engine/cuda/cuda_llama_runner.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/runner_core.h"
#include "engine/cuda/runner_kernels.h"
#include "engine/model/rope_config.h"
#include "engine/model/weight_loader.h"
#include "kernels/attention/paged_attention_bounded_cuda.h"
#include "kernels/rms_norm/rms_norm_cuda.h"
#include "kernels/rope/rope_cuda.h"

namespace sluice::cuda_runner {
namespace {

// One decoder layer on the device; q/k/v and gate/up are fused row-wise (one GEMM each).
struct DeviceLayer {
  DeviceBuffer<bf16> input_norm, post_norm;  // [H]
  DeviceBuffer<bf16> w_qkv, b_qkv;           // [(nh + 2 nkv) hd, H], [..] or empty
  DeviceBuffer<bf16> w_o, b_o;               // [H, nh hd], [H] or empty
  DeviceBuffer<bf16> w_gate_up, b_gate_up;   // [2 I, H], [2 I] or empty
  DeviceBuffer<bf16> w_down, b_down;         // [H, I], [H] or empty
  DeviceBuffer<bf16> q_norm, k_norm;         // [hd] each (Qwen3) or empty
  int64_t sliding_window = 0;                // 0: full attention
};

// ShardSource: this tensor-parallel rank's block of each split tensor of another source. The
// whole tensor is filled into scratch memory first and the block copied out, so a shard holds
// exactly the values of the matching slice of the TP=1 model (the dummy rule seeds each tensor
// by name and numbers its elements in the full shape; checkpoints store the full tensor).
class ShardSource : public WeightSource {
 public:
  // The block of a [full_rows, full_cols] tensor (vectors: full_cols 1) starting at (row0, col0);
  // its extent is the shape Fill is asked for.
  struct Block {
    int64_t full_rows = 0, full_cols = 1, row0 = 0, col0 = 0;
  };
  explicit ShardSource(WeightSource& inner) : inner_(inner) {}
  void Split(const std::string& name, Block block) { blocks_[name] = block; }

  absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape,
                    DummyInit dummy_init, bf16* dst, cudaStream_t stream) override {
    auto it = blocks_.find(name);
    if (it == blocks_.end()) return inner_.Fill(name, shape, dummy_init, dst, stream);
    const Block& b = it->second;
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const int64_t cols = shape.size() > 1 ? shape[1] : 1;
    if (shape.size() > 2 || b.row0 + rows > b.full_rows || b.col0 + cols > b.full_cols) {
      return absl::InternalError(absl::StrCat("TP shard of ", name, " outside the tensor"));
    }
    auto full = AllocBf16(b.full_rows * b.full_cols);
    if (!full.ok()) return full.status();
    const std::vector<int64_t> full_shape = shape.size() > 1
                                                ? std::vector<int64_t>{b.full_rows, b.full_cols}
                                                : std::vector<int64_t>{b.full_rows};
    SLUICE_RETURN_IF_ERROR(inner_.Fill(name, full_shape, dummy_init, full->data(), stream));
    const size_t e = sizeof(bf16);
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy2DAsync(dst, static_cast<size_t>(cols) * e,
                          full->data() + b.row0 * b.full_cols + b.col0,
                          static_cast<size_t>(b.full_cols) * e, static_cast<size_t>(cols) * e,
                          static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpy2DAsync TP shard");
    // The scratch is freed on return.
    SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return absl::OkStatus();
  }
  absl::Status FillFloat(const std::string& name, const std::vector<int64_t>& shape,
                         DummyInit dummy_init, float* dst) override {
    if (blocks_.count(name) > 0) {
      return absl::UnimplementedError(absl::StrCat("TP shard of float tensor ", name));
    }
    return inner_.FillFloat(name, shape, dummy_init, dst);
  }
  bool Contains(const std::string& name) const override { return inner_.Contains(name); }

 private:
  WeightSource& inner_;
  std::map<std::string, Block> blocks_;
};

class LlamaCore : public RunnerCore {
 public:
  absl::Status Init(const ModelConfig& c, const CudaRunnerOptions& o);
  absl::Status LoadWeights(WeightSource& src);

  absl::Status Enqueue(const DeviceMeta& m, int64_t T, int64_t S, int64_t N,
                       int64_t max_query_len, int64_t max_seq_len, void* workspace) override;
  // The split-KV plan (and so the scratch) depends on the window: the larger of the full and
  // the sliding layers' needs.
  size_t AttentionWorkspaceBytes(const kernels::PagedAttentionCudaBatch& batch) const override {
    size_t bytes = kernels::PagedAttentionCudaWorkspaceBytes(batch, attn_params, options.attention);
    if (config.sliding_window > 0) {
      kernels::PagedAttentionParams sliding = attn_params;
      sliding.sliding_window = config.sliding_window;
      bytes = std::max(bytes,
                       kernels::PagedAttentionCudaWorkspaceBytes(batch, sliding, options.attention));
    }
    return bytes;
  }
  absl::Status AllocateCache(int64_t blocks) override;
  bool SupportsSwaReplay() const override { return true; }
  // LLaVA's language model: image features replace the placeholder tokens' embeddings.
  bool SupportsInputEmbeddings() const override { return true; }
  std::vector<DeviceKvArray> CacheArrays() const override {
    std::vector<DeviceKvArray> arrays;
    const int64_t block_bytes = options.block_size * kv_dim * static_cast<int64_t>(sizeof(bf16));
    for (size_t l = 0; l < k_cache.size(); ++l) {
      for (const auto* cache : {&k_cache, &v_cache}) {
        arrays.push_back({(*cache)[l].data(), num_blocks, block_bytes});
      }
    }
    return arrays;
  }
  int64_t WeightBytes() const override;
  int64_t KvBytesPerToken() const override { return config.num_hidden_layers * 2 * kv_dim * 2; }
  KvCacheSpec CacheSpec() const override {
    KvCacheSpec spec;
    spec.num_layers = config.num_hidden_layers;
    spec.k_floats_per_token = kv_dim;
    spec.v_floats_per_token = kv_dim;
    return spec;
  }

 private:
  // Sums this rank's partial o_proj / down_proj output over the TP ranks (nothing at tp 1).
  absl::Status TpAllReduce(bf16* data, int64_t count) {
    if (options.tp_size == 1) return absl::OkStatus();
    SLUICE_RETURN_IF_ERROR(options.tp_all_reduce(data, count, stream.get()));
    Mark("tp_all_reduce");
    return absl::OkStatus();
  }

  // The checkpoint name of Hugging Face Llama name `hf`: "model.*" under model_prefix, the
  // head under lm_head_name (LlavaForConditionalGeneration nests the language model; the CPU
  // loader, engine/model/llama.cc, reads the same layouts).
  std::string Name(const std::string& hf) const {
    if (hf.rfind("model.", 0) == 0) return model_prefix + hf.substr(6);
    return hf == "lm_head.weight" ? lm_head_name : hf;
  }
  std::string model_prefix = "model.";
  std::string lm_head_name = "lm_head.weight";
  // This rank's heads, KV heads and intermediate channels (tp_size divides the model's).
  int64_t H = 0, heads = 0, kv_heads = 0, hd = 0, inter = 0;
  int64_t q_dim = 0, kv_dim = 0, qkv_dim = 0;
  float eps = 1e-6f;
  DeviceBuffer<bf16> embed, final_norm, lm_head;  // lm_head empty when tied
  std::vector<DeviceLayer> layers;
  kernels::DeviceRopeTable rope;
  kernels::PagedAttentionParams attn_params;
  // A step's activation buffers, each for `rows` tokens.
  struct Activations {
    bf16 *residual = nullptr, *normed = nullptr, *tmp = nullptr,
         *qkv = nullptr, *attn = nullptr, *gate_up = nullptr, *act = nullptr;
    int64_t rows = 0;
  };
  // Steps of up to max_num_tokens tokens use `big`; with L2 persistence on, decode steps of up
  // to the largest graph bucket use `small`, a second arena of that many rows (33.6 MB at
  // Llama-3-8B batch 256), so HotActivations' window does not depend on max_num_tokens. One
  // arena when max_num_tokens is no larger.
  DeviceBuffer<bf16> big_arena, small_arena;
  Activations big, small;
  absl::Status AllocActivations(int64_t rows, DeviceBuffer<bf16>* arena, Activations* a);
  const Activations& ActsFor(int64_t T) const { return T <= small.rows ? small : big; }
  // The gate/up product (SiLU·mul reads it back) and the SiLU·mul output (down_proj's input)
  // of the small arena (CudaRunnerOptions::l2_persist_activations): 22 MB at Llama-3-8B batch
  // 256, for every bucket. Not the whole arena: with the whole arena persisting, too little L2 was
  // left to the attention's copies in flight (H200, batch 256 16.41-16.42 ms vs 15.46-15.50
  // without); the gate/up product alone, or half the lines, gained less
  // (bench/results/cuda_ab_stop19_h200.json).
  L2Window HotActivations(int64_t batch) const override {
    if (batch < 1 || batch > small.rows) return {};
    const bf16* end = small.act + small.rows * inter;  // act follows gate/up
    return {small.gate_up, static_cast<size_t>(end - small.gate_up) * sizeof(bf16)};
  }
  // Paged KV cache, per layer [num_blocks, block_size, kv_heads, hd] bf16.
  std::vector<DeviceBuffer<bf16>> k_cache, v_cache;
};

absl::Status LlamaCore::Init(const ModelConfig& c, const CudaRunnerOptions& o) {
  if (c.architecture != Architecture::kLlama && c.architecture != Architecture::kQwen3) {
    return absl::UnimplementedError(absl::StrCat("CUDA runner: architecture ",
                                                 c.architecture_name,
                                                 " is not supported (Llama or Qwen3 only)"));
  }
  if (c.sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat("sliding_window ", c.sliding_window, " < 0"));
  }
  if (c.hidden_act != "silu") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported hidden_act ", c.hidden_act));
  }
  const int64_t tp = o.tp_size;
  if (tp < 1 || o.tp_rank < 0 || o.tp_rank >= tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel rank ", o.tp_rank, " outside a world of ", o.tp_size));
  }
  if (c.num_attention_heads % tp != 0 || c.num_key_value_heads % tp != 0 ||
      c.intermediate_size % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_size ", tp, " must divide num_attention_heads ", c.num_attention_heads,
                     ", num_key_value_heads ", c.num_key_value_heads, " and intermediate_size ",
                     c.intermediate_size));
  }
  if (tp > 1 && !o.tp_all_reduce) {
    return absl::InvalidArgumentError("tp_size > 1 needs tp_all_reduce");
  }
  if (o.device >= 0) SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device), "cudaSetDevice");
  SLUICE_RETURN_IF_ERROR(InitCore(c, o, c.hidden_size));
  H = c.hidden_size;
  // This rank's share (all of it at tp 1).
  heads = c.num_attention_heads / tp;
  kv_heads = c.num_key_value_heads / tp;
  hd = c.head_dim;
  inter = c.intermediate_size / tp;
  q_dim = heads * hd;
  kv_dim = kv_heads * hd;
  qkv_dim = q_dim + 2 * kv_dim;
  eps = static_cast<float>(c.rms_norm_eps);
  attn_params.num_heads = heads;
  attn_params.num_kv_heads = kv_heads;
  attn_params.head_dim = hd;
  attn_params.v_head_dim = hd;
  attn_params.block_size = o.block_size;
  attn_params.scale = 1.0f / std::sqrt(static_cast<float>(hd));

  auto table = MakeModelRopeTable(c, hd);
  if (!table.ok()) return table.status();
  auto dev_table = kernels::UploadRopeTable(*table);
  if (!dev_table.ok()) return dev_table.status();
  rope = std::move(*dev_table);

  const int64_t T = o.max_num_tokens;
  int64_t graph_rows = 0;  // the largest decode graph bucket (CaptureGraphs' rule)
  if (o.use_cuda_graphs && o.l2_persist_activations) {
    for (int64_t b : o.graph_batch_sizes) {
      if (b >= 1 && b <= o.max_num_seqs && b <= T) graph_rows = std::max(graph_rows, b);
    }
  }
  if (graph_rows > 0 && graph_rows < T) {
    SLUICE_RETURN_IF_ERROR(AllocActivations(graph_rows, &small_arena, &small));
  }
  SLUICE_RETURN_IF_ERROR(AllocActivations(T, &big_arena, &big));
  if (small.rows == 0 && graph_rows > 0) small = big;
  return absl::OkStatus();
}

absl::Status LlamaCore::AllocActivations(int64_t rows, DeviceBuffer<bf16>* arena,
                                         Activations* a) {
  // Each buffer starts on a 256-byte boundary (128 elements).
  const auto round = [](int64_t n) { return (n + 127) / 128 * 128; };
  bf16** const ptrs[] = {&a->residual, &a->normed,  &a->tmp, &a->qkv,
                         &a->attn,     &a->gate_up, &a->act};
  const int64_t widths[] = {H, H, H, qkv_dim, q_dim, 2 * inter, inter};
  int64_t total = 0;
  for (int64_t w : widths) total += round(rows * w);
  auto b = AllocBf16(total);
  if (!b.ok()) return b.status();
  *arena = std::move(*b);
  int64_t at = 0;
  for (size_t i = 0; i < std::size(widths); ++i) {
    *ptrs[i] = arena->data() + at;
    at += round(rows * widths[i]);
  }
  a->rows = rows;
  return absl::OkStatus();
}

absl::Status LlamaCore::LoadWeights(WeightSource& full_src) {
  const ModelConfig& c = config;
  cudaStream_t st = stream.get();
  const int64_t tp = options.tp_size, rank = options.tp_rank;
  // Column-parallel q/k/v/gate/up take a row block, row-parallel o/down a column block; the
  // o/down biases are added once, by rank 0 (after the all-reduce every rank has them).
  ShardSource src(full_src);
  const bool bias_owner = rank == 0;
  auto alloc_fill = [&](DeviceBuffer<bf16>* buf, const std::string& name,
                        std::vector<int64_t> shape, DummyInit init) {
    return AllocFill(src, buf, name, shape, init, st);
  };
  auto fused = [&](DeviceBuffer<bf16>* buf, const std::vector<WeightPart>& parts, int64_t cols,
                   DummyInit init) { return AllocFillFused(src, buf, parts, cols, init, st); };
  // LlavaForConditionalGeneration: transformers 4.x / 5 save `language_model.model.*` +
  // `language_model.lm_head.weight`, 4.52+ in-memory names are `model.language_model.*` +
  // `lm_head.weight`; dummy weights keep the plain names (as LoadDummyModel's checkpoint).
  if (!c.multimodal_architecture.empty()) {
    if (full_src.Contains("language_model.model.embed_tokens.weight")) {
      model_prefix = "language_model.model.";
      lm_head_name = "language_model.lm_head.weight";
    } else if (full_src.Contains("model.language_model.embed_tokens.weight")) {
      model_prefix = "model.language_model.";
    }
  }
  const int64_t vocab_rows = vocab;
  SLUICE_RETURN_IF_ERROR(
      alloc_fill(&embed, Name("model.embed_tokens.weight"), {vocab_rows, H}, DummyInit::kNormal));
  SLUICE_RETURN_IF_ERROR(
      alloc_fill(&final_norm, Name("model.norm.weight"), {H}, DummyInit::kOnes));
  if (!c.tie_word_embeddings) {
    SLUICE_RETURN_IF_ERROR(
        alloc_fill(&lm_head, Name("lm_head.weight"), {vocab_rows, H}, DummyInit::kNormal));
  }
  layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DeviceLayer& L = layers[static_cast<size_t>(i)];
    const std::string p = Name(LayerPrefix(i));
    const std::string a = p + "self_attn.", m = p + "mlp.";
    if (tp > 1) {
      using B = ShardSource::Block;
      for (const char* suffix : {".weight", ".bias"}) {
        const int64_t cols = std::string(suffix) == ".weight" ? H : 1;
        src.Split(a + "q_proj" + suffix, B{q_dim * tp, cols, rank * q_dim, 0});
        src.Split(a + "k_proj" + suffix, B{kv_dim * tp, cols, rank * kv_dim, 0});
        src.Split(a + "v_proj" + suffix, B{kv_dim * tp, cols, rank * kv_dim, 0});
        src.Split(m + "gate_proj" + suffix, B{inter * tp, cols, rank * inter, 0});
        src.Split(m + "up_proj" + suffix, B{inter * tp, cols, rank * inter, 0});
      }
      src.Split(a + "o_proj.weight", B{H, q_dim * tp, 0, rank * q_dim});
      src.Split(m + "down_proj.weight", B{H, inter * tp, 0, rank * inter});
    }
    SLUICE_RETURN_IF_ERROR(
        alloc_fill(&L.input_norm, p + "input_layernorm.weight", {H}, DummyInit::kOnes));
    SLUICE_RETURN_IF_ERROR(
        alloc_fill(&L.post_norm, p + "post_attention_layernorm.weight", {H}, DummyInit::kOnes));
    const std::vector<WeightPart> qkv_w = {
        {a + "q_proj.weight", q_dim}, {a + "k_proj.weight", kv_dim}, {a + "v_proj.weight", kv_dim}};
    SLUICE_RETURN_IF_ERROR(fused(&L.w_qkv, qkv_w, H, DummyInit::kNormal));
    SLUICE_RETURN_IF_ERROR(alloc_fill(&L.w_o, a + "o_proj.weight", {H, q_dim}, DummyInit::kNormal));
    const std::vector<WeightPart> gu_w = {{m + "gate_proj.weight", inter},
                                          {m + "up_proj.weight", inter}};
    SLUICE_RETURN_IF_ERROR(fused(&L.w_gate_up, gu_w, H, DummyInit::kNormal));
    SLUICE_RETURN_IF_ERROR(
        alloc_fill(&L.w_down, m + "down_proj.weight", {H, inter}, DummyInit::kNormal));
    if (c.architecture == Architecture::kQwen3) {
      SLUICE_RETURN_IF_ERROR(alloc_fill(&L.q_norm, a + "q_norm.weight", {hd}, DummyInit::kOnes));
      SLUICE_RETURN_IF_ERROR(alloc_fill(&L.k_norm, a + "k_norm.weight", {hd}, DummyInit::kOnes));
    }
    // Sliding layers as the CPU model (engine/model/llama.cc) marks them.
    if (static_cast<size_t>(i) < c.layer_is_sliding.size() && c.layer_is_sliding[i]) {
      L.sliding_window = c.sliding_window;
    }
    if (c.attention_bias) {
      const std::vector<WeightPart> qkv_b = {
          {a + "q_proj.bias", q_dim}, {a + "k_proj.bias", kv_dim}, {a + "v_proj.bias", kv_dim}};
      SLUICE_RETURN_IF_ERROR(fused(&L.b_qkv, qkv_b, 1, DummyInit::kZeros));
      if (bias_owner) {
        SLUICE_RETURN_IF_ERROR(alloc_fill(&L.b_o, a + "o_proj.bias", {H}, DummyInit::kZeros));
      }
    }
    if (c.mlp_bias) {
      const std::vector<WeightPart> gu_b = {{m + "gate_proj.bias", inter},
                                            {m + "up_proj.bias", inter}};
      SLUICE_RETURN_IF_ERROR(fused(&L.b_gate_up, gu_b, 1, DummyInit::kZeros));
      if (bias_owner) {
        SLUICE_RETURN_IF_ERROR(alloc_fill(&L.b_down, m + "down_proj.bias", {H}, DummyInit::kZeros));
      }
    }
  }
  return stream.Synchronize();
}

int64_t LlamaCore::WeightBytes() const {
  int64_t elems = H + final_norm.size() + lm_head.size();  // one embedding row
  if (lm_head.size() == 0) elems += embed.size();          // tied: the head is embed
  for (const DeviceLayer& L : layers) {
    for (const auto* b : {&L.input_norm, &L.post_norm, &L.w_qkv, &L.b_qkv, &L.w_o, &L.b_o,
                          &L.w_gate_up, &L.b_gate_up, &L.w_down, &L.b_down, &L.q_norm,
                          &L.k_norm}) {
      elems += static_cast<int64_t>(b->size());
    }
  }
  return elems * 2;
}

absl::Status LlamaCore::AllocateCache(int64_t blocks) {
  k_cache.clear();
  v_cache.clear();
  const int64_t elems = blocks * options.block_size * kv_dim;
  for (size_t l = 0; l < layers.size(); ++l) {
    for (auto* cache : {&k_cache, &v_cache}) {
      auto b = AllocBf16(elems);
      if (!b.ok()) return b.status();
      // Zeroed so inert padding rows (which read block 0) only ever see finite values.
      SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(b->data(), 0, b->bytes()), "cudaMemset KV");
      cache->push_back(std::move(*b));
    }
  }
  return absl::OkStatus();
}

// Decode steps of at most this many tokens (= sequences) keep RoPE and the K/V write out of the
// attention launch: their attention splits its keys, where the fusion loses.
constexpr int64_t kRopeFusionMaxDecodeTokens = 16;

absl::Status LlamaCore::Enqueue(const DeviceMeta& m, int64_t T, int64_t S, int64_t N,
                                int64_t max_query_len, int64_t max_seq_len, void* workspace) {
  cudaStream_t st = stream.get();
  auto opt = [](const DeviceBuffer<bf16>& b) -> const bf16* { return b.data(); };
  const kernels::PagedAttentionCudaBatch batch = AttnBatch(m, T, S, max_query_len, max_seq_len);

  const Activations& a = ActsFor(T);
  bf16* res = a.residual;
  SLUICE_RETURN_IF_ERROR(EnqueueEmbedding(m, T, embed.data(), res));
  for (size_t li = 0; li < layers.size(); ++li) {
    const DeviceLayer& L = layers[li];
    // Pre-attention norm; from layer 1 on fused with the previous MLP's residual add.
    SLUICE_RETURN_IF_ERROR(
        li == 0 ? kernels::RmsNormCuda(res, H, L.input_norm.data(), a.normed, H, T, H, eps, st,
                                       pdl.common)
                : kernels::AddRmsNormCuda(a.tmp, res, L.input_norm.data(), a.normed, T, H, eps, st,
                                          pdl.common));
    Mark("add_rmsnorm");
    SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(*lt, a.normed, L.w_qkv.data(), opt(L.b_qkv), a.qkv,
                                               T, qkv_dim, H, st));
    Mark("qkv_gemm");
    if (L.q_norm.size() > 0) {  // Qwen3: RMSNorm over each q and k head, before RoPE
      SLUICE_RETURN_IF_ERROR(QkHeadRmsNormCuda(a.qkv, T, qkv_dim, heads, kv_heads, hd,
                                               L.q_norm.data(), L.k_norm.data(), eps, st,
                                               pdl.common));
      Mark("qk_norm");
    }
    kernels::PagedAttentionParams layer_params = attn_params;
    layer_params.sliding_window = L.sliding_window;
    // Decode-only steps of more than kRopeFusionMaxDecodeTokens tokens: RoPE and the K/V cache
    // write inside the attention launch where it pays (kernels::PagedAttentionDecodeFusionPays:
    // unsplit launches).
    const kernels::PagedAttentionOptions& attn_options = options.attention;
    // SWA bounded replay hooks (RunnerCore::KvFrozen, bounded_sliding): a frozen layer rotates
    // but writes no K/V; a bounded sliding layer attends on the bounded kernel. Neither fuses.
    const bool frozen = KvFrozen(li);
    const bool bounded = bounded_sliding && L.sliding_window > 0;
    const bool fuse = !frozen && !bounded && T > kRopeFusionMaxDecodeTokens &&
                      kernels::PagedAttentionDecodeFusionPays(batch, layer_params, attn_options);
    if (fuse && kernels::PagedAttentionDecodeFusionApplies(batch, layer_params, rope.rotary_dim,
                                                           attn_options)) {
      SLUICE_RETURN_IF_ERROR(kernels::PagedAttentionRopeDecodeCuda(
          a.qkv, qkv_dim, k_cache[li].data(), v_cache[li].data(), batch, layer_params, m.positions,
          rope, m.slots, workspace, a.attn, st, attn_options));
      Mark("attention");
    } else {
      // RoPE on q and k and the K/V cache write in one launch.
      SLUICE_RETURN_IF_ERROR(kernels::RopeQkWriteKvCuda(
          a.qkv, T, qkv_dim, heads, kv_heads, hd, m.positions, rope,
          frozen ? no_kv_slots.data() : m.slots, k_cache[li].data(), v_cache[li].data(), st,
          pdl.common));
      Mark("rope_kv_write");
      if (bounded) {
        SLUICE_RETURN_IF_ERROR(kernels::PagedAttentionBoundedCuda(
            a.qkv, qkv_dim, k_cache[li].data(), v_cache[li].data(), batch, m.sliding_start,
            layer_params, a.attn, st));
      } else {
        SLUICE_RETURN_IF_ERROR(kernels::PagedAttentionCuda(a.qkv, qkv_dim, k_cache[li].data(),
                                                           v_cache[li].data(), batch,
                                                           layer_params, workspace, a.attn, st,
                                                           attn_options));
      }
      Mark("attention");
    }
    SLUICE_RETURN_IF_ERROR(LayerKvWritten(static_cast<int32_t>(li)));  // layerwise KV push
    SLUICE_RETURN_IF_ERROR(
        kernels::LinearCuda(*lt, a.attn, L.w_o.data(), opt(L.b_o), a.tmp, T, H, q_dim, st));
    Mark("o_gemm");
    SLUICE_RETURN_IF_ERROR(TpAllReduce(a.tmp, T * H));
    // Residual add + norm, then gate/up GEMM and SiLU·mul: one kernel when the tuned plan is a
    // GEMV (decode), else the GEMM into gate_up and SiLU·mul after it.
    SLUICE_RETURN_IF_ERROR(
        kernels::AddRmsNormCuda(a.tmp, res, L.post_norm.data(), a.normed, T, H, eps, st,
                                pdl.common));
    Mark("add_rmsnorm");
    SLUICE_RETURN_IF_ERROR(kernels::LinearSiluMulCuda(
        *lt, a.normed, L.w_gate_up.data(), opt(L.b_gate_up), a.gate_up, a.act, T, inter, H, st));
    Mark("gate_up_silu_mul");
    SLUICE_RETURN_IF_ERROR(
        kernels::LinearCuda(*lt, a.act, L.w_down.data(), opt(L.b_down), a.tmp, T, H, inter, st));
    Mark("down_gemm");
    SLUICE_RETURN_IF_ERROR(TpAllReduce(a.tmp, T * H));
  }
  const bf16* head = lm_head.data() != nullptr ? lm_head.data() : embed.data();
  return EnqueueLogits(m, T, N, a.tmp, res, final_norm.data(), eps,
                       a.normed, head);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaLlamaRunner>> CudaLlamaRunner::Load(
    const std::string& dir, const CudaRunnerOptions& options) {
  auto core = LoadCore<LlamaCore>(dir, options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<CudaLlamaRunner>(new CudaLlamaRunner(std::move(*core)));
}

absl::StatusOr<std::unique_ptr<CudaLlamaRunner>> CudaLlamaRunner::CreateDummy(
    const ModelConfig& config, uint64_t seed, const CudaRunnerOptions& options) {
  auto core = DummyCore<LlamaCore>(config, seed, options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<CudaLlamaRunner>(new CudaLlamaRunner(std::move(*core)));
}

}  // namespace sluice::cuda_runner
