#include "engine/cuda/runner_core.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "build_paths.h"
#include "common/status_macros.h"
#include "engine/cuda/runner_kernels.h"
#include "engine/model/weight_loader.h"
#include "kernels/embedding/embedding_cuda.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/mla_attention/mla_attention_cuda.h"
#include "kernels/rms_norm/rms_norm_cuda.h"
#include "kernels/sampling/logits_processing_cuda.h"
#include "kernels/sampling/sampling_cuda.h"

namespace sluice::cuda_runner {
namespace {

// CudaRunnerOptions::gemm_tuning "auto": the first existing candidate directory, else "".
std::string AutoGemmTuningDir() {
  std::vector<std::filesystem::path> candidates;
#ifdef SLUICE_SOURCE_DIR
  candidates.push_back(std::filesystem::path(SLUICE_SOURCE_DIR) / "configs" / "gemm_tuning");
#endif
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path() / "configs" / "gemm_tuning");
    candidates.push_back(exe.parent_path() / ".." / "share" / "sluice" / "gemm_tuning");
  }
  for (const auto& dir : candidates) {
    if (std::filesystem::is_directory(dir, ec)) return dir.string();
  }
  return "";
}

// LoadGemmTuningOnce: kernels::LoadGemmTuning(path) the first time a runner of this process
// asks for `path` (tensor-parallel ranks and re-allocations share the process table).
absl::Status LoadGemmTuningOnce(std::string path) {
  if (path == "auto") path = AutoGemmTuningDir();
  if (path.empty()) return absl::OkStatus();
  static std::mutex mu;
  static std::set<std::string>* loaded = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  if (loaded->count(path) > 0) return absl::OkStatus();
  absl::StatusOr<int> taken = kernels::LoadGemmTuning(path);
  if (!taken.ok()) return taken.status();
  loaded->insert(path);
  return absl::OkStatus();
}

}  // namespace

// The longest query row a multi-token graph bucket is captured for (graph_query_lens).
constexpr int64_t kMaxGraphQueryLen = 64;

DeviceMeta MetaPointers(void* base, const MetaLayout& l) {
  char* b = static_cast<char*>(base);
  return {reinterpret_cast<const int64_t*>(b + l.slots),
          reinterpret_cast<int32_t*>(b + l.ids),
          reinterpret_cast<const int32_t*>(b + l.positions),
          reinterpret_cast<const int32_t*>(b + l.query_start),
          reinterpret_cast<const int32_t*>(b + l.context_lens),
          reinterpret_cast<const int32_t*>(b + l.logits_rows),
          reinterpret_cast<const int32_t*>(b + l.block_tables),
          reinterpret_cast<const int32_t*>(b + l.sliding_start)};
}

absl::Status CheckpointSource::Fill(const std::string& name, const std::vector<int64_t>& shape,
                                    DummyInit, bf16* dst, cudaStream_t) {
  auto w = LoadWeight(*ckpt_, name, shape);
  if (!w.ok()) return w.status();
  bits_.resize(w->size());
  for (size_t i = 0; i < w->size(); ++i) bits_[i] = kernels::FloatToBf16((*w)[i]);
  // Synchronous: bits_ is reused by the next tensor.
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dst, bits_.data(), bits_.size() * sizeof(bf16), cudaMemcpyHostToDevice),
      "cudaMemcpy weights");
  return absl::OkStatus();
}

absl::Status CheckpointSource::FillFloat(const std::string& name,
                                         const std::vector<int64_t>& shape, DummyInit,
                                         float* dst) {
  auto w = LoadWeight(*ckpt_, name, shape);
  if (!w.ok()) return w.status();
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dst, w->data(), w->size() * sizeof(float), cudaMemcpyHostToDevice),
      "cudaMemcpy weights");
  return absl::OkStatus();
}

absl::Status DummySource::FillFloat(const std::string& name, const std::vector<int64_t>& shape,
                                    DummyInit dummy_init, float* dst) {
  DummyTensorSpec spec{name, shape, dummy_init};
  std::vector<float> host(static_cast<size_t>(spec.NumElements()));
  FillDummyTensor(spec, seed_, host.data());
  for (float& v : host) v = kernels::Bf16ToFloat(kernels::FloatToBf16(v));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dst, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
      "cudaMemcpy weights");
  return absl::OkStatus();
}

absl::Status DummySource::Fill(const std::string& name, const std::vector<int64_t>& shape,
                               DummyInit dummy_init, bf16* dst, cudaStream_t stream) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return FillDummyCuda(dst, n, DummyTensorSeed(seed_, name), dummy_init, stream);
}

absl::StatusOr<DeviceBuffer<bf16>> AllocBf16(int64_t n) {
  return DeviceBuffer<bf16>::Create(static_cast<size_t>(n));
}

absl::Status AllocFill(WeightSource& src, DeviceBuffer<bf16>* buf, const std::string& name,
                       const std::vector<int64_t>& shape, DummyInit init, cudaStream_t stream) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  auto b = AllocBf16(n);
  if (!b.ok()) return b.status();
  *buf = std::move(*b);
  return src.Fill(name, shape, init, buf->data(), stream);
}

absl::Status AllocFillFused(WeightSource& src, DeviceBuffer<bf16>* buf,
                            const std::vector<WeightPart>& parts, int64_t cols, DummyInit init,
                            cudaStream_t stream) {
  int64_t rows = 0;
  for (const WeightPart& p : parts) rows += p.rows;
  auto b = AllocBf16(rows * cols);
  if (!b.ok()) return b.status();
  *buf = std::move(*b);
  int64_t at = 0;
  for (const WeightPart& p : parts) {
    std::vector<int64_t> shape =
        cols > 1 ? std::vector<int64_t>{p.rows, cols} : std::vector<int64_t>{p.rows};
    SLUICE_RETURN_IF_ERROR(src.Fill(p.name, shape, init, buf->data() + at * cols, stream));
    at += p.rows;
  }
  return absl::OkStatus();
}

RunnerCore::~RunnerCore() {
  if (stream.get() != nullptr) (void)stream.Synchronize();
  if (tail_fence != nullptr) cudaEventDestroy(tail_fence);
  if (embeddings_uploaded != nullptr) cudaEventDestroy(embeddings_uploaded);
  DestroyGraphs();
  for (cudaEvent_t e : layer_events) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (l2_set_aside > 0) {  // on the device it was taken on
    int current = 0;
    const bool switched = cudaGetDevice(&current) == cudaSuccess && current != l2_device &&
                          cudaSetDevice(l2_device) == cudaSuccess;
    L2ReleaseSetAside();
    if (switched) cudaSetDevice(current);
    (void)cudaGetLastError();
  }
}

void RunnerCore::DestroyGraphs() {
  for (Graph& g : graphs) {
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    if (g.graph != nullptr) cudaGraphDestroy(g.graph);
    if (g.bounded_exec != nullptr) cudaGraphExecDestroy(g.bounded_exec);
    if (g.bounded_graph != nullptr) cudaGraphDestroy(g.bounded_graph);
  }
  graphs.clear();
  buckets.clear();
  for (cudaEvent_t& e : staging_done) {
    if (e != nullptr) cudaEventDestroy(e);
    e = nullptr;
  }
}

