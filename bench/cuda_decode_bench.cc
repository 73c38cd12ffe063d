// cuda_decode_bench: decode and prefill speed of the CUDA model runner (engine/cuda) on a
// Llama-family or DeepSeek-V3 (MLA + MoE, e.g. bench/configs/deepseek-v2-lite) config with dummy
// weights, against the GPU's own ceilings measured in the same process.
//   cuda_decode_bench [--config DIR] [--context N] [--decode-steps N] [--batches 1,64,256]
//                     [--prefill 4096,16384] [--breakdown 1] [--compare-untuned 0]
//                     [--attn-decode-kernel auto] [--attn-prefill-kernel wgmma] [--tp 1]
//                     [--mla-prefill-mha-min 64] [--moe-prefill-gemm 256] [--batch-invariant 0]
//                     [--out OUT.json]
// Default config: bench/configs/llama3-8b (Llama-3-8B shapes). --prefill "" skips the prefill
// figures (decode A/B runs).
// --tp N (Llama family; built with NCCL): decode only, tensor-parallel over GPUs 0..N-1 — one
// thread per GPU in this process, each with its NcclCommunicator and its shard of the model
// (CudaRunnerOptions::tp_*), the same plans on every rank; the figures are rank 0's (its steps
// end only after every rank's all-reduces, so its ITL is the replica's). Weight bytes and the
// roofline are per GPU (one shard plus the replicated embedding row and lm_head; copy_gbps is
// GPU 0's). Prefill and the comparison variants are skipped. NCCL_NVLS_ENABLE=0 on machines
// whose NVLink multicast is off. A rank that fails leaves the others waiting in NCCL: run it
// under `timeout`.
//
// Ceilings (CUDA events, mean over timed repetitions after warm-ups):
//   copy_gbps  device-to-device cudaMemcpyAsync of 2 GiB, (bytes read + bytes written) / s —
//              the HBM bandwidth a streaming kernel can reach;
//   gemm_tflops bf16 GEMM through LinearCuda (cuBLASLt, fp32 accumulation) at the model's
//              largest prefill shape (m = 4096, n = 2·intermediate, k = hidden), 2·m·n·k / s.
// Decode, for each batch B: B sequences with `context` tokens already in the KV cache (the
// cache is allocated, not prefilled: decode reads the same bytes whatever they hold), then
// `decode_steps` steps replayed from the CUDA graph of bucket B, token ids fed back on the
// device, host planning overlapped with the GPU; ITL = GPU time per step. Roofline per step =
// (weight bytes + KV bytes read: B · mean context · KV bytes/token) / copy_gbps; the ratio
// measured / roofline is the target figure (≤ 1.2 at batch 1, ≤ 1.3 at 64 and 256).
// MoE models: a step reads only the routed experts its tokens chose, so the weight bytes of the
// roofline count the non-expert weights plus the expected number of distinct experts B tokens
// touch under uniform routing, E · (1 − (1 − k/E)^B) per MoE layer (exactly k at B = 1:
// CudaRunner::ActiveWeightBytesPerToken); "weight_bytes_all_experts" is the dense-equivalent
// figure. KV bytes per token: the MLA latent row (kv_lora_rank + qk_rope_head_dim) per layer.
// --breakdown 1 (default): after each batch's timed loop, one more step is run eagerly with a
// CUDA event after every op (CudaLlamaRunner::ProfileStep: kernels queued behind a spin kernel, so
// they run back to back) and GPU ms per op class is reported beside the graph ITL; the GEMM
// shapes and the kernel chosen for each (GEMV / cuBLASLt algorithm, tuned timings) follow.
// --compare-untuned 1: the decode figures are also measured with GEMM autotuning off
// (cuBLASLt's first heuristic pick everywhere), as "decode_untuned".
// --attn-decode-kernel auto|rings|persistent: the paged attention kernel of decode launches
// (CudaRunnerOptions::attention.decode_kernel, kernels::PagedDecodeKernel: auto, the default,
// persistent decode warps where the unsplit units fill the GPU's resident warps, else warp
// rings; or either at every batch), for A/B runs.
// --attn-prefill-kernel wgmma|fa2|mma|cta: the first kernel prefill launches try
// (CudaRunnerOptions::attention.prefill_kernel, kernels::PagedPrefillKernel: wgmma, the default,
// then fa2, mma, cta where the earlier ones do not serve), for A/B runs (prefill rows
// "attention").
// --mla-prefill-mha-min N: DeepSeek steps whose longest query has >= N tokens compute MLA
// attention in the MHA form (CudaRunnerOptions::mla; default 64; 0: absorbed everywhere).
// --decode-pdl 0..3: decode-step kernels launched as programmatic dependents of the kernel
// before each (CudaRunnerOptions::decode_pdl_level: 0 none, 1 the model-independent kernels,
// the default, 2 also the DeepSeek MLA plumbing, 3 also the MoE decode chain), for A/B runs.
// --gemm-tune-candidates N: how many cuBLASLt heuristic algorithms the GEMM autotuner times
// per decode shape (CudaRunnerOptions::linear.tune_candidates, 1..64; default 8).
// --gemm-algo-search MASK: the GEMM autotuner's wider search for decode shapes with m >= 64
// (CudaRunnerOptions::linear.algo_search: 1 enumerated cuBLASLt algorithms, 2 two-part N
// splits, 4 their parts on two streams; default 0); gemm_plans then names each pick.
// --batch-invariant 0|1: the runner in batch-invariant mode (CudaRunnerOptions::batch_invariant:
// fixed-order GEMM and attention kernels, no GEMM tuning), for the mode's cost
// (bench/batch_invariant_cost.py --cuda-decode-bench runs both modes alternately).
// --batch-invariant-gemm-ctas N: the CTA count the mode's GEMM k-split aims for
// (LinearOptions::batch_invariant_target_ctas, default 128), for A/B runs.
// --gemm-skinny 0|1: whether the GEMM autotuner times the skinny tensor-core GEMM for decode
// shapes of 2..16 rows (CudaRunnerOptions::linear.skinny_tuning; default 1), for A/B runs.
// --l2-persist 0|1: keep each decode graph's MLP activations in an L2 set-aside
// (CudaRunnerOptions::l2_persist_activations; default 1), for A/B runs.
// --gemm-tuning PATH: the GEMM tuning table the runner loads (CudaRunnerOptions::gemm_tuning:
// a file or a directory of <GPU name>.json; default "auto", the repo's configs/gemm_tuning;
// "" none, so every decode shape is timed as before). --gemm-tuning-save PATH: write the
// process's table after the graphs are captured; with --gemm-algo-search 3 this makes the
// table (scripts/make_gemm_tuning.sh).
// --moe-prefill-gemm N: steps of >= N tokens run the routed experts' GEMMs per expert on
// cuBLASLt (CudaRunnerOptions::moe.prefill_gemm_min_tokens; default 256; 0: the grouped WMMA
// GEMM at every size).
// --moe-prefill-streams N: spread those GEMMs over N streams
// (CudaRunnerOptions::moe.prefill_gemm_streams, 1..4; default 4).
// Prefill, for each length T: one sequence of T tokens in one eager step; tokens/s, and model
// FLOP/s = (2 · matmul params · T + causal attention 2 · 2 · layers · heads · head_dim · T²/2)
// / time, as a fraction of gemm_tflops. MoE: matmul params are those a token uses (top-k routed
// experts, not all); MLA attention (absorbed) counts 2 · layers · heads · (2 · kv_lora_rank +
// qk_rope_head_dim) · T²/2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#if SLUICE_HAVE_NCCL
#include <barrier>

