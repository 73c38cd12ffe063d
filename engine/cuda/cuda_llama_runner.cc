#include "engine/cuda/cuda_llama_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cuda/runner_kernels.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/rope_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"
#include "kernels/activation/activation_cuda.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/embedding/embedding_cuda.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/rms_norm/rms_norm_cuda.h"
#include "kernels/rope/rope_cuda.h"

namespace sluice::cuda_runner {

using kernels::CublasLt;
using kernels::DeviceBuffer;

#define SLUICE_RUNNER_RETURN_IF_ERROR(expr) \
  do {                                      \
    absl::Status _st = (expr);              \
    if (!_st.ok()) return _st;              \
  } while (0)

namespace {

// Byte offsets of one step's metadata inside its (host staging / device) buffer. Sizes:
// T tokens, S sequences, N logits rows, MB block-table width. slot_mapping comes first so the
// int64 array is 8-byte aligned.
struct MetaLayout {
  int64_t num_tokens = 0, num_seqs = 0, num_logits = 0;
  size_t slots = 0, ids = 0, positions = 0, query_start = 0, context_lens = 0, logits_rows = 0,
         block_tables = 0, bytes = 0;
};

MetaLayout MakeLayout(int64_t t, int64_t s, int64_t n, int64_t mb) {
  MetaLayout l;
  l.num_tokens = t;
  l.num_seqs = s;
  l.num_logits = n;
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += (bytes + 7) / 8 * 8;
    return at;
  };
  l.slots = take(t * sizeof(int64_t));
  l.ids = take(t * sizeof(int32_t));
  l.positions = take(t * sizeof(int32_t));
  l.query_start = take((s + 1) * sizeof(int32_t));
  l.context_lens = take(s * sizeof(int32_t));
  l.logits_rows = take(n * sizeof(int32_t));
  l.block_tables = take(s * mb * sizeof(int32_t));
  l.bytes = off;
  return l;
}

// Device pointers of one step's metadata.
struct DeviceMeta {
  const int64_t* slots;
  int32_t* ids;
  const int32_t* positions;
  const int32_t* query_start;
  const int32_t* context_lens;
  const int32_t* logits_rows;
  const int32_t* block_tables;
};

DeviceMeta MetaPointers(void* base, const MetaLayout& l) {
  char* b = static_cast<char*>(base);
  return {reinterpret_cast<const int64_t*>(b + l.slots),
          reinterpret_cast<int32_t*>(b + l.ids),
          reinterpret_cast<const int32_t*>(b + l.positions),
          reinterpret_cast<const int32_t*>(b + l.query_start),
          reinterpret_cast<const int32_t*>(b + l.context_lens),
          reinterpret_cast<const int32_t*>(b + l.logits_rows),
          reinterpret_cast<const int32_t*>(b + l.block_tables)};
}

// One decoder layer on the device; q/k/v and gate/up are fused row-wise (one GEMM each).
struct DeviceLayer {
  DeviceBuffer<kernels::bf16> input_norm, post_norm;  // [H]
  DeviceBuffer<kernels::bf16> w_qkv, b_qkv;           // [(nh + 2 nkv) hd, H], [..] or empty
  DeviceBuffer<kernels::bf16> w_o, b_o;               // [H, nh hd], [H] or empty
  DeviceBuffer<kernels::bf16> w_gate_up, b_gate_up;   // [2 I, H], [2 I] or empty
  DeviceBuffer<kernels::bf16> w_down, b_down;         // [H, I], [H] or empty
};

// Where weights come from: a safetensors checkpoint (converted to bf16) or the dummy rule.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Writes tensor `name` of `shape` to device memory `dst` (element count = product of shape).
  virtual absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape,
                            DummyInit dummy_init, kernels::bf16* dst, cudaStream_t stream) = 0;
};

class CheckpointSource : public WeightSource {
 public:
  explicit CheckpointSource(std::unique_ptr<Checkpoint> ckpt) : ckpt_(std::move(ckpt)) {}
  absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape, DummyInit,
                    kernels::bf16* dst, cudaStream_t stream) override {
    auto w = LoadWeight(*ckpt_, name, shape);
    if (!w.ok()) return w.status();
    bits_.resize(w->size());
    for (size_t i = 0; i < w->size(); ++i) bits_[i] = kernels::FloatToBf16((*w)[i]);
    // Synchronous: bits_ is reused by the next tensor.
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(dst, bits_.data(), bits_.size() * sizeof(kernels::bf16),
                   cudaMemcpyHostToDevice),
        "cudaMemcpy weights");
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Checkpoint> ckpt_;
  std::vector<kernels::bf16> bits_;
};

class DummySource : public WeightSource {
 public:
  explicit DummySource(uint64_t seed) : seed_(seed) {}
  absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape,
                    DummyInit dummy_init, kernels::bf16* dst, cudaStream_t stream) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return FillDummyCuda(dst, n, DummyTensorSeed(seed_, name), dummy_init, stream);
  }

 private:
  uint64_t seed_;
};

absl::StatusOr<DeviceBuffer<kernels::bf16>> Alloc(int64_t n) {
  return DeviceBuffer<kernels::bf16>::Create(static_cast<size_t>(n));
}

// RAII pinned host memory.
struct PinnedBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~PinnedBuffer() {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }
};

}  // namespace

