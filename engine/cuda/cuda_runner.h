// CudaRunner: what every CUDA model runner (engine/cuda) offers its callers — a forward pass on
// one NVIDIA GPU over the flattened batch of an engine step (engine/model/model.h's ForwardInput
// plan) with bf16 weights and a paged bf16 KV cache in device memory, greedy argmax on the
// device, decode steps replayed from CUDA graphs captured per batch-size bucket.
//
// The architectures differ only inside: CudaLlamaRunner (cuda_llama_runner.h: Llama family) and
// CudaDeepseekRunner (cuda_deepseek_runner.h: DeepSeek-V3 MLA + MoE) build a CudaRunner; the
// step machinery (plan validation, metadata staging, graphs, sampling, profiling) is shared
// (runner_core.h). cuda_model.h picks the runner by architecture.
//
// Step metadata (token ids, positions, slot mapping, query_start_loc, context lengths, logits
// rows, block tables) is packed on the host into pinned staging memory and sent with ONE
// cudaMemcpyAsync into a device buffer at fixed addresses (one per graph bucket), so replaying a
// decode graph needs only that copy and cudaGraphLaunch. Steps are asynchronous: Step returns
// once the work is enqueued; the host may plan the next step while the GPU runs this one, and
// a token id -(r + 1) in the plan stands for the token the previous step sampled for its
// logits row r (fed back on the device, no host round trip).
// Not thread-safe: one caller drives a runner.
#ifndef SLUICE_ENGINE_CUDA_CUDA_RUNNER_H_
#define SLUICE_ENGINE_CUDA_CUDA_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "kernels/attention/paged_attention_options.h"
#include "kernels/linear/linear_options.h"
#include "kernels/mla_attention/mla_options.h"
#include "kernels/moe/moe_options.h"