absl::Status RunnerCore::LayerKvWritten(int32_t layer) {
  if (layer_hook == nullptr) return absl::OkStatus();
  while (static_cast<int32_t>(layer_events.size()) <= layer) {
    cudaEvent_t e = nullptr;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags layer KV");
    layer_events.push_back(e);
  }
  cudaEvent_t e = layer_events[static_cast<size_t>(layer)];
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, stream.get()), "cudaEventRecord layer KV");
  (*layer_hook)(layer, [e]() -> absl::Status {
    const cudaError_t err = cudaEventSynchronize(e);
    if (err == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("cudaEventSynchronize layer KV: ", cudaGetErrorString(err)));
  });
  return absl::OkStatus();
}

void RunnerCore::Mark(const char* name) {
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

absl::Status RunnerCore::InitCore(const ModelConfig& c, const CudaRunnerOptions& o,
                                  int64_t hidden_size) {
  config = c;
  options = o;
  if (o.batch_invariant) {
    // One reduction order per row whatever the step: no M-dependent kernel choice anywhere.
    options.linear.batch_invariant = true;
    options.attention.batch_invariant = true;
    options.mla.mha_prefill_min_query_len = 0;  // DeepSeek: the absorbed form at every size
    options.moe.prefill_gemm_min_tokens = 0;    // no per-expert cuBLASLt GEMMs
    options.autotune_gemms = false;
    options.gemm_tuning.clear();
    options.gemm_tuning_save.clear();
    if (o.tp_size > 1) {
      return absl::InvalidArgumentError(
          "CUDA runner: batch-invariant mode needs tp_size 1 (the all-reduce's summation order "
          "depends on the message size, so on the step's token count)");
    }
  }
  if (o.block_size < 1 || o.max_model_len < 1 || o.max_num_tokens < 1 || o.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        "CUDA runner: block_size, max_model_len, max_num_tokens and max_num_seqs must be >= 1");
  }
  if (o.max_num_logits < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA runner: max_num_logits must be >= 0, got ", o.max_num_logits));
  }
  // At least one row per sequence: a decode step (and its graph bucket) samples every one.
  max_logits = std::max(o.max_num_logits, o.max_num_seqs);
  for (int64_t q : o.graph_query_lens) {
    if (q < 2 || q > kMaxGraphQueryLen) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA runner: graph_query_lens entries must be 2..", kMaxGraphQueryLen, ", got ", q));
    }
  }
  if (o.decode_pdl_level < 0 || o.decode_pdl_level > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA runner: decode_pdl_level must be 0..3, got ", o.decode_pdl_level));
  }
  const int level = kernels::PdlSupported() ? o.decode_pdl_level : 0;
  pdl.common = level >= 1;
  pdl.mla = level >= 2;
  pdl.moe = level >= 3;
  pdl.mla_bits = kernels::MlaDecodePdlBits(level);
  options.attention.pdl = pdl.common;
  options.linear.pdl = pdl.common;
  hidden = hidden_size;
  vocab = c.vocab_size;
  max_blocks_per_seq = (o.max_model_len + o.block_size - 1) / o.block_size;
  auto s = kernels::CudaStream::Create();
  if (!s.ok()) return s.status();
  stream = std::move(*s);
  auto l = kernels::CublasLt::Create(kernels::CublasLt::kDefaultWorkspaceBytes, options.linear);
  if (!l.ok()) return l.status();
  lt = std::move(*l);

  const int64_t T = o.max_num_tokens, S = o.max_num_seqs, NL = max_logits;
  for (const auto& [buf, n] : {std::pair{&gathered, NL * hidden}, std::pair{&logits, NL * vocab}}) {
    auto b = AllocBf16(n);
    if (!b.ok()) return b.status();
    *buf = std::move(*b);
  }
  auto sm = DeviceBuffer<int32_t>::Create(static_cast<size_t>(NL));
  if (!sm.ok()) return sm.status();
  sampled = std::move(*sm);
  auto slp = DeviceBuffer<float>::Create(static_cast<size_t>(NL));
  if (!slp.ok()) return slp.status();
  sampled_logprobs = std::move(*slp);
  // On the runner's stream: it is non-blocking, so it would not wait for a legacy-stream memset.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sampled.data(), 0, sampled.bytes(), stream.get()),
                              "cudaMemsetAsync");
  auto rows = DeviceBuffer<kernels::SamplingRow>::Create(static_cast<size_t>(NL));
  if (!rows.ok()) return rows.status();
  sampling_rows = std::move(*rows);
  if (const size_t ws = kernels::SampleRowsCudaWorkspaceBytes(NL, vocab); ws > 0) {
    auto b = DeviceBuffer<uint8_t>::Create(ws);
    if (!b.ok()) return b.status();
    sampling_ws = std::move(*b);
  }
  SLUICE_RETURN_IF_ERROR(step_outputs.Init(NL));
  if (SupportsSwaReplay()) {
    auto none = DeviceBuffer<int64_t>::Create(static_cast<size_t>(T));
    if (!none.ok()) return none.status();
    no_kv_slots = std::move(*none);
    // All bits set: -1 in every slot.
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(no_kv_slots.data(), 0xFF, no_kv_slots.bytes(), stream.get()),
        "cudaMemsetAsync no_kv_slots");
  }

  const MetaLayout max_layout = MakeLayout(T, S, NL, max_blocks_per_seq);
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

absl::Status RunnerCore::EnqueueEmbedding(const DeviceMeta& m, int64_t T, const bf16* embed,
                                          bf16* out) {
  cudaStream_t st = stream.get();
  // Fed-back ids (-(r + 1): the token sampled for row r last step) resolve in the gather.
  SLUICE_RETURN_IF_ERROR(kernels::EmbeddingFeedbackCuda(embed, vocab, hidden, m.ids, sampled.data(),
                                                        T, out, nullptr, st, pdl.common));
  Mark("embedding");
  if (step_embeddings.count > 0) {
    SLUICE_RETURN_IF_ERROR(kernels::ScatterRowsCuda(step_embeddings.values, step_embeddings.rows,
                                                    step_embeddings.count, hidden, out, T, st));
    Mark("input_embeddings");
  }
  return absl::OkStatus();
}

size_t RunnerCore::InputEmbeddingsBytes(const ForwardInput& plan, int64_t hidden) {
  const size_t n = plan.embedding_rows.size();
  return (n * sizeof(int32_t) + 15) / 16 * 16 + n * static_cast<size_t>(hidden) * sizeof(float);
}

absl::Status RunnerCore::ReserveInputEmbeddings(const ForwardInput& plan) {
  if (plan.embedding_rows.empty()) return absl::OkStatus();
  const size_t bytes = InputEmbeddingsBytes(plan, hidden);
  if (embeddings_uploaded == nullptr) {
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&embeddings_uploaded, cudaEventDisableTiming),
        "cudaEventCreate input embeddings");
  }
  if (bytes <= embeddings_staging.bytes && bytes <= embeddings_dev.bytes()) {
    return absl::OkStatus();
  }
  // Both old buffers may still be read by enqueued steps. Grown by half again, so a series of
  // growing image prompts reallocates a few times only.
  SLUICE_RETURN_IF_ERROR(stream.Synchronize());
  const size_t grown = std::max(bytes + bytes / 2, size_t{1} << 20);
  if (embeddings_staging.ptr != nullptr) cudaFreeHost(embeddings_staging.ptr);
  embeddings_staging.ptr = nullptr;
  embeddings_staging.bytes = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&embeddings_staging.ptr, grown),
                              "cudaMallocHost input embeddings");
  embeddings_staging.bytes = grown;
  embeddings_dev = DeviceBuffer<uint8_t>();
  auto dev = DeviceBuffer<uint8_t>::Create(grown);
  if (!dev.ok()) return dev.status();
  embeddings_dev = std::move(*dev);
  return absl::OkStatus();
}