struct CudaLlamaRunner::Impl {
  ModelConfig config;
  CudaRunnerOptions options;
  int64_t H = 0, heads = 0, kv_heads = 0, hd = 0, inter = 0, vocab = 0;
  int64_t q_dim = 0, kv_dim = 0, qkv_dim = 0, max_blocks_per_seq = 0;
  float eps = 1e-6f;

  kernels::CudaStream stream;
  std::unique_ptr<CublasLt> lt;
  DeviceBuffer<kernels::bf16> embed, final_norm, lm_head;  // lm_head empty when tied
  std::vector<DeviceLayer> layers;
  kernels::DeviceRopeTable rope;
  kernels::PagedAttentionParams attn_params;

  // Activations for up to max_num_tokens tokens / max_num_seqs logits rows.
  DeviceBuffer<kernels::bf16> residual, normed, tmp, qkv, attn, gate_up, act, gathered, logits;
  DeviceBuffer<int32_t> sampled;

  // Paged KV cache, per layer [num_blocks, block_size, kv_heads, hd] bf16.
  std::vector<DeviceBuffer<kernels::bf16>> k_cache, v_cache;
  int64_t num_blocks = 0;

  // Metadata: eager steps use `eager_meta`; each graph bucket has its own fixed buffer.
  DeviceBuffer<int64_t> eager_meta;
  DeviceBuffer<uint8_t> eager_ws, graph_ws;
  PinnedBuffer staging[2];
  cudaEvent_t staging_done[2] = {nullptr, nullptr};
  int next_staging = 0;

  struct Graph {
    int64_t batch = 0;
    MetaLayout layout;
    DeviceBuffer<int64_t> meta;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };
  std::vector<Graph> graphs;  // ascending batch

  StepInfo last;
  int64_t prev_num_logits = 0;  // logits rows of the previous step (for fed-back token ids)

  // ProfileStep: while set, Mark records one timing event after each op of Enqueue.
  std::vector<std::pair<const char*, cudaEvent_t>>* profile = nullptr;
  absl::Status profile_error;
  void Mark(const char* name) {
    if (profile == nullptr) return;
    cudaEvent_t e = nullptr;
    cudaError_t err = cudaEventCreate(&e);
    if (err == cudaSuccess) err = cudaEventRecord(e, stream.get());
    if (err != cudaSuccess) {
      if (e != nullptr) cudaEventDestroy(e);
      if (profile_error.ok()) profile_error = kernels::CudaStatus(err, "profile event");
      return;
    }
    profile->emplace_back(name, e);
  }
  // ReserveEagerWorkspace grows the eager attention workspace to what `plan` needs (a
  // synchronization when it grows) and returns the plan's longest query and sequence.
  absl::Status ReserveEagerWorkspace(const ForwardInput& plan, int64_t* max_q, int64_t* max_len);
  // EnqueueStep stages `plan` and enqueues it: from a decode graph when allow_graph and a
  // bucket fits, else eagerly.
  absl::Status EnqueueStep(const ForwardInput& plan, bool allow_graph);

  ~Impl() { DestroyGraphs(); }

  void DestroyGraphs() {
    for (Graph& g : graphs) {
      if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
      if (g.graph != nullptr) cudaGraphDestroy(g.graph);
    }
    graphs.clear();
    for (cudaEvent_t& e : staging_done) {
      if (e != nullptr) cudaEventDestroy(e);
      e = nullptr;
    }
  }

  absl::Status Init(const ModelConfig& c, const CudaRunnerOptions& o);
  absl::Status LoadWeights(WeightSource& src);
  absl::Status Validate(const ForwardInput& plan) const;
  void Pack(const ForwardInput& plan, const MetaLayout& l, int64_t padded_seqs, char* dst) const;
  absl::Status Enqueue(const DeviceMeta& m, int64_t t, int64_t s, int64_t n,
                       int64_t max_query_len, int64_t max_seq_len, void* workspace);
  absl::Status CaptureGraphs();
  // AttnBatch: the attention kernel's view of a step (also what its workspace is sized by).
  kernels::PagedAttentionCudaBatch AttnBatch(const DeviceMeta& m, int64_t t, int64_t s,
                                             int64_t max_query_len, int64_t max_seq_len) const {
    kernels::PagedAttentionCudaBatch b;
    b.query_start_loc = m.query_start;
    b.context_lens = m.context_lens;
    b.block_tables = m.block_tables;
    b.max_blocks_per_seq = max_blocks_per_seq;
    b.num_sequences = s;
    b.num_tokens = t;
    b.max_query_len = max_query_len;
    b.max_seq_len = max_seq_len;
    return b;
  }
  absl::StatusOr<char*> AcquireStaging(size_t bytes);
  absl::Status Upload(const char* host, size_t bytes, void* device);
};

