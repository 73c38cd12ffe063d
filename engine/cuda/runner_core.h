// RunnerCore: the architecture-independent part of a CUDA model runner (cuda_runner.h) — plan
// validation, step metadata packed into pinned staging memory and sent with one copy, decode
// CUDA graphs captured per batch bucket, the embedding / final-rows / lm_head / argmax ends of
// the forward pass, weight upload (checkpoint or dummy), profiling. A model (CudaLlamaRunner,
// CudaDeepseekRunner) derives from it and implements the decoder layers (Enqueue), its KV cache
// and its attention workspace size. Internal to engine/cuda.
#ifndef SLUICE_ENGINE_CUDA_RUNNER_CORE_H_
#define SLUICE_ENGINE_CUDA_RUNNER_CORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_runner.h"
#include "engine/cuda/l2_persist.h"
#include "engine/cuda/step_meta.h"
#include "engine/cuda/step_output_ring.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/linear/linear_cuda.h"

namespace sluice::cuda_runner {

using kernels::bf16;
using kernels::DeviceBuffer;

// Device pointers of one step's metadata.
struct DeviceMeta {
  const int64_t* slots;
  int32_t* ids;
  const int32_t* positions;
  const int32_t* query_start;
  const int32_t* context_lens;
  const int32_t* logits_rows;
  const int32_t* block_tables;
  // [S] ForwardInput::sliding_kv_start (zeros when the plan has none).
  const int32_t* sliding_start;
};

DeviceMeta MetaPointers(void* base, const MetaLayout& l);

// Where weights come from: a safetensors checkpoint (converted to bf16) or the dummy rule.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Writes tensor `name` of `shape` to device memory `dst` (element count = product of shape).
  virtual absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape,
                            DummyInit dummy_init, bf16* dst, cudaStream_t stream) = 0;
  // Same, kept in float32 (small tensors the model reads in fp32, e.g. DeepSeek's
  // e_score_correction_bias). Synchronous.
  virtual absl::Status FillFloat(const std::string& name, const std::vector<int64_t>& shape,
                                 DummyInit dummy_init, float* dst) = 0;
  // True when the source holds tensor `name` (a checkpoint's layout probe, e.g. LLaVA's nested
  // language-model names); dummy weights follow the plain layout and answer false.
  virtual bool Contains(const std::string& name) const { return false; }
};

// CheckpointSource: tensors of a safetensors checkpoint, converted to bf16 on the host and
// copied synchronously.
class CheckpointSource : public WeightSource {
 public:
  explicit CheckpointSource(std::unique_ptr<Checkpoint> ckpt) : ckpt_(std::move(ckpt)) {}
  absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape, DummyInit,
                    bf16* dst, cudaStream_t stream) override;
  absl::Status FillFloat(const std::string& name, const std::vector<int64_t>& shape, DummyInit,
                         float* dst) override;
  bool Contains(const std::string& name) const override { return ckpt_->Contains(name); }

 private:
  std::unique_ptr<Checkpoint> ckpt_;
  std::vector<bf16> bits_;
};

// DummySource: engine/model/dummy_weights.h values generated on the device.
class DummySource : public WeightSource {
 public:
  explicit DummySource(uint64_t seed) : seed_(seed) {}
  absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape,
                    DummyInit dummy_init, bf16* dst, cudaStream_t stream) override;
  // The values of Fill widened back to float32 (the CPU dummy checkpoint stores bf16 too).
  absl::Status FillFloat(const std::string& name, const std::vector<int64_t>& shape,
                         DummyInit dummy_init, float* dst) override;

 private:
  uint64_t seed_;
};

absl::StatusOr<DeviceBuffer<bf16>> AllocBf16(int64_t n);

// AllocFill allocates `buf` for `shape` and fills it with tensor `name`.
absl::Status AllocFill(WeightSource& src, DeviceBuffer<bf16>* buf, const std::string& name,
                       const std::vector<int64_t>& shape, DummyInit init, cudaStream_t stream);

// One row block of a fused weight.
struct WeightPart {
  std::string name;
  int64_t rows;
};
// AllocFillFused allocates `buf` [Σ rows, cols] and writes the parts row block after row block
// (cols == 1: vectors, e.g. fused biases).
absl::Status AllocFillFused(WeightSource& src, DeviceBuffer<bf16>* buf,
                            const std::vector<WeightPart>& parts, int64_t cols, DummyInit init,
                            cudaStream_t stream);