#include "build_paths.h"
#include "engine/parallel/nccl/nccl_communicator.h"
#endif

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_model.h"
#include "engine/cuda/runner_kernels.h"
#include "engine/model/dummy_weights.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/linear/gemm_algo_search.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/mla_attention/mla_attention_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_prefill_gemm_cuda.h"
#include "nlohmann/json.hpp"

namespace sluice::cuda_runner {
namespace {

using kernels::bf16;
using kernels::DeviceBuffer;

struct Flags {
  std::string config_dir = SLUICE_SOURCE_DIR "/bench/configs/llama3-8b";
  int64_t context = 1024;
  int64_t decode_steps = 64;
  std::vector<int64_t> batches = {1, 64, 256};
  std::vector<int64_t> prefill = {4096, 16384};
  bool breakdown = true;
  bool compare_untuned = false;
  kernels::PagedAttentionOptions attention;  // CudaRunnerOptions::attention
  int tp = 1;
  kernels::LinearOptions linear;  // CudaRunnerOptions::linear
  kernels::MoeOptions moe;        // CudaRunnerOptions::moe
  kernels::MlaOptions mla;        // CudaRunnerOptions::mla
  std::string gemm_tuning = "auto";  // CudaRunnerOptions::gemm_tuning
  std::string gemm_tuning_save;      // CudaRunnerOptions::gemm_tuning_save
  bool l2_persist = true;            // CudaRunnerOptions::l2_persist_activations
  int decode_pdl = 1;                // CudaRunnerOptions::decode_pdl_level
  bool batch_invariant = false;      // CudaRunnerOptions::batch_invariant
  std::string out;
};

// One rank of a --tp run, for BenchDecode (nullptr there: one GPU, no tensor parallelism).
struct TpRank {
  int rank = 0, size = 1;
  std::function<absl::Status(void* data, int64_t count, void* stream)> all_reduce;
  std::function<void()> barrier;  // host barrier of all ranks (aligns the timed loops)
};

class EventTimer {
 public:
  EventTimer() {
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void Start(cudaStream_t s) { cudaEventRecord(start_, s); }
  absl::StatusOr<double> StopMs(cudaStream_t s) {
    cudaEventRecord(stop_, s);
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return static_cast<double>(ms);
  }

 private:
  cudaEvent_t start_, stop_;
};

absl::StatusOr<double> CopyGbps() {
  const size_t bytes = size_t{2} << 30;
  auto src = DeviceBuffer<uint8_t>::Create(bytes);
  auto dst = DeviceBuffer<uint8_t>::Create(bytes);
  if (!src.ok() || !dst.ok()) return absl::InternalError("copy buffers");
  cudaMemset(src->data(), 1, bytes);
  EventTimer t;
  for (int i = 0; i < 3; ++i) cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice, 0);
  constexpr int kIters = 10;
  t.Start(0);
  for (int i = 0; i < kIters; ++i) {
    cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice, 0);
  }
  auto ms = t.StopMs(0);
  if (!ms.ok()) return ms.status();
  return 2.0 * bytes * kIters / (*ms * 1e-3) / 1e9;
}

absl::StatusOr<double> GemmTflops(int64_t m, int64_t n, int64_t k) {
  auto lt = kernels::CublasLt::Create();
  if (!lt.ok()) return lt.status();
  auto x = DeviceBuffer<bf16>::Create(m * k);
  auto w = DeviceBuffer<bf16>::Create(n * k);
  auto y = DeviceBuffer<bf16>::Create(m * n);
  if (!x.ok() || !w.ok() || !y.ok()) return absl::InternalError("gemm buffers");
  SLUICE_RETURN_IF_ERROR(FillDummyCuda(x->data(), m * k, 1, DummyInit::kNormal, 0));
  SLUICE_RETURN_IF_ERROR(FillDummyCuda(w->data(), n * k, 2, DummyInit::kNormal, 0));
  for (int i = 0; i < 3; ++i) {
    SLUICE_RETURN_IF_ERROR(
        kernels::LinearCuda(**lt, x->data(), w->data(), nullptr, y->data(), m, n, k, 0));
  }
  constexpr int kIters = 20;
  EventTimer t;
  t.Start(0);
  for (int i = 0; i < kIters; ++i) {
    SLUICE_RETURN_IF_ERROR(
        kernels::LinearCuda(**lt, x->data(), w->data(), nullptr, y->data(), m, n, k, 0));
  }
  auto ms = t.StopMs(0);
  if (!ms.ok()) return ms.status();
  return 2.0 * m * n * k * kIters / (*ms * 1e-3) / 1e12;
}

// Decode plan for `batch` sequences whose block tables are consecutive runs of `blocks_per_seq`
// blocks; at step `step` sequence s has context + step cached tokens and feeds back row s.
struct DecodePlanner {
  int64_t batch, context, block_size, blocks_per_seq;
  std::vector<std::vector<int32_t>> tables;
  DecodePlanner(int64_t b, int64_t ctx, int64_t bs, int64_t bps)
      : batch(b), context(ctx), block_size(bs), blocks_per_seq(bps), tables(b) {
    for (int64_t s = 0; s < b; ++s) {
      for (int64_t i = 0; i < bps; ++i) tables[s].push_back(static_cast<int32_t>(s * bps + i));
    }
  }
  void Plan(int64_t step, bool first, ForwardInput* in) const {
    in->token_ids.clear();
    in->positions.clear();
    in->slot_mapping.clear();
    in->sequences.clear();
    in->logits_indices.clear();
    const int64_t pos = context + step;
    for (int64_t s = 0; s < batch; ++s) {
      in->token_ids.push_back(first ? static_cast<int32_t>(1000 + s) : -static_cast<int32_t>(s + 1));
      in->positions.push_back(static_cast<int32_t>(pos));
      in->slot_mapping.push_back(int64_t{tables[s][pos / block_size]} * block_size +
                                 pos % block_size);
      SequenceSlice q;
      q.query_start = static_cast<int32_t>(s);
      q.num_query_tokens = 1;
      q.num_context_tokens = static_cast<int32_t>(pos);
      q.block_table = absl::MakeConstSpan(tables[s]);
      in->sequences.push_back(q);
      in->logits_indices.push_back(static_cast<int32_t>(s));
    }
  }
};

absl::StatusOr<nlohmann::json> BenchDecode(const ModelConfig& config, const Flags& f,
                                           double copy_gbps, bool autotune,
                                           nlohmann::json* gemm_plans, const TpRank* tp = nullptr) {
  const bool print = tp == nullptr || tp->rank == 0;
  CudaRunnerOptions o;
  if (tp != nullptr) {
    o.device = tp->rank;
    o.tp_rank = tp->rank;
    o.tp_size = tp->size;
    o.tp_all_reduce = tp->all_reduce;
  }
  o.autotune_gemms = autotune;
  o.gemm_tuning = f.gemm_tuning;
  o.gemm_tuning_save = f.gemm_tuning_save;
  o.l2_persist_activations = f.l2_persist;
  o.batch_invariant = f.batch_invariant;
  o.attention = f.attention;
  o.decode_pdl_level = f.decode_pdl;
  o.linear = f.linear;
  o.moe = f.moe;
  o.mla = f.mla;
  o.block_size = 16;
  o.max_model_len = f.context + f.decode_steps + 16;
  o.max_num_seqs = *std::max_element(f.batches.begin(), f.batches.end());
  o.max_num_tokens = o.max_num_seqs;
  auto runner = CreateDummyCudaRunner(config, kDefaultDummySeed, o);
  if (!runner.ok()) return runner.status();
  const int64_t bps = (o.max_model_len + o.block_size - 1) / o.block_size;
  SLUICE_RETURN_IF_ERROR((*runner)->AllocateKvCache(o.max_num_seqs * bps));
  const double all_weight_bytes = static_cast<double>((*runner)->WeightBytesPerStep());
  const double active_bytes = static_cast<double>((*runner)->ActiveWeightBytesPerToken());
  const bool moe = config.architecture == Architecture::kDeepseekV3 &&
                   config.first_k_dense_replace < config.num_hidden_layers &&
                   config.num_experts_per_tok < config.n_routed_experts;
  // all = base + X, active = base + X·k/E (X: all routed-expert bytes).
  const double e_count = moe ? static_cast<double>(config.n_routed_experts) : 1.0;
  const double k_frac = moe ? config.num_experts_per_tok / e_count : 1.0;
  const double expert_bytes = moe ? (all_weight_bytes - active_bytes) / (1.0 - k_frac) : 0.0;
  const double kv_per_token = static_cast<double>((*runner)->KvBytesPerToken());
  nlohmann::json out = nlohmann::json::array();
  for (int64_t b : f.batches) {
    DecodePlanner planner(b, f.context, o.block_size, bps);
    ForwardInput in;
    constexpr int kWarmup = 4;
    for (int i = 0; i < kWarmup; ++i) {
      planner.Plan(i, i == 0, &in);
      SLUICE_RETURN_IF_ERROR((*runner)->Step(in));
    }
    SLUICE_RETURN_IF_ERROR((*runner)->Synchronize());
    if (tp != nullptr) tp->barrier();
    const bool graph = (*runner)->last_step().graph;
    // The runner's stream is private: time on the host around fully enqueued work, bracketed by
    // synchronizations (the host only enqueues, so it runs ahead of the GPU).
    const int64_t steps = f.decode_steps - kWarmup;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      planner.Plan(kWarmup + i, false, &in);
      SLUICE_RETURN_IF_ERROR((*runner)->Step(in));
    }
    auto tokens = (*runner)->SampledTokens();
    if (!tokens.ok()) return tokens.status();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double itl_ms = ms / static_cast<double>(steps);
    const double mean_ctx = static_cast<double>(f.context) + kWarmup + steps / 2.0;
    // Expected distinct experts per MoE layer at batch b (uniform routing), as a fraction of E.
    const double touched = moe ? 1.0 - std::pow(1.0 - k_frac, static_cast<double>(b)) : 1.0;
    const double weight_bytes = all_weight_bytes - expert_bytes + expert_bytes * touched;
    const double step_bytes = weight_bytes + b * mean_ctx * kv_per_token;
    const double roofline_ms = step_bytes / (copy_gbps * 1e9) * 1e3;
    int64_t distinct = 0;
    {
      std::vector<int32_t> t = *tokens;
      std::sort(t.begin(), t.end());
      distinct = std::unique(t.begin(), t.end()) - t.begin();
    }
    nlohmann::json breakdown = nlohmann::json::array();
    if (f.breakdown) {
      planner.Plan(f.decode_steps, false, &in);
      auto prof = (*runner)->ProfileStep(in);
      if (!prof.ok()) return prof.status();
      double total = 0.0;
      for (const ProfileEntry& e : *prof) total += e.ms;
      if (print) {
        std::printf("  breakdown B=%lld (eager, back to back): total %.3f ms\n",
                    static_cast<long long>(b), total);
      }
      for (const ProfileEntry& e : *prof) {
        breakdown.push_back({{"op", e.op},
                             {"calls", e.launches_between_marks},
                             {"ms", e.ms},
                             {"us_per_call", e.ms * 1e3 / e.launches_between_marks},
                             {"share", e.ms / total}});
        if (print) {
          std::printf("    %-14s %4lld calls %8.3f ms %8.1f us/call %5.1f%%\n", e.op.c_str(),
                      static_cast<long long>(e.launches_between_marks), e.ms,
                      e.ms * 1e3 / e.launches_between_marks, 100.0 * e.ms / total);
        }
      }
      std::fflush(stdout);
    }
    out.push_back({{"batch", b},
                   {"tp", tp != nullptr ? tp->size : 1},
                   {"gemm_autotune", autotune},
                   {"breakdown", breakdown},
                   {"context", f.context},
                   {"steps_timed", steps},
                   {"cuda_graph", graph},
                   {"itl_ms", itl_ms},
                   {"tokens_per_s", b * 1e3 / itl_ms},
                   {"weight_bytes", weight_bytes},
                   {"weight_bytes_all_experts", all_weight_bytes},
                   {"expected_experts_touched_per_moe_layer", touched * e_count},
                   {"kv_bytes", b * mean_ctx * kv_per_token},
                   {"roofline_ms", roofline_ms},
                   {"roofline_tokens_per_s", b * 1e3 / roofline_ms},
                   {"ratio_to_roofline", itl_ms / roofline_ms},
                   {"distinct_last_tokens", distinct}});
    if (print) {
      std::printf(
          "decode B=%lld: ITL %.3f ms (%.0f tok/s), roofline %.3f ms, ratio %.3f, graph %d\n",
          static_cast<long long>(b), itl_ms, b * 1e3 / itl_ms, roofline_ms, itl_ms / roofline_ms,
          graph);
    }
    std::fflush(stdout);
  }
  if (gemm_plans != nullptr) {
    const std::string plans = (*runner)->GemmPlans();
    if (print) std::printf("GEMM plans (autotune %d):\n%s", autotune, plans.c_str());
    std::fflush(stdout);
    *gemm_plans = nlohmann::json::array();
    for (absl::string_view line : absl::StrSplit(plans, '\n', absl::SkipEmpty())) {
      gemm_plans->push_back(std::string(line));
    }
  }
  return out;
}