absl::Status CudaLlamaRunner::Impl::Init(const ModelConfig& c, const CudaRunnerOptions& o) {
  config = c;
  options = o;
  if (c.architecture != Architecture::kLlama) {
    return absl::UnimplementedError(absl::StrCat("CUDA runner: architecture ",
                                                 c.architecture_name,
                                                 " is not supported (Llama only)"));
  }
  if (c.hidden_act != "silu") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported hidden_act ", c.hidden_act));
  }
  if (o.block_size < 1 || o.max_model_len < 1 || o.max_num_tokens < 1 || o.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        "CUDA runner: block_size, max_model_len, max_num_tokens and max_num_seqs must be >= 1");
  }
  H = c.hidden_size;
  heads = c.num_attention_heads;
  kv_heads = c.num_key_value_heads;
  hd = c.head_dim;
  inter = c.intermediate_size;
  vocab = c.vocab_size;
  q_dim = heads * hd;
  kv_dim = kv_heads * hd;
  qkv_dim = q_dim + 2 * kv_dim;
  eps = static_cast<float>(c.rms_norm_eps);
  max_blocks_per_seq = (o.max_model_len + o.block_size - 1) / o.block_size;
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

  auto s = kernels::CudaStream::Create();
  if (!s.ok()) return s.status();
  stream = std::move(*s);
  auto l = CublasLt::Create();
  if (!l.ok()) return l.status();
  lt = std::move(*l);

  const int64_t T = o.max_num_tokens, S = o.max_num_seqs;
  const std::pair<DeviceBuffer<kernels::bf16>*, int64_t> acts[] = {
      {&residual, T * H}, {&normed, T * H},          {&tmp, T * H},
      {&qkv, T * qkv_dim}, {&attn, T * q_dim},        {&gate_up, T * 2 * inter},
      {&act, T * inter},   {&gathered, S * H},        {&logits, S * vocab}};
  for (const auto& [buf, n] : acts) {
    auto b = Alloc(n);
    if (!b.ok()) return b.status();
    *buf = std::move(*b);
  }
  auto sm = DeviceBuffer<int32_t>::Create(static_cast<size_t>(S));
  if (!sm.ok()) return sm.status();
  sampled = std::move(*sm);
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(sampled.data(), 0, sampled.bytes()), "cudaMemset");

  const MetaLayout max_layout = MakeLayout(T, S, S, max_blocks_per_seq);
  auto em = DeviceBuffer<int64_t>::Create(max_layout.bytes / 8);
  if (!em.ok()) return em.status();
  eager_meta = std::move(*em);
  for (int i = 0; i < 2; ++i) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&staging[i].ptr, max_layout.bytes),
                                "cudaMallocHost");
    staging[i].bytes = max_layout.bytes;
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&staging_done[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaRunner::Impl::LoadWeights(WeightSource& src) {
  const ModelConfig& c = config;
  cudaStream_t st = stream.get();
  auto alloc_fill = [&](DeviceBuffer<kernels::bf16>* buf, const std::string& name,
                        std::vector<int64_t> shape, DummyInit init) -> absl::Status {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto b = Alloc(n);
    if (!b.ok()) return b.status();
    *buf = std::move(*b);
    return src.Fill(name, shape, init, buf->data(), st);
  };
  // Fused weights: parts are written row-block after row-block into one buffer.
  struct Part {
    std::string name;
    int64_t rows;
  };
  auto fused = [&](DeviceBuffer<kernels::bf16>* buf, const std::vector<Part>& parts, int64_t cols,
                   DummyInit init) -> absl::Status {
    int64_t rows = 0;
    for (const Part& p : parts) rows += p.rows;
    auto b = Alloc(rows * cols);
    if (!b.ok()) return b.status();
    *buf = std::move(*b);
    int64_t at = 0;
    for (const Part& p : parts) {
      std::vector<int64_t> shape = cols > 1 ? std::vector<int64_t>{p.rows, cols}
                                            : std::vector<int64_t>{p.rows};
      SLUICE_RUNNER_RETURN_IF_ERROR(src.Fill(p.name, shape, init, buf->data() + at * cols, st));
      at += p.rows;
    }
    return absl::OkStatus();
  };
  SLUICE_RUNNER_RETURN_IF_ERROR(
      alloc_fill(&embed, "model.embed_tokens.weight", {vocab, H}, DummyInit::kNormal));
  SLUICE_RUNNER_RETURN_IF_ERROR(
      alloc_fill(&final_norm, "model.norm.weight", {H}, DummyInit::kOnes));
  if (!c.tie_word_embeddings) {
    SLUICE_RUNNER_RETURN_IF_ERROR(
        alloc_fill(&lm_head, "lm_head.weight", {vocab, H}, DummyInit::kNormal));
  }
  layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DeviceLayer& L = layers[static_cast<size_t>(i)];
    const std::string p = LayerPrefix(i);
    const std::string a = p + "self_attn.", m = p + "mlp.";
    SLUICE_RUNNER_RETURN_IF_ERROR(
        alloc_fill(&L.input_norm, p + "input_layernorm.weight", {H}, DummyInit::kOnes));
    SLUICE_RUNNER_RETURN_IF_ERROR(
        alloc_fill(&L.post_norm, p + "post_attention_layernorm.weight", {H}, DummyInit::kOnes));
    const std::vector<Part> qkv_w = {
        {a + "q_proj.weight", q_dim}, {a + "k_proj.weight", kv_dim}, {a + "v_proj.weight", kv_dim}};
    SLUICE_RUNNER_RETURN_IF_ERROR(fused(&L.w_qkv, qkv_w, H, DummyInit::kNormal));
    SLUICE_RUNNER_RETURN_IF_ERROR(
        alloc_fill(&L.w_o, a + "o_proj.weight", {H, q_dim}, DummyInit::kNormal));
    const std::vector<Part> gu_w = {{m + "gate_proj.weight", inter}, {m + "up_proj.weight", inter}};
    SLUICE_RUNNER_RETURN_IF_ERROR(fused(&L.w_gate_up, gu_w, H, DummyInit::kNormal));
    SLUICE_RUNNER_RETURN_IF_ERROR(
        alloc_fill(&L.w_down, m + "down_proj.weight", {H, inter}, DummyInit::kNormal));
    if (c.attention_bias) {
      const std::vector<Part> qkv_b = {
          {a + "q_proj.bias", q_dim}, {a + "k_proj.bias", kv_dim}, {a + "v_proj.bias", kv_dim}};
      SLUICE_RUNNER_RETURN_IF_ERROR(fused(&L.b_qkv, qkv_b, 1, DummyInit::kZeros));
      SLUICE_RUNNER_RETURN_IF_ERROR(
          alloc_fill(&L.b_o, a + "o_proj.bias", {H}, DummyInit::kZeros));
    }
    if (c.mlp_bias) {
      const std::vector<Part> gu_b = {{m + "gate_proj.bias", inter}, {m + "up_proj.bias", inter}};
      SLUICE_RUNNER_RETURN_IF_ERROR(fused(&L.b_gate_up, gu_b, 1, DummyInit::kZeros));
      SLUICE_RUNNER_RETURN_IF_ERROR(
          alloc_fill(&L.b_down, m + "down_proj.bias", {H}, DummyInit::kZeros));
    }
  }
  return stream.Synchronize();
}