absl::Status RunnerCore::StageInputEmbeddings(const ForwardInput& plan) {
  step_embeddings = StepEmbeddings{};
  if (plan.embedding_rows.empty()) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(ReserveInputEmbeddings(plan));
  // The previous image step's copy must have read the staging before it is rewritten.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(embeddings_uploaded),
                              "cudaEventSynchronize input embeddings");
  const size_t n = plan.embedding_rows.size();
  const size_t values_at = (n * sizeof(int32_t) + 15) / 16 * 16;
  const size_t bytes = InputEmbeddingsBytes(plan, hidden);
  char* host = static_cast<char*>(embeddings_staging.ptr);
  std::memcpy(host, plan.embedding_rows.data(), n * sizeof(int32_t));
  std::memcpy(host + values_at, plan.embedding_values.data(),
              plan.embedding_values.size() * sizeof(float));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(embeddings_dev.data(), host, bytes,
                                              cudaMemcpyHostToDevice, stream.get()),
                              "cudaMemcpyAsync input embeddings");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(embeddings_uploaded, stream.get()),
                              "cudaEventRecord input embeddings");
  step_embeddings.rows = reinterpret_cast<const int32_t*>(embeddings_dev.data());
  step_embeddings.values = reinterpret_cast<const float*>(embeddings_dev.data() + values_at);
  step_embeddings.count = static_cast<int64_t>(n);
  return absl::OkStatus();
}

absl::Status RunnerCore::EnqueueLogits(const DeviceMeta& m, int64_t T, int64_t N,
                                       const bf16* delta, bf16* residual,
                                       const bf16* final_norm, float eps, bf16* normed,
                                       const bf16* head) {
  if (N == 0) return absl::OkStatus();
  cudaStream_t st = stream.get();
  // Final residual add + norm over the step, then only the wanted rows go through lm_head.
  SLUICE_RETURN_IF_ERROR(
      kernels::AddRmsNormCuda(delta, residual, final_norm, normed, T, hidden, eps, st, pdl.common));
  Mark("final_norm");
  SLUICE_RETURN_IF_ERROR(
      GatherRowsCuda(normed, m.logits_rows, N, hidden, gathered.data(), st, pdl.common));
  Mark("gather_rows");
  SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(*lt, gathered.data(), head, nullptr, logits.data(), N,
                                             vocab, hidden, st));
  Mark("lm_head");
  SLUICE_RETURN_IF_ERROR(ArgmaxRowsCuda(logits.data(), N, vocab, sampled.data(), st, pdl.common));
  Mark("argmax");
  return absl::OkStatus();
}

kernels::PagedAttentionCudaBatch RunnerCore::AttnBatch(const DeviceMeta& m, int64_t t, int64_t s,
                                                       int64_t max_query_len,
                                                       int64_t max_seq_len) const {
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

absl::Status RunnerCore::Validate(const ForwardInput& in) const {
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  const int64_t S = static_cast<int64_t>(in.sequences.size());
  const int64_t N = static_cast<int64_t>(in.logits_indices.size());
  if (num_blocks == 0) return absl::FailedPreconditionError("AllocateKvCache was not called");
  if (static_cast<int64_t>(in.positions.size()) != T ||
      static_cast<int64_t>(in.slot_mapping.size()) != T) {
    return absl::InvalidArgumentError(
        "ForwardInput: token_ids, positions and slot_mapping differ in length");
  }
  if (T > options.max_num_tokens || S > options.max_num_seqs || N > max_logits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step of ", T, " tokens, ", S, " sequences, ", N, " logits rows exceeds the limits (",
        options.max_num_tokens, ", ", options.max_num_seqs, ", ", max_logits, ")"));
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
  if (!in.embedding_rows.empty() || !in.embedding_values.empty()) {
    if (!SupportsInputEmbeddings()) {
      return absl::UnimplementedError(absl::StrCat(
          "CUDA runner for ", config.architecture_name, " does not take input embeddings"));
    }
    if (static_cast<int64_t>(in.embedding_values.size()) !=
        static_cast<int64_t>(in.embedding_rows.size()) * hidden) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding_values has ", in.embedding_values.size(), " floats, expected ",
                       in.embedding_rows.size(), " x ", hidden));
    }
    // ScatterRowsCpu's rules: every row inside the step, none twice.
    std::vector<bool> seen(static_cast<size_t>(T), false);
    for (size_t r = 0; r < in.embedding_rows.size(); ++r) {
      const int32_t row = in.embedding_rows[r];
      if (row < 0 || row >= T || seen[static_cast<size_t>(row)]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input embedding ", r, ": row ", row,
            row < 0 || row >= T ? absl::StrCat(" is outside [0, ", T, ")")
                                : std::string(" is named twice")));
      }
      seen[static_cast<size_t>(row)] = true;
    }
  }
  if (!in.kv_frozen_layers.empty() || !in.sliding_kv_start.empty()) {
    if (!SupportsSwaReplay()) {
      return absl::UnimplementedError(
          absl::StrCat("CUDA runner for ", config.architecture_name,
                       " does not support kv_frozen_layers / sliding_kv_start (SWA replay)"));
    }
    if (!in.kv_frozen_layers.empty() &&
        static_cast<int64_t>(in.kv_frozen_layers.size()) != config.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("kv_frozen_layers has ",
                                                     in.kv_frozen_layers.size(),
                                                     " entries, expected ",
                                                     config.num_hidden_layers));
    }
    if (!in.sliding_kv_start.empty()) {
      if (static_cast<int64_t>(in.sliding_kv_start.size()) != S) {
        return absl::InvalidArgumentError(
            absl::StrCat("sliding_kv_start has ", in.sliding_kv_start.size(),
                         " entries, expected one per sequence (", S, ")"));
      }
      for (int64_t s = 0; s < S; ++s) {
        if (in.sliding_kv_start[s] < 0 ||
            in.sliding_kv_start[s] > in.sequences[s].num_context_tokens) {
          return absl::InvalidArgumentError(absl::StrCat(
              "sequence ", s, ": sliding_kv_start ", in.sliding_kv_start[s], " outside [0, ",
              in.sequences[s].num_context_tokens, "]"));
        }
      }
    }
  }
  return absl::OkStatus();
}

void RunnerCore::Pack(const ForwardInput& plan, const Graph& g, char* dst) const {
  const PackGeometry geometry{options.block_size, max_blocks_per_seq};
  if (g.query_len == 1) {
    PackStep(plan, g.layout, g.batch, geometry, dst);
  } else {
    PackPaddedStep(plan, g.layout, g.batch, g.query_len, geometry, dst);
  }
}