// RAII pinned host memory.
struct PinnedBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }
};

class RunnerCore {
 public:
  virtual ~RunnerCore();

  // ---- Model hooks.
  // Enqueue enqueues the forward of a staged step (metadata m: T tokens, S sequences, N logits
  // rows; attention bounds max_query_len / max_seq_len; `workspace` holds
  // AttentionWorkspaceBytes of these bounds). Must be graph-capturable. Calls EnqueueEmbedding
  // first and EnqueueLogits last.
  virtual absl::Status Enqueue(const DeviceMeta& m, int64_t T, int64_t S, int64_t N,
                               int64_t max_query_len, int64_t max_seq_len, void* workspace) = 0;
  // Scratch the model's attention needs for `batch`.
  virtual size_t AttentionWorkspaceBytes(const kernels::PagedAttentionCudaBatch& batch) const = 0;
  // Frees the old cache and allocates a zeroed one of num_blocks blocks.
  virtual absl::Status AllocateCache(int64_t num_blocks) = 0;
  // The cache's arrays (CudaRunner::KvArrays); empty before AllocateCache.
  virtual std::vector<DeviceKvArray> CacheArrays() const = 0;
  virtual int64_t WeightBytes() const = 0;
  virtual int64_t ActiveWeightBytes() const { return WeightBytes(); }
  virtual int64_t KvBytesPerToken() const = 0;
  virtual KvCacheSpec CacheSpec() const = 0;
  // The activations a decode step of `batch` tokens writes and reads back within a layer that
  // are worth keeping in L2 (CudaRunnerOptions::l2_persist_activations); empty: none.
  virtual L2Window HotActivations(int64_t batch) const { return {}; }
  // True when Enqueue honours the replay hooks (kv_frozen_layers: KvFrozen; sliding_kv_start:
  // bounded_sliding and DeviceMeta::sliding_start); Validate rejects plans carrying them
  // otherwise.
  virtual bool SupportsSwaReplay() const { return false; }
  // True when Enqueue's EnqueueEmbedding may splice ForwardInput::embedding_rows /
  // embedding_values into the step (vision-language models); Validate rejects plans carrying
  // them otherwise.
  virtual bool SupportsInputEmbeddings() const { return false; }