absl::Status CudaLlamaRunner::Impl::Validate(const ForwardInput& in) const {
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  const int64_t S = static_cast<int64_t>(in.sequences.size());
  const int64_t N = static_cast<int64_t>(in.logits_indices.size());
  if (num_blocks == 0) return absl::FailedPreconditionError("AllocateKvCache was not called");
  if (static_cast<int64_t>(in.positions.size()) != T ||
      static_cast<int64_t>(in.slot_mapping.size()) != T) {
    return absl::InvalidArgumentError(
        "ForwardInput: token_ids, positions and slot_mapping differ in length");
  }
  if (T > options.max_num_tokens || S > options.max_num_seqs || N > options.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step of ", T, " tokens, ", S, " sequences, ", N, " logits rows exceeds the limits (",
        options.max_num_tokens, ", ", options.max_num_seqs, ", ", options.max_num_seqs, ")"));
  }
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = in.token_ids[t];
    if (id >= vocab || (id < 0 && -int64_t{id} - 1 >= prev_num_logits)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is outside the vocabulary [0, ", vocab,
          ") and not a previous-step row reference (", prev_num_logits, " rows)"));
    }
  }
  for (int32_t r : in.logits_indices) {
    if (r < 0 || r >= T) {
      return absl::InvalidArgumentError(absl::StrCat("logits index ", r, " outside [0, ", T, ")"));
    }
  }
  // Sequences own consecutive query rows, in order (query_start_loc is a prefix sum).
  const int64_t bs = options.block_size;
  int64_t next_row = 0;
  for (int64_t s = 0; s < S; ++s) {
    const SequenceSlice& q = in.sequences[s];
    if (q.query_start != next_row || q.num_query_tokens < 1 || q.num_context_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, ": query rows must start at ", next_row,
          " (sequences in order, back to back) and hold at least one token"));
    }
    next_row += q.num_query_tokens;
    if (next_row > T) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": rows outside the batch"));
    }
    const int64_t total = int64_t{q.num_context_tokens} + q.num_query_tokens;
    if (total > options.max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", total,
                                                     " tokens exceed max_model_len ",
                                                     options.max_model_len));
    }
    const int64_t need = (total + bs - 1) / bs;
    if (static_cast<int64_t>(q.block_table.size()) < need) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, ": block table of ", q.block_table.size(), " blocks, ", need, " needed"));
    }
    for (int64_t b = 0; b < need; ++b) {
      if (q.block_table[b] < 0 || q.block_table[b] >= num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": block id ", q.block_table[b], " out of range"));
      }
    }
    for (int64_t i = 0; i < q.num_query_tokens; ++i) {
      const int64_t t = q.query_start + i, pos = q.num_context_tokens + i;
      const int64_t slot = int64_t{q.block_table[pos / bs]} * bs + pos % bs;
      if (in.positions[t] != pos || in.slot_mapping[t] != slot) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", t, ": position ", in.positions[t], " / slot ", in.slot_mapping[t],
            " disagree with its sequence (expected ", pos, " / ", slot, ")"));
      }
    }
  }
  if (next_row != T) {
    return absl::InvalidArgumentError(absl::StrCat("tokens [", next_row, ", ", T,
                                                   ") belong to no sequence"));
  }
  return absl::OkStatus();
}