absl::StatusOr<char*> RunnerCore::AcquireStaging(size_t bytes) {
  const int i = next_staging;
  // The copy that last read this staging buffer must be done before it is rewritten.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging_done[i]), "cudaEventSynchronize");
  if (bytes > staging[i].bytes) return absl::InternalError("staging buffer too small");
  return static_cast<char*>(staging[i].ptr);
}

absl::Status RunnerCore::Upload(const char* host, size_t bytes, void* device) {
  const int i = next_staging;
  next_staging ^= 1;
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream.get()),
      "cudaMemcpyAsync step metadata");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_done[i], stream.get()), "cudaEventRecord");
  return absl::OkStatus();
}

absl::Status RunnerCore::CaptureGraphs() {
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
  std::vector<int64_t> query_lens = {1};
  for (int64_t q : options.graph_query_lens) query_lens.push_back(q);
  std::sort(query_lens.begin(), query_lens.end());
  query_lens.erase(std::unique(query_lens.begin(), query_lens.end()), query_lens.end());
  const int64_t multi_token_max = std::min({options.max_num_tokens, max_logits,
                                            options.multi_token_graph_max_tokens});
  // Fixed metadata buffers first: the workspace size is computed from the real batch.
  int64_t max_graph_tokens = 0;
  for (int64_t q : query_lens) {
    for (int64_t b : sizes) {
      if (q > 1 && (b * q > multi_token_max || q > options.max_model_len)) continue;
      Graph g;
      g.batch = b;
      g.query_len = q;
      g.layout = MakeLayout(b * q, b, b * q, max_blocks_per_seq);
      auto meta = DeviceBuffer<int64_t>::Create(g.layout.bytes / 8);
      if (!meta.ok()) return meta.status();
      g.meta = std::move(*meta);
      max_graph_tokens = std::max(max_graph_tokens, b * q);
      buckets.push_back({b, q});
      graphs.push_back(std::move(g));
    }
  }
  // One workspace serves every bucket (graphs replay one at a time on one stream).
  size_t ws_bytes = 0;
  for (const Graph& g : graphs) {
    const DeviceMeta m = MetaPointers(g.meta.data(), g.layout);
    ws_bytes = std::max(ws_bytes,
                        AttentionWorkspaceBytes(AttnBatch(m, g.batch * g.query_len, g.batch,
                                                          g.query_len, options.max_model_len)));
  }
  auto ws = DeviceBuffer<uint8_t>::Create(ws_bytes);
  if (!ws.ok()) return ws.status();
  graph_ws = std::move(*ws);
  ForwardInput empty;
  // The bucket shapes' GEMMs are tuned once, in the eager run before each capture (and only
  // there, so Step never synchronizes to tune): weight-streaming shapes gain most from the
  // choice (GEMV for m <= 8, else the fastest of cuBLASLt's candidates rather than its first).
  if (options.autotune_gemms && !options.gemm_tuning.empty()) {
    SLUICE_RETURN_IF_ERROR(LoadGemmTuningOnce(options.gemm_tuning));
  }
  if (options.autotune_gemms && !graphs.empty()) lt->set_autotune(max_graph_tokens);
  // One set-aside share for all buckets, sized for the largest one's window (a re-capture
  // gives back the share it took before).
  if (l2_set_aside > 0) L2ReleaseSetAside();
  l2_set_aside = 0;
  if (options.l2_persist_activations && !graphs.empty()) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&l2_device), "cudaGetDevice");
    auto set_aside = L2SetAsideFor(HotActivations(sizes.back()).bytes);
    if (!set_aside.ok()) return set_aside.status();
    l2_set_aside = *set_aside;
  }
  for (Graph& g : graphs) {
    auto host = AcquireStaging(g.layout.bytes);
    if (!host.ok()) return host.status();
    Pack(empty, g, *host);  // all rows inert
    SLUICE_RETURN_IF_ERROR(Upload(*host, g.layout.bytes, g.meta.data()));
    SLUICE_RETURN_IF_ERROR(CaptureBucket(g, &g.graph, &g.exec));
    // Multi-token buckets are not captured bounded: such steps (an SWA replay's bounded
    // sliding attention while speculating) run eagerly.
    if (g.query_len == 1 && CapturesBoundedGraphs()) {
      bounded_sliding = true;
      const absl::Status captured = CaptureBucket(g, &g.bounded_graph, &g.bounded_exec);
      bounded_sliding = false;
      SLUICE_RETURN_IF_ERROR(captured);
    }
  }
  lt->set_autotune(0);
  if (options.autotune_gemms && !options.gemm_tuning_save.empty()) {
    absl::StatusOr<std::string> saved = kernels::SaveGemmTuning(options.gemm_tuning_save);
    if (!saved.ok()) return saved.status();
  }
  return stream.Synchronize();
}

bool RunnerCore::CapturesBoundedGraphs() const {
  return SupportsSwaReplay() && config.sliding_window > 0 &&
         std::any_of(config.layer_is_sliding.begin(), config.layer_is_sliding.end(),
                     [](bool sliding) { return sliding; });
}