namespace sluice::cuda_runner {

struct CudaRunnerOptions {
  int64_t block_size = 16;  // tokens per KV block
  // Longest sequence (context + new tokens) a step may hold: the block-table width and the
  // attention bound the decode graphs are captured with.
  int64_t max_model_len = 4096;
  int64_t max_num_tokens = 8192;  // tokens per step (prefill chunk budget)
  int64_t max_num_seqs = 256;     // sequences per step
  // Logits rows a step may ask for (ForwardInput::logits_indices): the rows of the logits,
  // sampling and read-back buffers; at least max_num_seqs (one sampled row per sequence). A
  // speculative verify step asks for the k + 1 positions of every decode sequence
  // (engine/spec): max_num_seqs · (k + 1). Costs 2 · vocab bytes of device memory per row.
  int64_t max_num_logits = 0;
  bool use_cuda_graphs = true;
  // Deadline of one KV connector block copy call (CudaModel's Gather/ScatterKvBlocks through
  // pinned staging): copies still running then count as failed — the save is dropped, the load
  // computed (engine/kv/staged_kv_blocks.h). Infinite: none.
  absl::Duration kv_block_copy_timeout = absl::InfiniteDuration();
  // Tune the bucket shapes' GEMMs once, in the eager run before each graph capture
  // (kernels::CublasLt::set_autotune); only with use_cuda_graphs.
  bool autotune_gemms = true;
  // GEMM tuning table (kernels::LoadGemmTuning: a file, or a directory holding
  // <GPU name>.json) loaded before the first tuning, once per process and path: the bucket
  // shapes it holds take its saved choice instead of being timed. "auto": the first existing
  // directory of <source tree>/configs/gemm_tuning, <executable's directory>/configs/gemm_tuning
  // and <executable's directory>/../share/sluice/gemm_tuning (none: no table). Empty: none.
  // A directory without this GPU's file is not an error; a malformed table is
  // (InvalidArgument from AllocateKvCache).
  std::string gemm_tuning = "auto";
  // After the graphs are captured, write the process's table (loaded + timed choices) here
  // (kernels::SaveGemmTuning); empty: do not write. This is how a table is made: run once
  // with the wider search (linear.algo_search = 3) and this set.
  std::string gemm_tuning_save;
  // What the GEMM autotuner times (kernels/linear/linear_options.h), the MoE experts' prefill
  // GEMMs (kernels/moe/moe_options.h) and when MLA attention takes its MHA form
  // (kernels/mla_attention/mla_options.h; DeepSeek runners). Fixed for the runner's life.
  kernels::LinearOptions linear;
  kernels::MoeOptions moe;
  kernels::MlaOptions mla;
  // Decode batch-size buckets captured as graphs (those ≤ max_num_seqs); a decode step of n
  // sequences replays the smallest bucket ≥ n, padded with inert rows.
  std::vector<int64_t> graph_batch_sizes = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  // Multi-token decode graphs, for speculative verify steps (engine/spec: each decode sequence's
  // last token and its drafts in one step). For each q listed (2..64), the buckets b of
  // graph_batch_sizes with b·q ≤ min(max_num_tokens, max_logits, multi_token_graph_max_tokens)
  // are also captured with q query tokens per sequence. A step whose sequences hold 1..q query
  // tokens each (and some more than one) replays the graph of fewest tokens that holds it:
  // every sequence is padded to q rows with inert tokens (K/V not written, outputs unread),
  // padded sequences as in a decode bucket. Steps that fit none (longer rows, more sequences,
  // a context within q tokens of max_model_len, bounded sliding attention) run eagerly. Empty
  // (the default): every multi-token step runs eagerly. `sluice serve` lists 2..k + 1 when it
  // speculates with k drafts.
  std::vector<int64_t> graph_query_lens;
  // Past this many tokens a multi-token bucket is not captured: the step's compute then hides
  // the kernel launches a graph saves, while each captured shape costs start-up (capture, GEMM
  // tuning).
  int64_t multi_token_graph_max_tokens = 512;
  // Keep each decode graph's hot activations (the model's HotActivations: for Llama/Qwen3 the
  // MLP's gate/up product and SiLU·mul output) in an L2 set-aside, with an access-policy window
  // on the graph's kernels (engine/cuda/l2_persist.h); graphs only.
  bool l2_persist_activations = true;
  // CUDA device the runner allocates on and runs on (cudaSetDevice at creation); -1: the
  // calling thread's current device. The thread that drives the runner must have it current.
  int device = -1;
  // Tensor parallelism (CudaLlamaRunner only; issue 4): this runner is rank tp_rank of
  // tp_size, holds the heads [tp_rank·nh/tp_size, ..) (and the matching KV heads) and the
  // intermediate channels [tp_rank·I/tp_size, ..) of every layer (Megatron-LM's column split
  // of q/k/v/gate/up, row split of o/down; engine/parallel/sharding.h), embedding and lm_head
  // replicated. tp_all_reduce must then sum `count` bf16 values at device pointer `data` over
  // the ranks, in place, enqueued on CUDA stream `stream` (a cudaStream_t) without waiting for
  // completion, so that it can be captured in a CUDA graph (e.g.
  // NcclCommunicator::EnqueueAllReduceSum); it is called after o_proj and after down_proj of
  // every layer. Every rank computes the logits and samples (rank 0's are the output; each
  // rank feeds back its own tokens): they agree bit for bit when the ranks run the same GEMM
  // kernels on the replicated tail, which timed tuning (autotune_gemms) does not guarantee.
  // tp_size must divide the attention heads, the KV heads and intermediate_size.
  int tp_rank = 0;
  int tp_size = 1;
  std::function<absl::Status(void* data, int64_t count, void* stream)> tp_all_reduce;
  // Paged attention kernel choices (CudaLlamaRunner's attention, CudaDeepseekRunner's MHA-form
  // prefill; kernels/attention/paged_attention_options.h): the defaults are the served shape
  // rules; benchmarks and tests force one kernel. (Its `pdl`, like linear.pdl, is set by the
  // runner from decode_pdl_level.)
  kernels::PagedAttentionOptions attention;
  // Decode PDL level: which kernels of a step launch as programmatic dependents of the kernel
  // before each (kernels/cuda/pdl.cuh), so each one's launch and first weight loads overlap
  // the previous kernel's tail (kernel boundaries are most of a decode step's gap to the
  // roofline); prefill steps chain the same launches. Same results at every level.
  //   0: none;
  //   1 (the default): the model-independent kernels (embedding, RMSNorm, Qwen3's head norm,
  //      RoPE + K/V write, paged attention, GEMV and skinny GEMM, gather rows, argmax) and the
  //      MLA decode block's level-1 pieces (kernels::MlaDecodePdlBits);
  //   2: also the DeepSeek MLA plumbing (kernels/mla_attention/mla_plumbing_cuda.h) and the
  //      W_UV preload;
  //   3: also the MoE fused decode's route launch and early trigger (kernels/moe/moe_cuda.h).
  // Below sm_90 every level runs as 0. InvalidArgument outside 0..3.
  int decode_pdl_level = 1;
  // Batch-invariant mode (EngineOptions::batch_invariant, --batch-invariant): every logits row
  // and K/V entry a step writes is, bit for bit, a function of its own sequence alone (not of
  // the batch, the step's token count, prefill chunking, or graph vs eager). InitCore turns on
  // linear.batch_invariant and attention.batch_invariant (fixed-order GEMM and attention
  // kernels), the MLA MHA form and the MoE per-expert cuBLASLt GEMMs (mla / moe options) and
  // the GEMM tuning (autotune_gemms, gemm_tuning) off; the DeepSeek runner then runs its
  // batch-invariant MLA and grouped-expert paths. tp_size must be 1.
  bool batch_invariant = false;
};

// StepInfo: what the last Step did (for tests and benchmarks).
struct StepInfo {
  bool graph = false;        // replayed a captured decode graph
  int64_t graph_batch = 0;   // its bucket
  int64_t graph_query_len = 0;  // its query tokens per sequence (1: a plain decode graph)
  int64_t num_tokens = 0;
  int64_t num_logits = 0;
};

// One op class of a profiled step (ProfileStep): GPU time between the event before and after
// each of its calls, summed over layers.
struct ProfileEntry {
  std::string op;                      // e.g. "qkv_gemm", "attention", "add_rmsnorm"
  int64_t launches_between_marks = 0;  // calls (layers) it was measured over
  double ms = 0.0;
};

class RunnerCore;  // runner_core.h (internal)

class CudaRunner {
 public:
  virtual ~CudaRunner();
  CudaRunner(const CudaRunner&) = delete;
  CudaRunner& operator=(const CudaRunner&) = delete;