// Pack writes the plan into `dst` laid out as `l`. Rows past the plan (graph padding, up to
// l.num_seqs) are inert: one token at position 0 whose K/V is not written (slot -1), reading
// block 0, its logits row its own.
void CudaLlamaRunner::Impl::Pack(const ForwardInput& in, const MetaLayout& l,
                                 int64_t padded_seqs, char* dst) const {
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  const int64_t S = static_cast<int64_t>(in.sequences.size());
  const int64_t N = static_cast<int64_t>(in.logits_indices.size());
  auto* slots = reinterpret_cast<int64_t*>(dst + l.slots);
  auto* ids = reinterpret_cast<int32_t*>(dst + l.ids);
  auto* pos = reinterpret_cast<int32_t*>(dst + l.positions);
  auto* qsl = reinterpret_cast<int32_t*>(dst + l.query_start);
  auto* ctx = reinterpret_cast<int32_t*>(dst + l.context_lens);
  auto* rows = reinterpret_cast<int32_t*>(dst + l.logits_rows);
  auto* bt = reinterpret_cast<int32_t*>(dst + l.block_tables);
  std::memcpy(slots, in.slot_mapping.data(), T * sizeof(int64_t));
  std::memcpy(ids, in.token_ids.data(), T * sizeof(int32_t));
  std::memcpy(pos, in.positions.data(), T * sizeof(int32_t));
  std::memcpy(rows, in.logits_indices.data(), N * sizeof(int32_t));
  const int64_t bs = options.block_size;
  qsl[0] = 0;
  for (int64_t s = 0; s < S; ++s) {
    const SequenceSlice& q = in.sequences[s];
    qsl[s + 1] = q.query_start + q.num_query_tokens;
    ctx[s] = q.num_context_tokens;
    const int64_t need = (int64_t{q.num_context_tokens} + q.num_query_tokens + bs - 1) / bs;
    std::memcpy(bt + s * max_blocks_per_seq, q.block_table.data(), need * sizeof(int32_t));
  }
  for (int64_t s = S; s < padded_seqs; ++s) {
    slots[s] = -1;
    ids[s] = 0;
    pos[s] = 0;
    qsl[s + 1] = static_cast<int32_t>(s + 1);
    ctx[s] = 0;
    bt[s * max_blocks_per_seq] = 0;
  }
  for (int64_t r = N; r < l.num_logits; ++r) rows[r] = static_cast<int32_t>(r);
}

absl::StatusOr<char*> CudaLlamaRunner::Impl::AcquireStaging(size_t bytes) {
  const int i = next_staging;
  // The copy that last read this staging buffer must be done before it is rewritten.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging_done[i]), "cudaEventSynchronize");
  if (bytes > staging[i].bytes) return absl::InternalError("staging buffer too small");
  return static_cast<char*>(staging[i].ptr);
}

absl::Status CudaLlamaRunner::Impl::Upload(const char* host, size_t bytes, void* device) {
  const int i = next_staging;
  next_staging ^= 1;
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream.get()),
      "cudaMemcpyAsync step metadata");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_done[i], stream.get()), "cudaEventRecord");
  return absl::OkStatus();
}

absl::Status CudaLlamaRunner::Impl::Enqueue(const DeviceMeta& m, int64_t T, int64_t S, int64_t N,
                                            int64_t max_query_len, int64_t max_seq_len,
                                            void* workspace) {
  cudaStream_t st = stream.get();
  using kernels::bf16;
  auto opt = [](const DeviceBuffer<bf16>& b) -> const bf16* { return b.data(); };
  const kernels::PagedAttentionCudaBatch batch = AttnBatch(m, T, S, max_query_len, max_seq_len);

  SLUICE_RUNNER_RETURN_IF_ERROR(ResolveTokenIdsCuda(m.ids, T, sampled.data(), st));
  Mark("resolve_ids");
  SLUICE_RUNNER_RETURN_IF_ERROR(
      kernels::EmbeddingCuda(embed.data(), vocab, H, m.ids, T, residual.data(), nullptr, st));
  Mark("embedding");
  for (size_t li = 0; li < layers.size(); ++li) {
    const DeviceLayer& L = layers[li];
    // Pre-attention norm; from layer 1 on fused with the previous MLP's residual add.
    if (li == 0) {
      SLUICE_RUNNER_RETURN_IF_ERROR(kernels::RmsNormCuda(residual.data(), H, L.input_norm.data(),
                                                         normed.data(), H, T, H, eps, st));
    } else {
      SLUICE_RUNNER_RETURN_IF_ERROR(kernels::AddRmsNormCuda(
          tmp.data(), residual.data(), L.input_norm.data(), normed.data(), T, H, eps, st));
    }
    Mark("add_rmsnorm");
    SLUICE_RUNNER_RETURN_IF_ERROR(kernels::LinearCuda(*lt, normed.data(), L.w_qkv.data(),
                                                      opt(L.b_qkv), qkv.data(), T, qkv_dim, H,
                                                      st));
    Mark("qkv_gemm");
    // RoPE on q and k and the K/V cache write in one launch.
    SLUICE_RUNNER_RETURN_IF_ERROR(kernels::RopeQkWriteKvCuda(
        qkv.data(), T, qkv_dim, heads, kv_heads, hd, m.positions, rope, m.slots,
        k_cache[li].data(), v_cache[li].data(), st));
    Mark("rope_kv_write");
    SLUICE_RUNNER_RETURN_IF_ERROR(kernels::PagedAttentionCuda(
        qkv.data(), qkv_dim, k_cache[li].data(), v_cache[li].data(), batch, attn_params,
        workspace, attn.data(), st));
    Mark("attention");
    SLUICE_RUNNER_RETURN_IF_ERROR(kernels::LinearCuda(*lt, attn.data(), L.w_o.data(), opt(L.b_o),
                                                      tmp.data(), T, H, q_dim, st));
    Mark("o_gemm");
    SLUICE_RUNNER_RETURN_IF_ERROR(kernels::AddRmsNormCuda(
        tmp.data(), residual.data(), L.post_norm.data(), normed.data(), T, H, eps, st));
    Mark("add_rmsnorm");
    SLUICE_RUNNER_RETURN_IF_ERROR(kernels::LinearCuda(*lt, normed.data(), L.w_gate_up.data(),
                                                      opt(L.b_gate_up), gate_up.data(), T,
                                                      2 * inter, H, st));
    Mark("gate_up_gemm");
    SLUICE_RUNNER_RETURN_IF_ERROR(kernels::SiluMulCuda(gate_up.data(), act.data(), T, inter, st));
    Mark("silu_mul");
    SLUICE_RUNNER_RETURN_IF_ERROR(kernels::LinearCuda(*lt, act.data(), L.w_down.data(),
                                                      opt(L.b_down), tmp.data(), T, H, inter,
                                                      st));
    Mark("down_gemm");
  }
  if (N == 0) return absl::OkStatus();
  // Final residual add + norm over the step, then only the wanted rows go through lm_head.
  SLUICE_RUNNER_RETURN_IF_ERROR(kernels::AddRmsNormCuda(tmp.data(), residual.data(),
                                                        final_norm.data(), normed.data(), T, H,
                                                        eps, st));
  Mark("final_norm");
  SLUICE_RUNNER_RETURN_IF_ERROR(GatherRowsCuda(normed.data(), m.logits_rows, N, H,
                                               gathered.data(), st));
  Mark("gather_rows");
  const bf16* head = lm_head.data() != nullptr ? lm_head.data() : embed.data();
  SLUICE_RUNNER_RETURN_IF_ERROR(
      kernels::LinearCuda(*lt, gathered.data(), head, nullptr, logits.data(), N, vocab, H, st));
  Mark("lm_head");
  SLUICE_RUNNER_RETURN_IF_ERROR(ArgmaxRowsCuda(logits.data(), N, vocab, sampled.data(), st));
  Mark("argmax");
  return absl::OkStatus();
}