absl::Status RunnerCore::CaptureBucket(const Graph& g, cudaGraph_t* graph,
                                       cudaGraphExec_t* exec) {
  const int64_t b = g.batch, q = g.query_len, t = b * q;
  const DeviceMeta m = MetaPointers(g.meta.data(), g.layout);
  // Eager run first: cuBLASLt picks and caches its plans outside the capture.
  SLUICE_RETURN_IF_ERROR(Enqueue(m, t, b, t, q, options.max_model_len, graph_ws.data()));
  SLUICE_RETURN_IF_ERROR(stream.Synchronize());
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal),
      "cudaStreamBeginCapture");
  absl::Status enq = Enqueue(m, t, b, t, q, options.max_model_len, graph_ws.data());
  const cudaError_t end = cudaStreamEndCapture(stream.get(), graph);
  SLUICE_RETURN_IF_ERROR(enq);
  SLUICE_CUDA_RETURN_IF_ERROR(end, "cudaStreamEndCapture");
  if (l2_set_aside > 0) {
    auto changed = PersistInGraph(*graph, HotActivations(t), l2_set_aside);
    if (!changed.ok()) return changed.status();
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(exec, *graph, 0), "cudaGraphInstantiate");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ProfileEntry>> RunnerCore::ProfileStep(const ForwardInput& plan,
                                                                  int64_t hold_ms) {
  RunnerCore& m = *this;
  SLUICE_RETURN_IF_ERROR(m.Validate(plan));
  int64_t max_q = 0, max_len = 0;  // (unused: the eager path recomputes them)
  // Grown here, before the hold: growing it synchronizes, which would end the hold early.
  if (!plan.token_ids.empty()) {
    SLUICE_RETURN_IF_ERROR(m.ReserveEagerWorkspace(plan, &max_q, &max_len));
    SLUICE_RETURN_IF_ERROR(m.ReserveInputEmbeddings(plan));
  }
  SLUICE_RETURN_IF_ERROR(m.stream.Synchronize());
  // Hold the GPU while the host enqueues, so the kernels then run back to back as they would
  // from a graph instead of waiting on the host's launches.
  SLUICE_RETURN_IF_ERROR(SpinCuda(hold_ms * 1000000, m.stream.get()));
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

absl::Status RunnerCore::ReserveEagerWorkspace(const ForwardInput& plan,
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
  const size_t ws = AttentionWorkspaceBytes(AttnBatch(meta, T, S, *max_q, *max_len));
  if (ws > eager_ws.size()) {
    SLUICE_RETURN_IF_ERROR(stream.Synchronize());  // the old workspace may be in use
    eager_ws = DeviceBuffer<uint8_t>();
    auto b = DeviceBuffer<uint8_t>::Create(ws);
    if (!b.ok()) return b.status();
    eager_ws = std::move(*b);
  }
  return absl::OkStatus();
}

RunnerCore::Graph* RunnerCore::FindGraph(const ForwardInput& plan, bool bounded) {
  const int i = FindGraphBucket(plan, buckets, options.max_model_len, bounded,
                                CapturesBoundedGraphs());
  return i < 0 ? nullptr : &graphs[static_cast<size_t>(i)];
}

absl::Status RunnerCore::EnqueueStep(const ForwardInput& plan, bool allow_graph) {
  RunnerCore& m = *this;
  SLUICE_RETURN_IF_ERROR(m.Validate(plan));
  const int64_t T = static_cast<int64_t>(plan.token_ids.size());
  const int64_t S = static_cast<int64_t>(plan.sequences.size());
  const int64_t N = static_cast<int64_t>(plan.logits_indices.size());
  m.last = StepInfo{.num_tokens = T, .num_logits = N};
  if (T == 0) {
    m.prev_num_logits = 0;
    return absl::OkStatus();
  }
  // A step with a per-layer KV hook runs eagerly: the graphs record no layer events. So does a
  // step with frozen layers (the graphs write every layer) and one with input embeddings (image
  // placeholders of one-token prefill chunks: the graphs splice none). A decode step with a
  // sliding_kv_start > 0 replays the bucket's bounded graph, where there is one.
  const bool bounded = std::any_of(plan.sliding_kv_start.begin(), plan.sliding_kv_start.end(),
                                   [](int32_t start) { return start > 0; });
  Graph* g = allow_graph && !plan.on_layer_kv_written && plan.kv_frozen_layers.empty() &&
                     plan.embedding_rows.empty()
                 ? m.FindGraph(plan, bounded)
                 : nullptr;
  if (g != nullptr) {
    auto host = m.AcquireStaging(g->layout.bytes);
    if (!host.ok()) return host.status();
    m.Pack(plan, *g, *host);
    SLUICE_RETURN_IF_ERROR(m.Upload(*host, g->layout.bytes, g->meta.data()));
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaGraphLaunch(bounded ? g->bounded_exec : g->exec, m.stream.get()), "cudaGraphLaunch");
    m.last.graph = true;
    m.last.graph_batch = g->batch;
    m.last.graph_query_len = g->query_len;
    m.prev_num_logits = N;
    return absl::OkStatus();
  }
  int64_t max_q = 0, max_len = 0;
  SLUICE_RETURN_IF_ERROR(m.ReserveEagerWorkspace(plan, &max_q, &max_len));
  const MetaLayout layout = MakeLayout(T, S, N, m.max_blocks_per_seq);
  const DeviceMeta meta = MetaPointers(m.eager_meta.data(), layout);
  auto host = m.AcquireStaging(layout.bytes);
  if (!host.ok()) return host.status();
  PackStep(plan, layout, S, PackGeometry{m.options.block_size, m.max_blocks_per_seq}, *host);
  SLUICE_RETURN_IF_ERROR(m.Upload(*host, layout.bytes, m.eager_meta.data()));
  SLUICE_RETURN_IF_ERROR(m.StageInputEmbeddings(plan));
  // A step without logits rows samples nothing and leaves `sampled` as it was: the next step's
  // token references still mean the rows of the last step that had some. (An SWA replay runs
  // as such a step between two asynchronous sampled steps of the engine.)
  if (N > 0) m.prev_num_logits = N;
  m.layer_hook = plan.on_layer_kv_written ? &plan.on_layer_kv_written : nullptr;
  m.frozen_layers = plan.kv_frozen_layers.empty() ? nullptr : &plan.kv_frozen_layers;
  m.bounded_sliding = bounded;
  const absl::Status enqueued = m.Enqueue(meta, T, S, N, max_q, max_len, m.eager_ws.data());
  m.layer_hook = nullptr;
  m.frozen_layers = nullptr;
  m.bounded_sliding = false;
  m.step_embeddings = StepEmbeddings{};
  return enqueued;
}

absl::StatusOr<std::vector<int32_t>> RunnerCore::SampledTokens() {
  RunnerCore& m = *this;
  std::vector<int32_t> out(static_cast<size_t>(m.last.num_logits));
  if (!out.empty()) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), m.sampled.data(),
                                                out.size() * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, m.stream.get()),
                                "cudaMemcpyAsync sampled");
  }
  SLUICE_RETURN_IF_ERROR(m.stream.Synchronize());
  return out;
}

absl::Status RunnerCore::SampledGreedy(absl::Span<GreedyToken> out) {
  const int64_t n = last.num_logits;
  if (static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("SampledGreedy: ", out.size(),
                                                   " outputs for ", n, " logits rows"));
  }
  if (n == 0) return stream.Synchronize();
  // Enqueued after the step (graph or eager) on the same stream: reads its logits and argmax.
  SLUICE_RETURN_IF_ERROR(GreedyLogprobRowsCuda(logits.data(), sampled.data(), n, vocab,
                                               sampled_logprobs.data(), stream.get()));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::vector<float> logprobs(static_cast<size_t>(n));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ids.data(), sampled.data(), n * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, stream.get()),
                              "cudaMemcpyAsync sampled");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logprobs.data(), sampled_logprobs.data(),
                                              n * sizeof(float), cudaMemcpyDeviceToHost,
                                              stream.get()),
                              "cudaMemcpyAsync sampled logprobs");
  SLUICE_RETURN_IF_ERROR(stream.Synchronize());
  for (int64_t r = 0; r < n; ++r) out[r] = GreedyToken{ids[r], logprobs[r]};
  return absl::OkStatus();
}

namespace {

// Checks a DeviceLogitsProcessing against a step of n rows (Model::EnqueueProcessedSampledStep).
absl::Status ValidateProcessing(const Model::DeviceLogitsProcessing& p, int64_t n,
                                int64_t vocab) {
  const int64_t rows = static_cast<int64_t>(p.rows.size());
  const int64_t tops = static_cast<int64_t>(p.top_logprobs.size());
  if ((rows != 0 && rows != n) || (tops != 0 && tops != n)) {
    return absl::InvalidArgumentError(absl::StrCat("logits processing of ", rows, " rows and ",
                                                   tops, " top-logprob counts for ", n,
                                                   " sampling rows"));
  }
  const int64_t num_ids = static_cast<int64_t>(p.ids.size());
  auto range_ok = [num_ids](int32_t begin, int32_t end) {
    return begin >= 0 && begin <= end && end <= num_ids;
  };
  for (const kernels::LogitsProcessingRow& r : p.rows) {
    if (!range_ok(r.prompt_begin, r.prompt_end) || !range_ok(r.output_begin, r.output_end) ||
        !range_ok(r.suppress_begin, r.suppress_end)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logits processing list outside the ", num_ids, " ids"));
    }
    if (r.mask_begin >= 0 && static_cast<int64_t>(r.mask_begin) + kernels::MaskWords(vocab) >
                                 static_cast<int64_t>(p.masks.size())) {
      return absl::InvalidArgumentError(absl::StrCat("grammar mask at word ", r.mask_begin,
                                                     " outside the ", p.masks.size(), " words"));
    }
  }
  for (int32_t c : p.top_logprobs) {
    if (c < 0 || c > kernels::kMaxTopLogprobs) {
      return absl::InvalidArgumentError(absl::StrCat("top logprobs ", c, " outside [0, ",
                                                     kernels::kMaxTopLogprobs, "]"));
    }
  }
  return absl::OkStatus();
}

// Grows pinned host memory to `bytes` (its old contents are dropped; the caller knows no copy
// still reads it).
absl::Status EnsurePinned(PinnedBuffer& b, size_t bytes) {
  if (b.bytes >= bytes) return absl::OkStatus();
  if (b.ptr != nullptr) cudaFreeHost(b.ptr);
  b.ptr = nullptr;
  b.bytes = 0;
  const size_t grown = std::max(bytes, size_t{1} << 16);
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&b.ptr, grown), "cudaMallocHost");
  b.bytes = grown;
  return absl::OkStatus();
}

}  // namespace