  // ---- Shared machinery.
  // InitCore validates the options and creates the stream, cuBLASLt, the sampling buffers
  // (`hidden` wide gathered rows, logits) and the metadata staging.
  absl::Status InitCore(const ModelConfig& c, const CudaRunnerOptions& o, int64_t hidden);
  // Resolves fed-back token ids and gathers the embedding rows into `out` [T, hidden]; then
  // overwrites the rows of the step's input embeddings (ForwardInput::embedding_rows, staged by
  // EnqueueStep) with their values rounded to bf16.
  absl::Status EnqueueEmbedding(const DeviceMeta& m, int64_t T, const bf16* embed, bf16* out);
  // The end of the forward: residual += delta, normed = RmsNorm(residual) · final_norm (both
  // [T, hidden]); then the N logits rows of normed are gathered, `head` [vocab, hidden] applied
  // and sampled greedily. Nothing when N == 0.
  absl::Status EnqueueLogits(const DeviceMeta& m, int64_t T, int64_t N, const bf16* delta,
                             bf16* residual, const bf16* final_norm, float eps, bf16* normed,
                             const bf16* head);
  kernels::PagedAttentionCudaBatch AttnBatch(const DeviceMeta& m, int64_t t, int64_t s,
                                             int64_t max_query_len, int64_t max_seq_len) const;
  absl::Status AllocateKvCache(int64_t num_blocks);
  absl::Status EnqueueStep(const ForwardInput& plan, bool allow_graph);
  absl::StatusOr<std::vector<ProfileEntry>> ProfileStep(const ForwardInput& plan,
                                                        int64_t hold_ms);
  absl::StatusOr<std::vector<int32_t>> SampledTokens();
  absl::StatusOr<std::vector<float>> Logits();
  absl::Status SampledGreedy(absl::Span<GreedyToken> out);
  // Asynchronous sampled steps (CudaRunner::EnqueueSampledStep / ReadSampledStep).
  // `processing` (may be null): logits processing and top logprobs of the rows
  // (CudaRunner::EnqueueProcessedSampledStep).
  absl::Status EnqueueSampledStep(const ForwardInput& plan,
                                  absl::Span<const kernels::SamplingRow> rows,
                                  const Model::DeviceLogitsProcessing* processing = nullptr);
  // The same in two calls (Model::EnqueueForwardStep / EnqueueStepSampling): the forward, then
  // its processing, sampling and copies once the host has built `processing`.
  absl::Status EnqueueForwardStep(const ForwardInput& plan);
  absl::Status EnqueueStepSampling(absl::Span<const kernels::SamplingRow> rows,
                                   const Model::DeviceLogitsProcessing* processing);
  absl::Status ReadSampledStep(absl::Span<GreedyToken> out);
  absl::Status ReadSampledStepWithTop(absl::Span<GreedyToken> out,
                                      absl::Span<std::vector<kernels::TopLogprob>> top);
  // Mark records a profiling event named `name` after the op just enqueued (ProfileStep only).
  void Mark(const char* name);
  // LayerKvWritten: call in Enqueue once layer `layer`'s K/V write is enqueued. With a
  // per-layer hook (ForwardInput::on_layer_kv_written, eager steps) it records the layer's
  // event on the stream and reports the layer with a wait on that event; else nothing.
  absl::Status LayerKvWritten(int32_t layer);
  // SWA bounded replay hooks of the step being enqueued (ForwardInput::kv_frozen_layers /
  // sliding_kv_start; such steps run eagerly, never from a graph). KvFrozen(layer): the layer
  // must not write its K/V (pass no_kv_slots as its slot mapping). bounded_sliding: some
  // sequence's sliding_kv_start is > 0, so sliding layers attend from DeviceMeta::sliding_start
  // (kernels::PagedAttentionBoundedCuda).
  bool KvFrozen(size_t layer) const {
    return frozen_layers != nullptr && (*frozen_layers)[layer] != 0;
  }
  bool bounded_sliding = false;
  // [max_num_tokens] int64 slots, all -1: a frozen layer's slot mapping (nothing written).
  DeviceBuffer<int64_t> no_kv_slots;

  ModelConfig config;
  // The options as given, except attention.pdl and linear.pdl, which InitCore sets from
  // decode_pdl_level.
  CudaRunnerOptions options;
  // Which launches are programmatic dependents (CudaRunnerOptions::decode_pdl_level on this
  // device: all false below sm_90), fixed by InitCore.
  struct PdlPlan {
    bool common = false;  // level >= 1: the model-independent kernels
    bool mla = false;     // level >= 2: the MLA plumbing
    bool moe = false;     // level 3: the MoE fused decode chain
    int mla_bits = 0;     // kernels::MlaDecodePdlBits(level)
  } pdl;
  int64_t hidden = 0, vocab = 0, max_blocks_per_seq = 0;
  // Logits rows per step (CudaRunnerOptions::max_num_logits, or max_num_seqs when 0): the rows
  // of gathered, logits, sampled, the sampling and processing buffers and the read-back ring.
  int64_t max_logits = 0;
  kernels::CudaStream stream;
  std::unique_ptr<kernels::CublasLt> lt;
  DeviceBuffer<bf16> gathered, logits;  // [max_logits, hidden], [max_logits, vocab]
  DeviceBuffer<int32_t> sampled;        // [max_logits]
  DeviceBuffer<float> sampled_logprobs;  // [max_logits], by SampledGreedy / sampled steps
  StepOutputRing step_outputs;            // results of unread sampled steps
  cudaEvent_t tail_fence = nullptr;       // CudaRunner::TailFence, created at first use
  int64_t num_blocks = 0;
  StepInfo last;
  size_t l2_set_aside = 0;  // bytes reserved for HotActivations' windows (0: none)
  int l2_device = 0;        // the device the set-aside share was taken on