  const ModelConfig& config() const;
  const CudaRunnerOptions& options() const;
  // Bytes of bf16 weights one decode step reads when every weight is read once (all routed
  // experts of an MoE model) plus one embedding row.
  int64_t WeightBytesPerStep() const;
  // Bytes of bf16 weights a batch-1 decode step reads: for MoE layers only the router,
  // num_experts_per_tok routed experts and the shared experts; everything else (attention,
  // norms, dense MLPs, lm_head, one embedding row) as in WeightBytesPerStep. Equal to
  // WeightBytesPerStep for dense models.
  int64_t ActiveWeightBytesPerToken() const;
  // KV cache bytes per token over all layers (bf16).
  int64_t KvBytesPerToken() const;
  // True when Step honours ForwardInput::kv_frozen_layers and sliding_kv_start (SWA bounded
  // replay, engine/kv/swa_replay.h): CudaLlamaRunner. Steps with frozen layers run eagerly;
  // decode steps with a sliding_kv_start > 0 replay a second set of decode graphs, captured
  // with bounded sliding attention for models that have sliding layers. Other runners reject
  // the hooks (Unimplemented).
  bool SupportsSwaReplay() const;
  // True when Step honours ForwardInput::embedding_rows / embedding_values (Model::
  // SupportsInputEmbeddings): CudaLlamaRunner, which splices the rows (rounded to bf16) over the
  // looked-up token embeddings of an eager step — a step carrying them never replays a graph.
  // Other runners reject them (Unimplemented).
  bool SupportsInputEmbeddings() const;
  // Logits rows one Step may ask for: max(options().max_num_logits, options().max_num_seqs).
  int64_t max_num_logits() const;
  // Host seconds spent setting up GEMM plans so far (kernels::CublasLt::setup_seconds;
  // Model::kernel_setup_seconds).
  double kernel_setup_seconds() const;
  // The cache layout the plan's slots refer to (engine/model/model.h), for CudaModel.
  KvCacheSpec kv_cache_spec() const;

  // AllocateKvCache (re)allocates a zeroed device KV cache of num_blocks blocks of
  // options().block_size tokens and, with use_cuda_graphs, captures the decode graphs (each
  // bucket is run once eagerly first, which also settles cuBLASLt's plan choice and, with
  // autotune_gemms, tunes the bucket's GEMM shapes: about a second for an 8B model). Must be
  // called before Step. Errors: InvalidArgument for num_blocks < 1; Internal for CUDA failures.
  absl::Status AllocateKvCache(int64_t num_blocks);
  int64_t num_blocks() const;
  // KvArrays: the paged cache's device arrays for KV transfer (Model::DeviceKvArrays order:
  // Llama/Qwen3 per layer K [num_blocks, block_size, kv_dim] then V, bf16; DeepSeek per layer
  // the MLA latent [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim], bf16). Empty
  // before AllocateKvCache; invalidated by the next AllocateKvCache.
  std::vector<DeviceKvArray> KvArrays() const;

  // Step enqueues one forward over `plan` (model.h ForwardInput; every sequence's block table
  // must cover its tokens, slot_mapping must agree with it) followed by greedy sampling of the
  // logits rows plan.logits_indices. Returns after enqueuing. A token id < 0 means -(r + 1):
  // row r of the previous Step's sampled tokens (r < that step's logits count).
  // Errors (nothing is enqueued): InvalidArgument for an inconsistent plan, a token id outside
  // the vocabulary, a sequence longer than max_model_len, more than max_num_tokens tokens,
  // max_num_seqs sequences or max_num_logits logits rows (several rows of one sequence: a
  // speculative verify step); FailedPrecondition before AllocateKvCache; Internal for CUDA
  // errors.
  absl::Status Step(const ForwardInput& plan);
  const StepInfo& last_step() const;