namespace {

// Rows of `processing` that penalize placeholder ids: the previous step's tokens.
bool HasPlaceholderIds(const Model::DeviceLogitsProcessing* processing) {
  return processing != nullptr && std::any_of(processing->ids.begin(), processing->ids.end(),
                                              [](int32_t id) { return id < 0; });
}

bool Processes(const Model::DeviceLogitsProcessing* processing) {
  return processing != nullptr &&
         (!processing->rows.empty() || !processing->top_logprobs.empty());
}

}  // namespace

absl::Status RunnerCore::EnqueueSampledStep(const ForwardInput& plan,
                                            absl::Span<const kernels::SamplingRow> rows,
                                            const Model::DeviceLogitsProcessing* processing) {
  const int64_t n = static_cast<int64_t>(plan.logits_indices.size());
  if (static_cast<int64_t>(rows.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("EnqueueSampledStep: ", rows.size(),
                                                   " sampling rows for ", n, " logits rows"));
  }
  // Everything that can refuse the step is checked before its forward is enqueued.
  const bool process = Processes(processing);
  if (process) SLUICE_RETURN_IF_ERROR(ValidateProcessing(*processing, n, vocab));
  if (step_outputs.num_unread() >= Model::kMaxUnreadSteps) {
    return absl::FailedPreconditionError(absl::StrCat(
        Model::kMaxUnreadSteps, " sampled steps are unread: read one before enqueuing another"));
  }
  SLUICE_RETURN_IF_ERROR(EnqueueForward(plan, process && HasPlaceholderIds(processing)));
  return EnqueueSampling(rows, processing);
}

absl::Status RunnerCore::EnqueueForwardStep(const ForwardInput& plan) {
  if (step_outputs.num_unread() >= Model::kMaxUnreadSteps) {
    return absl::FailedPreconditionError(absl::StrCat(
        Model::kMaxUnreadSteps, " sampled steps are unread: read one before enqueuing another"));
  }
  // The processing is not known yet: keep the fed-back tokens in case it penalizes them.
  return EnqueueForward(plan, /*keep_fed_back=*/true);
}

absl::Status RunnerCore::EnqueueStepSampling(absl::Span<const kernels::SamplingRow> rows,
                                             const Model::DeviceLogitsProcessing* processing) {
  return EnqueueSampling(rows, processing);
}

absl::Status RunnerCore::EnqueueForward(const ForwardInput& plan, bool keep_fed_back) {
  if (pending_sampling.has_value()) {
    return absl::FailedPreconditionError("a forward step is still waiting for its sampling");
  }
  // The step's forward overwrites `sampled` (its argmax) after its embedding read the fed-back
  // tokens: keep them for the penalties' placeholder ids.
  const int64_t prev_n = keep_fed_back ? prev_num_logits : 0;
  if (prev_n > 0) {
    SLUICE_RETURN_IF_ERROR(EnsureProcessingBuffers());
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(prev_sampled_copy.data(), sampled.data(),
                                                prev_n * sizeof(int32_t),
                                                cudaMemcpyDeviceToDevice, stream.get()),
                                "cudaMemcpyAsync fed-back tokens");
  }
  SLUICE_RETURN_IF_ERROR(EnqueueStep(plan, /*allow_graph=*/true));
  pending_sampling = PendingSampling{static_cast<int64_t>(plan.logits_indices.size()), prev_n};
  return absl::OkStatus();
}

absl::Status RunnerCore::EnqueueSampling(absl::Span<const kernels::SamplingRow> rows,
                                         const Model::DeviceLogitsProcessing* processing) {
  if (!pending_sampling.has_value()) {
    return absl::FailedPreconditionError("no forward step is waiting for its sampling");
  }
  const PendingSampling pending = *pending_sampling;
  pending_sampling.reset();  // whatever happens below, the next call is a forward
  const int64_t n = pending.num_logits;
  if (static_cast<int64_t>(rows.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("EnqueueStepSampling: ", rows.size(),
                                                   " sampling rows for ", n, " logits rows"));
  }
  const bool process = Processes(processing);
  if (process) SLUICE_RETURN_IF_ERROR(ValidateProcessing(*processing, n, vocab));
  auto slot = step_outputs.Acquire(n);
  if (!slot.ok()) return slot.status();
  processing_slots[*slot].top_counts.clear();
  kernels::SamplingRow* staged = step_outputs.params(*slot);
  std::copy(rows.begin(), rows.end(), staged);
  const bool placeholders = process && pending.fed_back_rows > 0 && HasPlaceholderIds(processing);
  if (process) SLUICE_RETURN_IF_ERROR(EnsureProcessingBuffers());
  if (n > 0) {
    if (process) {
      SLUICE_RETURN_IF_ERROR(EnqueueProcessing(*processing, *slot, staged, n,
                                               placeholders ? pending.fed_back_rows : 0));
    } else {
      SLUICE_RETURN_IF_ERROR(EnqueueRowSampling(staged, n));
    }
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(step_outputs.ids(*slot), sampled.data(),
                                                n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                                stream.get()),
                                "cudaMemcpyAsync sampled");
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(step_outputs.logprobs(*slot), sampled_logprobs.data(),
                        n * sizeof(float), cudaMemcpyDeviceToHost, stream.get()),
        "cudaMemcpyAsync sampled logprobs");
  }
  return step_outputs.Commit(*slot, stream.get());
}

absl::Status RunnerCore::EnsureProcessingBuffers() {
  if (processed_logits.data() != nullptr) return absl::OkStatus();
  const int64_t S = max_logits;
  auto pl = DeviceBuffer<float>::Create(static_cast<size_t>(S * vocab));
  if (!pl.ok()) return pl.status();
  auto ws = DeviceBuffer<uint8_t>::Create(kernels::LogitsProcessingCudaWorkspaceBytes(S, vocab));
  if (!ws.ok()) return ws.status();
  auto prev = DeviceBuffer<int32_t>::Create(static_cast<size_t>(S));
  if (!prev.ok()) return prev.status();
  auto ti = DeviceBuffer<int32_t>::Create(static_cast<size_t>(S * kernels::kMaxTopLogprobs));
  if (!ti.ok()) return ti.status();
  auto tl = DeviceBuffer<float>::Create(static_cast<size_t>(S * kernels::kMaxTopLogprobs));
  if (!tl.ok()) return tl.status();
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws->data(), 0, ws->bytes(), stream.get()),
                              "cudaMemsetAsync");
  processing_ws = std::move(*ws);
  prev_sampled_copy = std::move(*prev);
  top_ids_dev = std::move(*ti);
  top_logprobs_dev = std::move(*tl);
  processed_logits = std::move(*pl);
  return absl::OkStatus();
}