 private:
  struct Graph {
    int64_t batch = 0;
    // Query tokens per sequence (CudaRunnerOptions::graph_query_lens; 1: a plain decode
    // bucket): batch · query_len tokens and logits rows.
    int64_t query_len = 1;
    MetaLayout layout;
    DeviceBuffer<int64_t> meta;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    // The same bucket captured with bounded_sliding (CapturesBoundedGraphs): decode steps with
    // a sliding_kv_start > 0 (after an SWA replay shorter than the window) replay it.
    cudaGraph_t bounded_graph = nullptr;
    cudaGraphExec_t bounded_exec = nullptr;
  };

  void DestroyGraphs();
  // True when decode graphs are also captured with bounded sliding attention: the model honours
  // the replay hooks and has sliding-window layers.
  bool CapturesBoundedGraphs() const;
  // Captures one decode graph of bucket `g` (its meta already uploaded) into *graph / *exec:
  // an eager run first (cuBLASLt settles its plans outside the capture), then the capture.
  absl::Status CaptureBucket(const Graph& g, cudaGraph_t* graph, cudaGraphExec_t* exec);
  absl::Status CaptureGraphs();
  absl::Status Validate(const ForwardInput& plan) const;
  // Pack: `plan` into bucket `g`'s layout (PackStep, or PackPaddedStep for a multi-token
  // bucket).
  void Pack(const ForwardInput& plan, const Graph& g, char* dst) const;
  // FindGraph: the graph `plan` replays (FindGraphBucket), or null for an eager step.
  Graph* FindGraph(const ForwardInput& plan, bool bounded);
  absl::StatusOr<char*> AcquireStaging(size_t bytes);
  absl::Status Upload(const char* host, size_t bytes, void* device);
  // Input embeddings (ForwardInput::embedding_rows / embedding_values) of an eager step go to
  // the device through pinned staging, laid out as [rows int32, padded to 16 bytes][values
  // fp32]: ReserveInputEmbeddings grows both buffers to what `plan` needs (a synchronization
  // when one grows); StageInputEmbeddings waits until the previous upload has read the staging,
  // packs `plan`'s rows and values, enqueues the copy and points `step_embeddings` at it.
  static size_t InputEmbeddingsBytes(const ForwardInput& plan, int64_t hidden);
  absl::Status ReserveInputEmbeddings(const ForwardInput& plan);
  absl::Status StageInputEmbeddings(const ForwardInput& plan);
  PinnedBuffer embeddings_staging;
  DeviceBuffer<uint8_t> embeddings_dev;
  cudaEvent_t embeddings_uploaded = nullptr;  // recorded after the last staging copy
  // The step being enqueued's input embeddings on the device (count 0: none).
  struct StepEmbeddings {
    const int32_t* rows = nullptr;
    const float* values = nullptr;
    int64_t count = 0;
  } step_embeddings;
  // ReserveEagerWorkspace grows the eager attention workspace to what `plan` needs (a
  // synchronization when it grows) and returns the plan's longest query and sequence.
  absl::Status ReserveEagerWorkspace(const ForwardInput& plan, int64_t* max_q, int64_t* max_len);
  // EnqueueRowSampling overwrites the last step's greedy tokens of the rows whose temperature
  // asks for a draw (kernels/sampling) and writes every row's logprob; `staged` is the rows'
  // parameters in pinned memory that stays untouched until the step is read.
  absl::Status EnqueueRowSampling(const kernels::SamplingRow* staged, int64_t n);
  // EnqueueProcessing: the processed path of EnqueueSampledStep for the step just enqueued
  // (n rows, ring slot `slot`): uploads `processing` through the slot's pinned staging, then
  // LogitsProcessingCuda → fp32 SampleRowsCuda (with `prev_n` fed-back tokens saved in
  // prev_sampled_copy) when it has rows, and LogprobRowsCuda (raw logprobs, top entries).
  absl::Status EnqueueProcessing(const Model::DeviceLogitsProcessing& processing, int slot,
                                 const kernels::SamplingRow* staged, int64_t n, int64_t prev_n);
  // Allocates the processing buffers on first use (the marks workspace zeroed on `stream`).
  absl::Status EnsureProcessingBuffers();