absl::Status CudaLlamaRunner::Impl::CaptureGraphs() {
  DestroyGraphs();
  for (int i = 0; i < 2; ++i) {
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&staging_done[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  if (!options.use_cuda_graphs) return absl::OkStatus();
  std::vector<int64_t> sizes;
  for (int64_t b : options.graph_batch_sizes) {
    if (b >= 1 && b <= options.max_num_seqs && b <= options.max_num_tokens) sizes.push_back(b);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // Fixed metadata buffers first: the workspace size is computed from the real batch.
  for (int64_t b : sizes) {
    Graph g;
    g.batch = b;
    g.layout = MakeLayout(b, b, b, max_blocks_per_seq);
    auto meta = DeviceBuffer<int64_t>::Create(g.layout.bytes / 8);
    if (!meta.ok()) return meta.status();
    g.meta = std::move(*meta);
    graphs.push_back(std::move(g));
  }
  // One workspace serves every bucket (graphs replay one at a time on one stream).
  size_t ws_bytes = 0;
  for (const Graph& g : graphs) {
    const DeviceMeta m = MetaPointers(g.meta.data(), g.layout);
    ws_bytes = std::max(ws_bytes, kernels::PagedAttentionCudaWorkspaceBytes(
                                      AttnBatch(m, g.batch, g.batch, 1, options.max_model_len),
                                      attn_params));
  }
  auto ws = DeviceBuffer<uint8_t>::Create(ws_bytes);
  if (!ws.ok()) return ws.status();
  graph_ws = std::move(*ws);
  ForwardInput empty;
  // The bucket shapes' GEMMs are tuned once, in the eager run before each capture (and only
  // there, so Step never synchronizes to tune): weight-streaming shapes gain most from the
  // choice (GEMV for m <= 8, else the fastest of cuBLASLt's candidates rather than its first).
  if (options.autotune_gemms && !graphs.empty()) lt->set_autotune(graphs.back().batch);
  for (Graph& g : graphs) {
    const int64_t b = g.batch;
    auto host = AcquireStaging(g.layout.bytes);
    if (!host.ok()) return host.status();
    Pack(empty, g.layout, b, *host);  // all rows inert
    SLUICE_RUNNER_RETURN_IF_ERROR(Upload(*host, g.layout.bytes, g.meta.data()));
    const DeviceMeta m = MetaPointers(g.meta.data(), g.layout);
    // Eager run first: cuBLASLt picks and caches its plans outside the capture.
    SLUICE_RUNNER_RETURN_IF_ERROR(
        Enqueue(m, b, b, b, 1, options.max_model_len, graph_ws.data()));
    SLUICE_RUNNER_RETURN_IF_ERROR(stream.Synchronize());
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal),
        "cudaStreamBeginCapture");
    absl::Status enq = Enqueue(m, b, b, b, 1, options.max_model_len, graph_ws.data());
    const cudaError_t end = cudaStreamEndCapture(stream.get(), &g.graph);
    SLUICE_RUNNER_RETURN_IF_ERROR(enq);
    SLUICE_CUDA_RETURN_IF_ERROR(end, "cudaStreamEndCapture");
    SLUICE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&g.exec, g.graph, 0),
                                "cudaGraphInstantiate");
  }
  lt->set_autotune(0);
  return stream.Synchronize();
}

CudaLlamaRunner::CudaLlamaRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaLlamaRunner::~CudaLlamaRunner() {
  if (impl_ != nullptr && impl_->stream.get() != nullptr) (void)impl_->stream.Synchronize();
}