#if SLUICE_HAVE_NCCL
// BenchDecodeTp runs BenchDecode on f.tp ranks (GPUs 0..f.tp-1), one thread each, and returns
// rank 0's figures (or the first rank's error).
absl::StatusOr<nlohmann::json> BenchDecodeTp(const ModelConfig& config, const Flags& f,
                                             double copy_gbps, nlohmann::json* gemm_plans) {
  auto id = NcclCommunicator::NewUniqueId();
  if (!id.ok()) return id.status();
  std::barrier sync(f.tp);
  std::vector<absl::StatusOr<nlohmann::json>> results(static_cast<size_t>(f.tp),
                                                      absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < f.tp; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = NcclCommunicator::Create(*id, rank, f.tp, /*device=*/rank);
      if (!comm.ok()) {
        results[rank] = comm.status();
        return;
      }
      NcclCommunicator* c = comm->get();
      TpRank t;
      t.rank = rank;
      t.size = f.tp;
      t.all_reduce = [c](void* data, int64_t count, void* stream) {
        return c->EnqueueAllReduceSum(data, count, CommDataType::kBFloat16, stream);
      };
      t.barrier = [&sync] { sync.arrive_and_wait(); };
      // The runner lives inside BenchDecode, so it ends before the communicator.
      results[rank] = BenchDecode(config, f, copy_gbps, /*autotune=*/true,
                                  rank == 0 ? gemm_plans : nullptr, &t);
    });
  }
  for (std::thread& t : threads) t.join();
  for (auto& r : results) {
    if (!r.ok()) return r.status();
  }
  return std::move(results[0]);
}
#endif