  // Metadata: eager steps use `eager_meta`; each graph bucket has its own fixed buffer.
  DeviceBuffer<int64_t> eager_meta;
  DeviceBuffer<uint8_t> eager_ws, graph_ws;
  DeviceBuffer<kernels::SamplingRow> sampling_rows;  // [max_logits]
  DeviceBuffer<uint8_t> sampling_ws;
  PinnedBuffer staging[2];
  cudaEvent_t staging_done[2] = {nullptr, nullptr};
  int next_staging = 0;
  std::vector<Graph> graphs;    // by query_len, then ascending batch
  std::vector<GraphBucket> buckets;  // graphs[i]'s shape
  int64_t prev_num_logits = 0;  // logits rows of the previous step (for fed-back token ids)
  // A forward enqueued without its sampling yet (EnqueueForward → EnqueueSampling).
  struct PendingSampling {
    int64_t num_logits = 0;
    int64_t fed_back_rows = 0;  // the previous step's tokens kept in prev_sampled_copy
  };
  std::optional<PendingSampling> pending_sampling;
  // EnqueueForward enqueues the forward of a sampled step; `keep_fed_back`: first copy the
  // previous step's tokens aside (penalties of placeholder ids read them after the forward
  // overwrote `sampled`).
  absl::Status EnqueueForward(const ForwardInput& plan, bool keep_fed_back);
  absl::Status EnqueueSampling(absl::Span<const kernels::SamplingRow> rows,
                               const Model::DeviceLogitsProcessing* processing);
  // Device logits processing and top logprobs (allocated on first use).
  struct ProcessingSlot {     // per StepOutputRing slot, reused only after that step was read
    PinnedBuffer upload;      // rows, top counts, list ids staged for the upload
    PinnedBuffer top;         // top ids [rows, 20] then top logprobs [rows, 20], copied back
    std::vector<int32_t> top_counts;  // per row; empty: the step asked none
  };
  ProcessingSlot processing_slots[StepOutputRing::kSlots];
  DeviceBuffer<uint8_t> processing_upload;   // device copy of a slot's upload (grows)
  DeviceBuffer<float> processed_logits;      // [max_logits, vocab]
  DeviceBuffer<uint8_t> processing_ws;       // LogitsProcessingCuda's marks, zero between calls
  DeviceBuffer<int32_t> prev_sampled_copy;   // [max_logits]: fed-back tokens of the step before
  DeviceBuffer<int32_t> top_ids_dev;         // [max_logits, 20]
  DeviceBuffer<float> top_logprobs_dev;      // [max_logits, 20]
  // ProfileStep: while set, Mark records one timing event after each op of Enqueue.
  std::vector<std::pair<const char*, cudaEvent_t>>* profile = nullptr;
  absl::Status profile_error;
  // The step's per-layer KV hook while EnqueueStep enqueues it (null: none), and one event per
  // layer, reused by later steps (a wait on a re-recorded event only ends later, never early).
  const LayerKvHook* layer_hook = nullptr;
  std::vector<cudaEvent_t> layer_events;
  // The step's kv_frozen_layers while EnqueueStep enqueues it (null: none frozen).
  const std::vector<uint8_t>* frozen_layers = nullptr;
};

// LoadCore / DummyCore: a model core (Init(config, options), LoadWeights(WeightSource&))
// initialized and filled from the checkpoint in `dir` or with dummy weights of `seed`.
template <typename Core>
absl::StatusOr<std::unique_ptr<Core>> LoadCore(const std::string& dir,
                                               const CudaRunnerOptions& options) {
  auto config = ModelConfig::Load(dir);
  if (!config.ok()) return config.status();
  auto core = std::make_unique<Core>();
  SLUICE_RETURN_IF_ERROR(core->Init(*config, options));
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  CheckpointSource src(std::move(*ckpt));
  SLUICE_RETURN_IF_ERROR(core->LoadWeights(src));
  return core;
}

template <typename Core>
absl::StatusOr<std::unique_ptr<Core>> DummyCore(const ModelConfig& config, uint64_t seed,
                                                const CudaRunnerOptions& options) {
  auto core = std::make_unique<Core>();
  SLUICE_RETURN_IF_ERROR(core->Init(config, options));
  DummySource src(seed);
  SLUICE_RETURN_IF_ERROR(core->LoadWeights(src));
  return core;
}

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_RUNNER_CORE_H_