absl::Status RunnerCore::EnqueueProcessing(const Model::DeviceLogitsProcessing& processing,
                                           int slot, const kernels::SamplingRow* staged,
                                           int64_t n, int64_t prev_n) {
  ProcessingSlot& ps = processing_slots[slot];
  const bool penalize = !processing.rows.empty();
  const bool top = std::any_of(processing.top_logprobs.begin(), processing.top_logprobs.end(),
                               [](int32_t c) { return c > 0; });
  // Upload layout: [n rows][n top counts][ids][masks]; every part 4-byte aligned.
  const size_t rows_bytes = penalize ? n * sizeof(kernels::LogitsProcessingRow) : 0;
  const size_t counts_bytes = top ? n * sizeof(int32_t) : 0;
  const size_t ids_bytes = penalize ? processing.ids.size() * sizeof(int32_t) : 0;
  const size_t masks_bytes = penalize ? processing.masks.size() * sizeof(uint32_t) : 0;
  const size_t bytes = rows_bytes + counts_bytes + ids_bytes + masks_bytes;
  if (bytes > 0) {
    SLUICE_RETURN_IF_ERROR(EnsurePinned(ps.upload, bytes));
    if (bytes > processing_upload.bytes()) {
      SLUICE_RETURN_IF_ERROR(stream.Synchronize());  // the old buffer may be in use
      processing_upload = DeviceBuffer<uint8_t>();
      auto b = DeviceBuffer<uint8_t>::Create(std::max(bytes, size_t{1} << 16) * 2);
      if (!b.ok()) return b.status();
      processing_upload = std::move(*b);
    }
    char* host = static_cast<char*>(ps.upload.ptr);
    if (penalize) std::memcpy(host, processing.rows.data(), rows_bytes);
    if (top) std::memcpy(host + rows_bytes, processing.top_logprobs.data(), counts_bytes);
    if (penalize && ids_bytes > 0) {
      std::memcpy(host + rows_bytes + counts_bytes, processing.ids.data(), ids_bytes);
    }
    if (masks_bytes > 0) {
      std::memcpy(host + rows_bytes + counts_bytes + ids_bytes, processing.masks.data(),
                  masks_bytes);
    }
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(processing_upload.data(), host, bytes,
                                                cudaMemcpyHostToDevice, stream.get()),
                                "cudaMemcpyAsync logits processing");
  }
  uint8_t* dev = processing_upload.data();
  const auto* d_rows = reinterpret_cast<const kernels::LogitsProcessingRow*>(dev);
  const auto* d_counts = reinterpret_cast<const int32_t*>(dev + rows_bytes);
  const auto* d_ids = reinterpret_cast<const int32_t*>(dev + rows_bytes + counts_bytes);
  const auto* d_masks =
      reinterpret_cast<const uint32_t*>(dev + rows_bytes + counts_bytes + ids_bytes);
  if (penalize) {
    SLUICE_RETURN_IF_ERROR(kernels::LogitsProcessingCuda(
        logits.data(), n, vocab, d_rows, ids_bytes > 0 ? d_ids : nullptr,
        masks_bytes > 0 ? d_masks : nullptr, prev_n > 0 ? prev_sampled_copy.data() : nullptr,
        prev_n, processed_logits.data(),
        processing_ws.data(), processing_ws.bytes(), stream.get()));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sampling_rows.data(), staged,
                                                n * sizeof(kernels::SamplingRow),
                                                cudaMemcpyHostToDevice, stream.get()),
                                "cudaMemcpyAsync sampling rows");
    // Every row (greedy ones too: argmax of the processed logits) from the fp32 rows.
    SLUICE_RETURN_IF_ERROR(kernels::SampleRowsCuda(
        processed_logits.data(), n, vocab, sampling_rows.data(), sampled.data(),
        sampled_logprobs.data(), sampling_ws.data(), sampling_ws.bytes(), stream.get()));
  } else {
    SLUICE_RETURN_IF_ERROR(EnqueueRowSampling(staged, n));
  }
  // Logprobs of the raw logits (SampleToken's), replacing the processed ones, and top entries.
  const int32_t max_top = top ? kernels::kMaxTopLogprobs : 0;
  SLUICE_RETURN_IF_ERROR(kernels::LogprobRowsCuda(
      logits.data(), n, vocab, masks_bytes > 0 ? d_rows : nullptr,
      masks_bytes > 0 ? d_masks : nullptr, sampled.data(), top ? d_counts : nullptr, max_top,
      sampled_logprobs.data(), top_ids_dev.data(), top_logprobs_dev.data(), stream.get()));
  if (top) {
    const size_t entries = static_cast<size_t>(n) * kernels::kMaxTopLogprobs;
    SLUICE_RETURN_IF_ERROR(EnsurePinned(ps.top, entries * (sizeof(int32_t) + sizeof(float))));
    auto* top_ids = static_cast<int32_t*>(ps.top.ptr);
    auto* top_lps = reinterpret_cast<float*>(top_ids + entries);
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top_ids, top_ids_dev.data(),
                                                entries * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream.get()),
                                "cudaMemcpyAsync top ids");
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top_lps, top_logprobs_dev.data(),
                                                entries * sizeof(float), cudaMemcpyDeviceToHost,
                                                stream.get()),
                                "cudaMemcpyAsync top logprobs");
    ps.top_counts = processing.top_logprobs;
  }
  return absl::OkStatus();
}

absl::Status RunnerCore::ReadSampledStep(absl::Span<GreedyToken> out) {
  return step_outputs.ReadOldest(out);
}

absl::Status RunnerCore::ReadSampledStepWithTop(
    absl::Span<GreedyToken> out, absl::Span<std::vector<kernels::TopLogprob>> top) {
  if (top.size() != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ReadSampledStepWithTop: ", top.size(),
                                                   " top lists for ", out.size(), " rows"));
  }
  const int slot = step_outputs.oldest_slot();
  SLUICE_RETURN_IF_ERROR(step_outputs.ReadOldest(out));  // waits for the step's copies
  const ProcessingSlot& ps = processing_slots[slot];
  const size_t entries = out.size() * kernels::kMaxTopLogprobs;
  const auto* top_ids = static_cast<const int32_t*>(ps.top.ptr);
  const auto* top_lps = reinterpret_cast<const float*>(top_ids + entries);
  for (size_t r = 0; r < top.size(); ++r) {
    top[r].clear();
    if (ps.top_counts.empty()) continue;
    for (int32_t j = 0; j < ps.top_counts[r]; ++j) {
      const size_t at = r * kernels::kMaxTopLogprobs + j;
      if (top_ids[at] < 0) break;  // fewer entries than asked (NaN logits)
      top[r].push_back(kernels::TopLogprob{top_ids[at], top_lps[at]});
    }
  }
  return absl::OkStatus();
}