absl::StatusOr<nlohmann::json> BenchPrefill(const ModelConfig& c, const Flags& f,
                                            double gemm_tflops) {
  const int64_t max_t = *std::max_element(f.prefill.begin(), f.prefill.end());
  CudaRunnerOptions o;
  o.linear = f.linear;
  o.moe = f.moe;
  o.mla = f.mla;
  o.block_size = 16;
  o.max_model_len = max_t;
  o.max_num_tokens = max_t;
  o.max_num_seqs = 1;
  o.use_cuda_graphs = false;
  o.attention = f.attention;
  o.decode_pdl_level = f.decode_pdl;
  o.batch_invariant = f.batch_invariant;
  auto runner = CreateDummyCudaRunner(c, kDefaultDummySeed, o);
  if (!runner.ok()) return runner.status();
  const int64_t blocks = (max_t + o.block_size - 1) / o.block_size;
  SLUICE_RETURN_IF_ERROR((*runner)->AllocateKvCache(blocks));
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>(i);
  const double hd = static_cast<double>(c.head_dim);
  const bool mla = c.architecture == Architecture::kDeepseekV3;
  // Per-token matmul parameters: Llama from the config; DeepSeek from the runner's active bytes
  // (top-k experts) less the embedding row, the lm_head (counted below) and the norms.
  const double matmul_params =
      mla ? (*runner)->ActiveWeightBytesPerToken() / 2.0 - c.hidden_size -
                static_cast<double>(c.vocab_size) * c.hidden_size
          : static_cast<double>(c.num_hidden_layers) *
                (c.hidden_size * (c.num_attention_heads + 2.0 * c.num_key_value_heads) * hd +
                 c.hidden_size * c.num_attention_heads * hd +
                 3.0 * c.hidden_size * c.intermediate_size);
  // Multiply-adds per (query, key) pair and head: q·k and p·v.
  const double attn_width =
      mla ? 2.0 * c.kv_lora_rank + c.qk_rope_head_dim : 2.0 * hd;
  nlohmann::json out = nlohmann::json::array();
  for (int64_t T : f.prefill) {
    ForwardInput in;
    for (int64_t t = 0; t < T; ++t) {
      in.token_ids.push_back(static_cast<int32_t>((t * 7919) % c.vocab_size));
      in.positions.push_back(static_cast<int32_t>(t));
      in.slot_mapping.push_back(t);
    }
    in.sequences.push_back({0, static_cast<int32_t>(T), 0, absl::MakeConstSpan(table)});
    in.logits_indices.push_back(static_cast<int32_t>(T - 1));
    SLUICE_RETURN_IF_ERROR((*runner)->Step(in));  // warm-up (cuBLASLt plans, workspace)
    SLUICE_RETURN_IF_ERROR((*runner)->Synchronize());
    constexpr int kIters = 3;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) SLUICE_RETURN_IF_ERROR((*runner)->Step(in));
    SLUICE_RETURN_IF_ERROR((*runner)->Synchronize());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        kIters;
    const double flops = 2.0 * matmul_params * T + 2.0 * c.hidden_size * c.vocab_size +
                         2.0 * c.num_hidden_layers * c.num_attention_heads * attn_width * T * T /
                             2.0;
    const double tflops = flops / (ms * 1e-3) / 1e12;
    // Where the prefill time goes: the same step once more with an event after every op.
    nlohmann::json breakdown = nlohmann::json::array();
    if (f.breakdown) {
      auto prof = (*runner)->ProfileStep(in);
      if (!prof.ok()) return prof.status();
      for (const ProfileEntry& e : *prof) {
        breakdown.push_back({{"op", e.op},
                             {"calls", e.launches_between_marks},
                             {"ms", e.ms},
                             {"share", e.ms / ms}});
      }
    }
    out.push_back({{"tokens", T},
                   {"ms", ms},
                   {"tokens_per_s", T * 1e3 / ms},
                   {"model_tflops", tflops},
                   {"fraction_of_gemm", tflops / gemm_tflops},
                   {"breakdown", breakdown}});
    std::printf("prefill T=%lld: %.2f ms, %.0f tok/s, %.0f TFLOP/s (%.2f of GEMM)\n",
                static_cast<long long>(T), ms, T * 1e3 / ms, tflops, tflops / gemm_tflops);
    for (const auto& e : breakdown) {
      std::printf("  %-14s %3d calls %9.3f ms\n", e["op"].get<std::string>().c_str(),
                  e["calls"].get<int>(), e["ms"].get<double>());
    }
    std::fflush(stdout);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  if (s.empty()) return out;  // e.g. --prefill "": no prefill rows
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(p, &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat("bad list element '", p, "'"));
    }
    out.push_back(v);
  }
  return out;
}