absl::StatusOr<std::unique_ptr<CudaLlamaRunner>> CudaLlamaRunner::Load(
    const std::string& dir, const CudaRunnerOptions& options) {
  auto config = ModelConfig::Load(dir);
  if (!config.ok()) return config.status();
  auto impl = std::make_unique<Impl>();
  SLUICE_RUNNER_RETURN_IF_ERROR(impl->Init(*config, options));
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  CheckpointSource src(std::move(*ckpt));
  SLUICE_RUNNER_RETURN_IF_ERROR(impl->LoadWeights(src));
  return std::unique_ptr<CudaLlamaRunner>(new CudaLlamaRunner(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<CudaLlamaRunner>> CudaLlamaRunner::CreateDummy(
    const ModelConfig& config, uint64_t seed, const CudaRunnerOptions& options) {
  auto impl = std::make_unique<Impl>();
  SLUICE_RUNNER_RETURN_IF_ERROR(impl->Init(config, options));
  DummySource src(seed);
  SLUICE_RUNNER_RETURN_IF_ERROR(impl->LoadWeights(src));
  return std::unique_ptr<CudaLlamaRunner>(new CudaLlamaRunner(std::move(impl)));
}

const ModelConfig& CudaLlamaRunner::config() const { return impl_->config; }
const CudaRunnerOptions& CudaLlamaRunner::options() const { return impl_->options; }
int64_t CudaLlamaRunner::num_blocks() const { return impl_->num_blocks; }
const StepInfo& CudaLlamaRunner::last_step() const { return impl_->last; }

int64_t CudaLlamaRunner::WeightBytesPerStep() const {
  const Impl& m = *impl_;
  int64_t elems = m.H + m.final_norm.size() + m.lm_head.size();  // one embedding row
  if (m.lm_head.size() == 0) elems += m.embed.size();            // tied: the head is embed
  for (const DeviceLayer& L : m.layers) {
    for (const auto* b : {&L.input_norm, &L.post_norm, &L.w_qkv, &L.b_qkv, &L.w_o, &L.b_o,
                          &L.w_gate_up, &L.b_gate_up, &L.w_down, &L.b_down}) {
      elems += static_cast<int64_t>(b->size());
    }
  }
  return elems * 2;
}

int64_t CudaLlamaRunner::KvBytesPerToken() const {
  return impl_->config.num_hidden_layers * 2 * impl_->kv_dim * 2;
}

absl::Status CudaLlamaRunner::AllocateKvCache(int64_t num_blocks) {
  Impl& m = *impl_;
  if (num_blocks < 1) return absl::InvalidArgumentError("AllocateKvCache: num_blocks < 1");
  SLUICE_RUNNER_RETURN_IF_ERROR(m.stream.Synchronize());
  m.k_cache.clear();
  m.v_cache.clear();
  m.num_blocks = 0;
  const int64_t elems = num_blocks * m.options.block_size * m.kv_dim;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    for (auto* cache : {&m.k_cache, &m.v_cache}) {
      auto b = Alloc(elems);
      if (!b.ok()) return b.status();
      // Zeroed so inert padding rows (which read block 0) only ever see finite values.
      SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(b->data(), 0, b->bytes()), "cudaMemset KV");
      cache->push_back(std::move(*b));
    }
  }
  m.num_blocks = num_blocks;
  m.prev_num_logits = 0;
  return m.CaptureGraphs();
}

absl::Status CudaLlamaRunner::Step(const ForwardInput& plan) {
  return impl_->EnqueueStep(plan, /*allow_graph=*/true);
}

absl::StatusOr<std::vector<ProfileEntry>> CudaLlamaRunner::ProfileStep(const ForwardInput& plan,
                                                                       int64_t hold_ms) {
  Impl& m = *impl_;
  SLUICE_RUNNER_RETURN_IF_ERROR(m.Validate(plan));
  int64_t max_q = 0, max_len = 0;  // (unused: the eager path recomputes them)
  // Grown here, before the hold: growing it synchronizes, which would end the hold early.
  if (!plan.token_ids.empty()) {
    SLUICE_RUNNER_RETURN_IF_ERROR(m.ReserveEagerWorkspace(plan, &max_q, &max_len));
  }
  SLUICE_RUNNER_RETURN_IF_ERROR(m.stream.Synchronize());
  // Hold the GPU while the host enqueues, so the kernels then run back to back as they would
  // from a graph instead of waiting on the host's launches.
  SLUICE_RUNNER_RETURN_IF_ERROR(SpinCuda(hold_ms * 1000000, m.stream.get()));
  std::vector<std::pair<const char*, cudaEvent_t>> events;
  m.profile = &events;
  m.profile_error = absl::OkStatus();
  m.Mark("start");
  absl::Status st = m.EnqueueStep(plan, /*allow_graph=*/false);
  m.profile = nullptr;
  if (st.ok()) st = m.profile_error;
  if (st.ok()) st = m.stream.Synchronize();
  std::vector<ProfileEntry> out;
  for (size_t i = 1; st.ok() && i < events.size(); ++i) {
    float ms = 0.0f;
    const cudaError_t err = cudaEventElapsedTime(&ms, events[i - 1].second, events[i].second);
    if (err != cudaSuccess) {
      st = kernels::CudaStatus(err, "cudaEventElapsedTime");
      break;
    }
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const ProfileEntry& e) { return e.op == events[i].first; });
    if (it == out.end()) it = out.insert(out.end(), ProfileEntry{events[i].first, 0, 0.0});
    it->launches_between_marks += 1;
    it->ms += ms;
  }
  (void)m.stream.Synchronize();
  for (auto& [name, e] : events) cudaEventDestroy(e);
  if (!st.ok()) return st;
  return out;
}