  // ProfileStep runs `plan` (as Step would, but always eagerly, never from a graph) with a CUDA
  // event after every op and returns GPU time per op class in first-seen order. The stream is
  // first held by a `hold_ms` spin kernel while the host enqueues, so kernels run back to back
  // as in a graph (events add about a microsecond each). Synchronizes. Errors: those of Step.
  absl::StatusOr<std::vector<ProfileEntry>> ProfileStep(const ForwardInput& plan,
                                                        int64_t hold_ms = 50);
  // GemmPlans describes each GEMM shape met so far and the kernel chosen for it
  // (kernels::CublasLt::DescribePlans).
  std::string GemmPlans();

  // SampledTokens waits for the last Step and returns its greedy tokens, one per logits row.
  absl::StatusOr<std::vector<int32_t>> SampledTokens();
  // Logits waits for the last Step and returns its logits [num_logits, vocab_size] (bf16 values
  // widened to float32).
  absl::StatusOr<std::vector<float>> Logits();
  // SampledGreedy waits for the last Step and writes, per logits row, its greedy token and that
  // token's log_softmax value (GreedyLogprobRowsCuda over the step's bf16 logits, fp32): only
  // [rows] ids and floats cross to the host. Errors: InvalidArgument when out.size() differs
  // from the last Step's logits count; Internal for CUDA errors.
  absl::Status SampledGreedy(absl::Span<GreedyToken> out);
  // EnqueueSampledStep enqueues Step(plan) and the sampling of its logits rows on the device,
  // one kernels::SamplingRow per row (greedy rows keep the step's argmax; rows with a
  // temperature draw with their `uniform`), then the copy of the tokens and their logprobs
  // into pinned host memory — and returns without waiting. Token ids -(r + 1) in the next
  // plan read these tokens on the device. ReadSampledStep waits for the oldest unread such
  // step and returns its results. At most Model::kMaxUnreadSteps steps may be unread.
  // Errors: those of Step; InvalidArgument for rows.size() != plan.logits_indices.size() or a
  // wrong out.size(); FailedPrecondition when too many steps are unread (Enqueue) or none is
  // (Read).
  absl::Status EnqueueSampledStep(const ForwardInput& plan,
                                  absl::Span<const kernels::SamplingRow> rows);
  absl::Status ReadSampledStep(absl::Span<GreedyToken> out);
  // EnqueueProcessedSampledStep is EnqueueSampledStep with engine/sample's logits processing
  // (min_tokens suppression, repetition / frequency / presence penalties) applied to each row's
  // logits on the device before the choice (LogitsProcessingCuda into fp32, then the fp32
  // SampleRowsCuda), and the raw logprobs plus the rows' top logprobs (LogprobRowsCuda) copied
  // back with the tokens; ReadSampledStepWithTop returns them. See Model::
  // EnqueueProcessedSampledStep for the format and errors. The first call allocates
  // 8 · max_num_logits · vocab bytes of device memory (fp32 logits, marks).
  absl::Status EnqueueProcessedSampledStep(const ForwardInput& plan,
                                           absl::Span<const kernels::SamplingRow> rows,
                                           const Model::DeviceLogitsProcessing& processing);
  absl::Status ReadSampledStepWithTop(absl::Span<GreedyToken> out,
                                      absl::Span<std::vector<kernels::TopLogprob>> top);
  // EnqueueProcessedSampledStep in two calls (Model::EnqueueForwardStep / EnqueueStepSampling):
  // the forward now, its processing (grammar masks built meanwhile), sampling and copies next.
  absl::Status EnqueueForwardStep(const ForwardInput& plan);
  absl::Status EnqueueStepSampling(absl::Span<const kernels::SamplingRow> rows,
                                   const Model::DeviceLogitsProcessing& processing);
  int NumUnreadSteps() const;
  // Synchronize waits for all enqueued work; returns the first asynchronous CUDA error.
  absl::Status Synchronize();
  // Fences (device events, opaque: a cudaEvent_t) that copies on other streams wait on without
  // blocking the host (transfer::DeviceCopier::WaitFence). ReadFence completes with the last
  // step whose sampled results were read (and all work before it): the KV the engine has
  // committed so far; steps enqueued after it are not waited for. Null before any read (every
  // step then ran synchronously). TailFence records a fence after all work enqueued so far.
  // Each stays valid until the runner is destroyed. Errors (TailFence): Internal.
  const void* ReadFence() const;
  absl::StatusOr<const void*> TailFence();
  // WaitFence orders all work enqueued from now on after `fence` (another stream's event, e.g.
  // a copy lane's: transfer::DeviceCopier::RecordFence) without blocking the host. Null: none.
  // Errors: Internal.
  absl::Status WaitFence(const void* fence);

 protected:
  explicit CudaRunner(std::unique_ptr<RunnerCore> core);

 private:
  std::unique_ptr<RunnerCore> core_;
};

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_CUDA_RUNNER_H_