// The --attn-decode-kernel / --attn-prefill-kernel values, and their names in the output.
constexpr std::pair<const char*, kernels::PagedDecodeKernel> kDecodeKernels[] = {
    {"auto", kernels::PagedDecodeKernel::kAuto},
    {"rings", kernels::PagedDecodeKernel::kWarpRings},
    {"persistent", kernels::PagedDecodeKernel::kPersistentWarps}};
constexpr std::pair<const char*, kernels::PagedPrefillKernel> kPrefillKernels[] = {
    {"wgmma", kernels::PagedPrefillKernel::kWgmma},
    {"fa2", kernels::PagedPrefillKernel::kFa2},
    {"mma", kernels::PagedPrefillKernel::kMmaTiles},
    {"cta", kernels::PagedPrefillKernel::kCtaTiles}};

template <typename K, size_t N>
absl::StatusOr<K> ParseKernel(const std::pair<const char*, K> (&names)[N], const std::string& v,
                              const char* flag) {
  for (const auto& [name, k] : names) {
    if (v == name) return k;
  }
  std::string all;
  for (const auto& [name, k] : names) absl::StrAppend(&all, all.empty() ? "" : "|", name);
  return absl::InvalidArgumentError(absl::StrCat(flag, " takes ", all, ", not '", v, "'"));
}
absl::StatusOr<kernels::PagedDecodeKernel> ParseDecodeKernel(const std::string& v) {
  return ParseKernel(kDecodeKernels, v, "--attn-decode-kernel");
}
absl::StatusOr<kernels::PagedPrefillKernel> ParsePrefillKernel(const std::string& v) {
  return ParseKernel(kPrefillKernels, v, "--attn-prefill-kernel");
}
template <typename K, size_t N>
std::string KernelName(const std::pair<const char*, K> (&names)[N], K k) {
  for (const auto& [name, value] : names) {
    if (value == k) return name;
  }
  return "?";
}
std::string DecodeKernelName(kernels::PagedDecodeKernel k) { return KernelName(kDecodeKernels, k); }
std::string PrefillKernelName(kernels::PagedPrefillKernel k) {
  return KernelName(kPrefillKernels, k);
}