std::string CudaLlamaRunner::GemmPlans() { return impl_->lt->DescribePlans(); }

absl::Status CudaLlamaRunner::Impl::ReserveEagerWorkspace(const ForwardInput& plan,
                                                          int64_t* max_q, int64_t* max_len) {
  const int64_t T = static_cast<int64_t>(plan.token_ids.size());
  const int64_t S = static_cast<int64_t>(plan.sequences.size());
  const int64_t N = static_cast<int64_t>(plan.logits_indices.size());
  *max_q = 0;
  *max_len = 0;
  for (const SequenceSlice& q : plan.sequences) {
    *max_q = std::max<int64_t>(*max_q, q.num_query_tokens);
    *max_len = std::max<int64_t>(*max_len, int64_t{q.num_context_tokens} + q.num_query_tokens);
  }
  const MetaLayout layout = MakeLayout(T, S, N, max_blocks_per_seq);
  const DeviceMeta meta = MetaPointers(eager_meta.data(), layout);
  const size_t ws = kernels::PagedAttentionCudaWorkspaceBytes(
      AttnBatch(meta, T, S, *max_q, *max_len), attn_params);
  if (ws > eager_ws.size()) {
    SLUICE_RUNNER_RETURN_IF_ERROR(stream.Synchronize());  // the old workspace may be in use
    eager_ws = DeviceBuffer<uint8_t>();
    auto b = DeviceBuffer<uint8_t>::Create(ws);
    if (!b.ok()) return b.status();
    eager_ws = std::move(*b);
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaRunner::Impl::EnqueueStep(const ForwardInput& plan, bool allow_graph) {
  Impl& m = *this;
  SLUICE_RUNNER_RETURN_IF_ERROR(m.Validate(plan));
  const int64_t T = static_cast<int64_t>(plan.token_ids.size());
  const int64_t S = static_cast<int64_t>(plan.sequences.size());
  const int64_t N = static_cast<int64_t>(plan.logits_indices.size());
  m.last = StepInfo{false, 0, T, N};
  if (T == 0) {
    m.prev_num_logits = 0;
    return absl::OkStatus();
  }
  const bool decode =
      allow_graph && T == S && !m.graphs.empty() && S <= m.graphs.back().batch;
  if (decode) {
    Impl::Graph* g = nullptr;
    for (Impl::Graph& cand : m.graphs) {
      if (cand.batch >= S && cand.batch >= N) {
        g = &cand;
        break;
      }
    }
    if (g != nullptr) {
      auto host = m.AcquireStaging(g->layout.bytes);
      if (!host.ok()) return host.status();
      m.Pack(plan, g->layout, g->batch, *host);
      SLUICE_RUNNER_RETURN_IF_ERROR(m.Upload(*host, g->layout.bytes, g->meta.data()));
      SLUICE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g->exec, m.stream.get()), "cudaGraphLaunch");
      m.last.graph = true;
      m.last.graph_batch = g->batch;
      m.prev_num_logits = N;
      return absl::OkStatus();
    }
  }
  int64_t max_q = 0, max_len = 0;
  SLUICE_RUNNER_RETURN_IF_ERROR(m.ReserveEagerWorkspace(plan, &max_q, &max_len));
  const MetaLayout layout = MakeLayout(T, S, N, m.max_blocks_per_seq);
  const DeviceMeta meta = MetaPointers(m.eager_meta.data(), layout);
  auto host = m.AcquireStaging(layout.bytes);
  if (!host.ok()) return host.status();
  m.Pack(plan, layout, S, *host);
  SLUICE_RUNNER_RETURN_IF_ERROR(m.Upload(*host, layout.bytes, m.eager_meta.data()));
  m.prev_num_logits = N;
  return m.Enqueue(meta, T, S, N, max_q, max_len, m.eager_ws.data());
}

absl::Status CudaLlamaRunner::Synchronize() { return impl_->stream.Synchronize(); }

absl::StatusOr<std::vector<int32_t>> CudaLlamaRunner::SampledTokens() {
  Impl& m = *impl_;
  std::vector<int32_t> out(static_cast<size_t>(m.last.num_logits));
  if (!out.empty()) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), m.sampled.data(),
                                                out.size() * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, m.stream.get()),
                                "cudaMemcpyAsync sampled");
  }
  SLUICE_RUNNER_RETURN_IF_ERROR(m.stream.Synchronize());
  return out;
}

absl::StatusOr<std::vector<float>> CudaLlamaRunner::Logits() {
  Impl& m = *impl_;
  const size_t n = static_cast<size_t>(m.last.num_logits * m.vocab);
  std::vector<kernels::bf16> bits(n);
  if (n > 0) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bits.data(), m.logits.data(),
                                                n * sizeof(kernels::bf16),
                                                cudaMemcpyDeviceToHost, m.stream.get()),
                                "cudaMemcpyAsync logits");
  }
  SLUICE_RUNNER_RETURN_IF_ERROR(m.stream.Synchronize());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = kernels::Bf16ToFloat(bits[i]);
  return out;
}

#undef SLUICE_RUNNER_RETURN_IF_ERROR

}  // namespace sluice::cuda_runner