absl::Status RunnerCore::EnqueueRowSampling(const kernels::SamplingRow* staged, int64_t n) {
  const bool draws = std::any_of(staged, staged + n, [](const kernels::SamplingRow& r) {
    return r.temperature >= kernels::kGreedyTemperature;
  });
  if (!draws) {
    // The step ended in the device argmax: only the chosen tokens' logprobs are missing.
    return GreedyLogprobRowsCuda(logits.data(), sampled.data(), n, vocab,
                                 sampled_logprobs.data(), stream.get());
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sampling_rows.data(), staged,
                                              n * sizeof(kernels::SamplingRow),
                                              cudaMemcpyHostToDevice, stream.get()),
                              "cudaMemcpyAsync sampling rows");
  // Greedy rows get the same argmax again (lowest id on ties), so one launch serves all rows.
  return kernels::SampleRowsCuda(logits.data(), n, vocab, sampling_rows.data(), sampled.data(),
                                 sampled_logprobs.data(), sampling_ws.data(), sampling_ws.bytes(),
                                 stream.get());
}

absl::StatusOr<std::vector<float>> RunnerCore::Logits() {
  RunnerCore& m = *this;
  const size_t n = static_cast<size_t>(m.last.num_logits * m.vocab);
  std::vector<kernels::bf16> bits(n);
  if (n > 0) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bits.data(), m.logits.data(),
                                                n * sizeof(kernels::bf16),
                                                cudaMemcpyDeviceToHost, m.stream.get()),
                                "cudaMemcpyAsync logits");
  }
  SLUICE_RETURN_IF_ERROR(m.stream.Synchronize());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = kernels::Bf16ToFloat(bits[i]);
  return out;
}

absl::Status RunnerCore::AllocateKvCache(int64_t blocks) {
  if (blocks < 1) return absl::InvalidArgumentError("AllocateKvCache: num_blocks < 1");
  SLUICE_RETURN_IF_ERROR(stream.Synchronize());
  num_blocks = 0;
  SLUICE_RETURN_IF_ERROR(AllocateCache(blocks));
  num_blocks = blocks;
  prev_num_logits = 0;
  pending_sampling.reset();
  step_outputs.Clear();  // the stream is idle: nothing unread can refer to the old cache
  return CaptureGraphs();
}

// ---- CudaRunner: the public surface over a RunnerCore.

CudaRunner::CudaRunner(std::unique_ptr<RunnerCore> core) : core_(std::move(core)) {}
CudaRunner::~CudaRunner() {
  // Before the model's buffers go: work still queued may read them.
  if (core_ != nullptr && core_->stream.get() != nullptr) (void)core_->stream.Synchronize();
}

const ModelConfig& CudaRunner::config() const { return core_->config; }
const CudaRunnerOptions& CudaRunner::options() const { return core_->options; }
int64_t CudaRunner::WeightBytesPerStep() const { return core_->WeightBytes(); }
int64_t CudaRunner::ActiveWeightBytesPerToken() const { return core_->ActiveWeightBytes(); }
int64_t CudaRunner::KvBytesPerToken() const { return core_->KvBytesPerToken(); }
bool CudaRunner::SupportsSwaReplay() const { return core_->SupportsSwaReplay(); }
bool CudaRunner::SupportsInputEmbeddings() const { return core_->SupportsInputEmbeddings(); }
int64_t CudaRunner::max_num_logits() const { return core_->max_logits; }

double CudaRunner::kernel_setup_seconds() const {
  return core_->lt != nullptr ? core_->lt->setup_seconds() : 0.0;
}
KvCacheSpec CudaRunner::kv_cache_spec() const { return core_->CacheSpec(); }
absl::Status CudaRunner::AllocateKvCache(int64_t num_blocks) {
  return core_->AllocateKvCache(num_blocks);
}
int64_t CudaRunner::num_blocks() const { return core_->num_blocks; }
std::vector<DeviceKvArray> CudaRunner::KvArrays() const {
  if (core_->num_blocks == 0) return {};
  return core_->CacheArrays();
}
absl::Status CudaRunner::Step(const ForwardInput& plan) {
  return core_->EnqueueStep(plan, /*allow_graph=*/true);
}
const StepInfo& CudaRunner::last_step() const { return core_->last; }
absl::StatusOr<std::vector<ProfileEntry>> CudaRunner::ProfileStep(const ForwardInput& plan,
                                                                  int64_t hold_ms) {
  return core_->ProfileStep(plan, hold_ms);
}
std::string CudaRunner::GemmPlans() { return core_->lt->DescribePlans(); }
absl::StatusOr<std::vector<int32_t>> CudaRunner::SampledTokens() { return core_->SampledTokens(); }
absl::StatusOr<std::vector<float>> CudaRunner::Logits() { return core_->Logits(); }
absl::Status CudaRunner::SampledGreedy(absl::Span<GreedyToken> out) {
  return core_->SampledGreedy(out);
}
absl::Status CudaRunner::EnqueueSampledStep(const ForwardInput& plan,
                                            absl::Span<const kernels::SamplingRow> rows) {
  return core_->EnqueueSampledStep(plan, rows);
}
absl::Status CudaRunner::ReadSampledStep(absl::Span<GreedyToken> out) {
  return core_->ReadSampledStep(out);
}
absl::Status CudaRunner::EnqueueProcessedSampledStep(
    const ForwardInput& plan, absl::Span<const kernels::SamplingRow> rows,
    const Model::DeviceLogitsProcessing& processing) {
  return core_->EnqueueSampledStep(plan, rows, &processing);
}
absl::Status CudaRunner::EnqueueForwardStep(const ForwardInput& plan) {
  return core_->EnqueueForwardStep(plan);
}
absl::Status CudaRunner::EnqueueStepSampling(absl::Span<const kernels::SamplingRow> rows,
                                             const Model::DeviceLogitsProcessing& processing) {
  return core_->EnqueueStepSampling(rows, &processing);
}
absl::Status CudaRunner::ReadSampledStepWithTop(
    absl::Span<GreedyToken> out, absl::Span<std::vector<kernels::TopLogprob>> top) {
  return core_->ReadSampledStepWithTop(out, top);
}
int CudaRunner::NumUnreadSteps() const { return core_->step_outputs.num_unread(); }
absl::Status CudaRunner::Synchronize() { return core_->stream.Synchronize(); }
const void* CudaRunner::ReadFence() const { return core_->step_outputs.last_read_event(); }
absl::StatusOr<const void*> CudaRunner::TailFence() {
  RunnerCore& m = *core_;
  if (m.tail_fence == nullptr) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.tail_fence, cudaEventDisableTiming),
                                "cudaEventCreate");
  }
  // A stream that waits on the event keeps the state it had then: re-recording is safe.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.tail_fence, m.stream.get()), "cudaEventRecord");
  return static_cast<const void*>(m.tail_fence);
}
absl::Status CudaRunner::WaitFence(const void* fence) {
  if (fence == nullptr) return absl::OkStatus();
  cudaEvent_t event = static_cast<cudaEvent_t>(const_cast<void*>(fence));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(core_->stream.get(), event, 0),
                              "cudaStreamWaitEvent");
  return absl::OkStatus();
}

}  // namespace sluice::cuda_runner