// WriteJson prints `out` and writes it to `path` (unless empty).
absl::Status WriteJson(const nlohmann::json& out, const std::string& path) {
  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
  if (!path.empty()) {
    std::ofstream file(path);
    file << text << "\n";
    if (!file) return absl::InternalError("cannot write " + path);
  }
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("missing value for ", a));
    const std::string v = argv[++i];
    if (a == "--config") {
      f.config_dir = v;
    } else if (a == "--out") {
      f.out = v;
    } else if (a == "--breakdown" || a == "--compare-untuned") {
      if (v != "0" && v != "1") return absl::InvalidArgumentError(a + " takes 0 or 1");
      (a == "--breakdown" ? f.breakdown : f.compare_untuned) = v == "1";
    } else if (a == "--attn-decode-kernel") {
      auto k = ParseDecodeKernel(v);
      if (!k.ok()) return k.status();
      f.attention.decode_kernel = *k;
    } else if (a == "--attn-prefill-kernel") {
      auto k = ParsePrefillKernel(v);
      if (!k.ok()) return k.status();
      f.attention.prefill_kernel = *k;
    } else if (a == "--mla-prefill-mha-min") {
      if (!absl::SimpleAtoi(v, &f.mla.mha_prefill_min_query_len) ||
          f.mla.mha_prefill_min_query_len < 0) {
        return absl::InvalidArgumentError("bad " + a);
      }
    } else if (a == "--decode-pdl") {
      if (!absl::SimpleAtoi(v, &f.decode_pdl) || f.decode_pdl < 0 || f.decode_pdl > 3) {
        return absl::InvalidArgumentError("bad " + a);
      }
    } else if (a == "--gemm-tune-candidates") {
      if (!absl::SimpleAtoi(v, &f.linear.tune_candidates)) {
        return absl::InvalidArgumentError("bad " + a);
      }
    } else if (a == "--gemm-tuning") {
      f.gemm_tuning = v;
    } else if (a == "--gemm-tuning-save") {
      f.gemm_tuning_save = v;
    } else if (a == "--batch-invariant") {  // CudaRunnerOptions::batch_invariant
      if (v != "0" && v != "1") return absl::InvalidArgumentError(a + " takes 0 or 1");
      f.batch_invariant = v == "1";
    } else if (a == "--batch-invariant-gemm-ctas") {
      if (!absl::SimpleAtoi(v, &f.linear.batch_invariant_target_ctas) ||
          f.linear.batch_invariant_target_ctas < 1) {
        return absl::InvalidArgumentError("bad " + a);
      }
    } else if (a == "--l2-persist") {
      if (v != "0" && v != "1") return absl::InvalidArgumentError(a + " takes 0 or 1");
      f.l2_persist = v == "1";
    } else if (a == "--gemm-skinny") {
      if (v != "0" && v != "1") return absl::InvalidArgumentError(a + " takes 0 or 1");
      f.linear.skinny_tuning = v == "1";
    } else if (a == "--gemm-algo-search") {
      auto mask = kernels::ParseGemmAlgoSearchMask(v);
      if (!mask.ok()) return mask.status();
      f.linear.algo_search = *mask;
    } else if (a == "--moe-prefill-gemm") {
      if (!absl::SimpleAtoi(v, &f.moe.prefill_gemm_min_tokens) ||
          f.moe.prefill_gemm_min_tokens < 0) {
        return absl::InvalidArgumentError("bad " + a);
      }
    } else if (a == "--moe-prefill-streams") {
      if (!absl::SimpleAtoi(v, &f.moe.prefill_gemm_streams)) {
        return absl::InvalidArgumentError("bad " + a);
      }
    } else if (a == "--tp") {
      if (!absl::SimpleAtoi(v, &f.tp) || f.tp < 1) return absl::InvalidArgumentError("bad --tp");
    } else if (a == "--context" || a == "--decode-steps") {
      int64_t n;
      if (!absl::SimpleAtoi(v, &n) || n < 1) return absl::InvalidArgumentError("bad " + a);
      (a == "--context" ? f.context : f.decode_steps) = n;
    } else if (a == "--prefill" && v.empty()) {  // --prefill "": decode figures only
      f.prefill.clear();
    } else if (a == "--batches" || a == "--prefill") {
      auto l = ParseList(v);
      if (!l.ok()) return l.status();
      (a == "--batches" ? f.batches : f.prefill) = *l;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
  }
  if (f.decode_steps < 8) return absl::InvalidArgumentError("--decode-steps must be >= 8");
  if (f.batches.empty()) return absl::InvalidArgumentError("--batches needs at least one size");
  auto config = ModelConfig::Load(f.config_dir);
  if (!config.ok()) return config.status();
  if (f.tp > 1) {
#if !SLUICE_HAVE_NCCL
    return absl::UnimplementedError("--tp > 1: built without NCCL");
#endif
    if (config->architecture == Architecture::kDeepseekV3) {
      return absl::UnimplementedError("--tp > 1: Llama-family configs only");
    }
    int gpus = 0;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
    if (gpus < f.tp) {
      return absl::FailedPreconditionError(absl::StrCat("--tp ", f.tp, ": ", gpus, " GPUs"));
    }
  }
  auto gpu = kernels::CudaDeviceName();
  if (!gpu.ok()) return gpu.status();
  nlohmann::json out;
  out["gpu"] = *gpu;
  out["config"] = f.config_dir;
  out["weights"] = "dummy (engine/model/dummy_weights.h), bf16";
  auto copy = CopyGbps();
  if (!copy.ok()) return copy.status();
  auto gemm = GemmTflops(4096, 2 * config->intermediate_size, config->hidden_size);
  if (!gemm.ok()) return gemm.status();
  out["copy_gbps"] = *copy;
  out["gemm_tflops"] = *gemm;
  out["gemm_shape"] = {4096, 2 * config->intermediate_size, config->hidden_size};
  std::printf("%s: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", gpu->c_str(), *copy, *gemm);
  std::fflush(stdout);
  out["tp"] = f.tp;
  out["attn_decode_kernel"] = DecodeKernelName(f.attention.decode_kernel);
  out["attn_prefill_kernel"] = PrefillKernelName(f.attention.prefill_kernel);
  out["mla_prefill_mha_min"] = f.mla.mha_prefill_min_query_len;
  out["moe_prefill_gemm"] = f.moe.prefill_gemm_min_tokens;
  out["moe_prefill_streams"] = f.moe.prefill_gemm_streams;
  out["gemm_tune_candidates"] = f.linear.tune_candidates;
  out["decode_pdl"] = kernels::PdlSupported() ? f.decode_pdl : 0;
  out["gemm_algo_search"] = f.linear.algo_search;
  out["gemm_skinny"] = f.linear.skinny_tuning ? 1 : 0;
  out["gemm_tuning"] = f.gemm_tuning;
  out["l2_persist"] = f.l2_persist ? 1 : 0;
  out["batch_invariant"] = f.batch_invariant ? 1 : 0;
  out["batch_invariant_gemm_ctas"] = f.linear.batch_invariant_target_ctas;
  nlohmann::json plans;
#if SLUICE_HAVE_NCCL
  auto decode = f.tp > 1 ? BenchDecodeTp(*config, f, *copy, &plans)
                         : BenchDecode(*config, f, *copy, /*autotune=*/true, &plans);
#else
  auto decode = BenchDecode(*config, f, *copy, /*autotune=*/true, &plans);
#endif
  if (!decode.ok()) return decode.status();
  out["decode"] = *decode;
  out["gemm_plans"] = plans;
  if (f.tp > 1) return WriteJson(out, f.out);
  if (f.compare_untuned) {
    nlohmann::json untuned_plans;
    auto untuned = BenchDecode(*config, f, *copy, /*autotune=*/false, &untuned_plans);
    if (!untuned.ok()) return untuned.status();
    out["decode_untuned"] = *untuned;
    out["gemm_plans_untuned"] = untuned_plans;
  }
  if (f.prefill.empty()) {
    out["prefill"] = nlohmann::json::array();
  } else {
    auto prefill = BenchPrefill(*config, f, *gemm);
    if (!prefill.ok()) return prefill.status();
    out["prefill"] = *prefill;
  }
  return WriteJson(out, f.out);
}

}  // namespace
}  // namespace sluice::cuda_runner

int main(int argc, char** argv) {
  const absl::Status s = sluice::cuda_runner::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "cuda_decode_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
