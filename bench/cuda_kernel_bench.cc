// cuda_kernel_bench: ceilings and kernel rates of the CUDA backend on the current GPU.
//   cuda_kernel_bench [OUT.json] [--attention-only | --sampling-only | --gemm-context-only]
// --attention-only: the copy bandwidth and the attention section only.
// Measures (CUDA events, mean over timed repetitions after warm-ups):
//   - device-to-device copy bandwidth (cudaMemcpyAsync, bytes read + written per second);
//   - bf16 GEMM TFLOP/s through LinearCuda (cuBLASLt, fp32 accumulation), 2·m·n·k per product;
//   - RMSNorm, fused add+RMSNorm and SiLU·mul achieved bandwidth (bytes the kernel must move)
//     and its fraction of the copy bandwidth;
//   - paged attention (Llama-3-8B layer shapes: 32 heads, 8 KV heads, head_dim 128, block 16):
//     decode at batch 1/64/256 × context 1k/8k as KV bytes read per second and as a fraction of
//     the copy bandwidth (each timed call reads other sequences' blocks than the previous one,
//     so the KV comes from HBM, not L2), and causal prefill of 4k/16k tokens in TFLOP/s
//     (4·head_dim·heads per visible query-key pair: Q·Kᵀ and P·V) per prefill kernel
//     (PagedAttentionOptions::prefill_kernel: "wgmma", the default, then "fa2", "mma", "cta");
//     Decode rows come per decode kernel (PagedAttentionOptions::decode_kernel: "auto", the
//     default the engine runs, "rings", "persistent"), as A/B; "us" is the device time of a
//     call replayed from a CUDA graph (as the engine's decode steps run), "us_eager" that of
//     eager calls (host launch costs included);
//   - MLA latent attention at DeepSeek-V2-Lite shapes: decode at batch 1/64 × context 1k/8k
//     (and one-tile shapes; the decode kernel's ring depth as its shape rule picks it; latent
//     bytes read per second, its fraction of the copy bandwidth, TFLOP/s; each call reads other
//     sequences' rows than the previous one) and causal prefill of 4096 tokens (TFLOP/s).
//   - MoE routed experts at DeepSeek-V2-Lite shapes (64 experts, hidden 2048, intermediate
//     1408, top-6) for 1 to 4096 tokens: every row gives touched experts' weight bytes per
//     second, fraction of the copy bandwidth (consecutive calls route to disjoint experts, or
//     touch all 64, so weights come from HBM) and TFLOP/s; the GEMV path (T <= 8) should be
//     near the copy bandwidth, the grouped GEMM (prefill) judged by TFLOP/s; at 8 and 16 tokens
//     both paths are timed (kMoeGemvMaxTokens' crossover). DeepSeek-V3 routing (256 experts)
//     latency.
//   - Token sampling (SampleRowsCuda) at Qwen's vocab (151,936), 1 and 256 rows, on peaked
//     logits (a few tokens far above a wide normal, like a confident LM) and flat ones (a
//     narrow normal: top_p keeps thousands of tokens), per parameter set (greedy, temperature,
//     top_k 50, top_p 0.9, both, min_p): milliseconds a call.
// --sampling-only: the sampling section only.
// --gemm-context-only: Llama-3-8B decode GEMMs at m = 64 and 256 through LinearCuda (cuBLASLt's
//   heuristic pick, the same algorithm in every condition), each call timed alone with events
//   after one of: nothing (back to back), a 100 MB read (L2 flushed), a contiguous 1.1 GB read,
//   or 1.1 GB read as 32 KiB rows 512 KiB apart over 17.6 GB (a decode attention's sweep over
//   paged KV blocks: other lines in L2 and other pages in the TLBs); the conditions run
//   interleaved, so clock drift hits them alike. For why GEMMs run slower inside the decode
//   graph than the autotuner times them. (back_to_back starts its events on an idle GPU, so it
//   also times the host's launch of the GEMM; the other three queue the GEMM behind the read.)
// Prints the JSON and writes it to OUT.json when given. Exit code 1 on any CUDA error.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/activation/activation_cuda.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/mla_attention/mla_attention_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/rms_norm/rms_norm_cuda.h"
#include "kernels/sampling/sampling_cuda.h"
#include "nlohmann/json.hpp"

namespace sluice::kernels {
namespace {

// TimeMs returns the mean milliseconds of one call of `fn` over `iters` calls after `warmup`.
absl::StatusOr<double> TimeMs(const std::function<absl::Status()>& fn, int warmup, int iters,
                              cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) {
    absl::Status s = fn();
    if (!s.ok()) return s;
  }
  cudaEvent_t start, stop;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "cudaEventCreate");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) {
    absl::Status s = fn();
    if (!s.ok()) return s;
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream), "cudaEventRecord");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(ms) / iters;
}

// TimeGraphMs returns the mean milliseconds of one call of `fn` replayed from a CUDA graph of
// `iters` captured calls, over `reps` replays after a warm one: the device time as the engine's
// captured decode steps see it, without the eager calls' host-side planning and launch costs
// (which bound TimeMs for short kernels). Two eager calls first keep one-time setup (occupancy
// queries, function attributes) out of the capture.
absl::StatusOr<double> TimeGraphMs(const std::function<absl::Status()>& fn, int iters, int reps,
                                   cudaStream_t stream) {
  for (int i = 0; i < 2; ++i) {
    absl::Status s = fn();
    if (!s.ok()) return s;
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture");
  absl::Status captured = absl::OkStatus();
  for (int i = 0; i < iters && captured.ok(); ++i) captured = fn();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!captured.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return captured;
  }
  SLUICE_CUDA_RETURN_IF_ERROR(end, "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  SLUICE_CUDA_RETURN_IF_ERROR(inst, "cudaGraphInstantiate");
  cudaEvent_t start, stop;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "cudaEventCreate");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int r = 0; r < reps; ++r) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream), "cudaEventRecord");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  return static_cast<double>(ms) / (static_cast<double>(iters) * reps);
}

absl::StatusOr<DeviceBuffer<bf16>> RandomDevice(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<bf16> host(n);
  for (auto& v : host) v = FloatToBf16(dist(rng));
  auto buf = DeviceBuffer<bf16>::Create(n);
  if (!buf.ok()) return buf.status();
  absl::Status s = buf->CopyFromHost(host.data());
  if (!s.ok()) return s;
  return buf;
}

// Paged attention at Llama-3-8B layer shapes. The cache holds kSeqs sequences of kMaxCtx
// tokens in shuffled blocks (8 GiB K+V); decode call i uses sequences starting at row
// (i·batch) mod kSeqs of the block table, so consecutive calls read disjoint KV.
absl::StatusOr<nlohmann::json> BenchAttention(double copy_gbps, std::mt19937& rng,
                                              cudaStream_t stream) {
  constexpr int64_t kSeqs = 256, kMaxCtx = 8192, kBlock = 16;
  PagedAttentionParams p;
  p.num_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.v_head_dim = 128;
  p.block_size = kBlock;
  p.scale = 0.08838834764831845f;  // 1/sqrt(128)
  const int64_t blocks_per_seq = kMaxCtx / kBlock;
  const int64_t num_blocks = kSeqs * blocks_per_seq;
  const size_t cache_elems = static_cast<size_t>(num_blocks * kBlock * p.num_kv_heads * 128);
  SLUICE_ASSIGN_OR_RETURN(auto k_cache, DeviceBuffer<bf16>::Create(cache_elems));
  SLUICE_ASSIGN_OR_RETURN(auto v_cache, DeviceBuffer<bf16>::Create(cache_elems));
  // Bytes 0x3C: every element is bf16 0x3C3C (≈0.0115); the kernels' speed is value-blind.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(k_cache.data(), 0x3C, k_cache.bytes()), "cudaMemset");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(v_cache.data(), 0x3C, v_cache.bytes()), "cudaMemset");
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  std::shuffle(tables.begin(), tables.end(), rng);
  // Twice the rows, so a window of `batch` rows starting anywhere below kSeqs stays in range.
  tables.insert(tables.end(), tables.begin(), tables.end());
  SLUICE_ASSIGN_OR_RETURN(auto d_tables, DeviceBuffer<int32_t>::Create(tables.size()));
  if (absl::Status s = d_tables.CopyFromHost(tables.data()); !s.ok()) return s;
  const int64_t max_tokens = 16384;
  SLUICE_ASSIGN_OR_RETURN(auto q,
                          RandomDevice(static_cast<size_t>(max_tokens * 32 * 128), rng, -1, 1));
  SLUICE_ASSIGN_OR_RETURN(auto o, DeviceBuffer<bf16>::Create(q.size()));
  std::vector<int32_t> starts(static_cast<size_t>(kSeqs + 1));
  for (size_t i = 0; i < starts.size(); ++i) starts[i] = static_cast<int32_t>(i);
  SLUICE_ASSIGN_OR_RETURN(auto d_starts, DeviceBuffer<int32_t>::Create(starts.size()));
  if (absl::Status s = d_starts.CopyFromHost(starts.data()); !s.ok()) return s;
  SLUICE_ASSIGN_OR_RETURN(auto d_ctx, DeviceBuffer<int32_t>::Create(kSeqs));

  // Decode steps: `batch` sequences of one new token each, the ctx-th token (ctx - 1 cached
  // plus itself, ctx keys in all).
  auto set_context = [&](int64_t ctx) {
    std::vector<int32_t> ctx_lens(kSeqs, static_cast<int32_t>(ctx - 1));
    return d_ctx.CopyFromHost(ctx_lens.data());
  };
  auto decode_batch = [&](int64_t batch, int64_t ctx) {
    PagedAttentionCudaBatch b;
    b.query_start_loc = d_starts.data();
    b.context_lens = d_ctx.data();
    b.block_tables = d_tables.data();
    b.max_blocks_per_seq = blocks_per_seq;
    b.num_sequences = batch;
    b.num_tokens = batch;
    b.max_query_len = 1;
    b.max_seq_len = ctx;
    return b;
  };
  nlohmann::json decode = nlohmann::json::array();
  const std::pair<const char*, PagedDecodeKernel> decode_kernels[] = {
      {"auto", PagedDecodeKernel::kAuto},
      {"rings", PagedDecodeKernel::kWarpRings},
      {"persistent", PagedDecodeKernel::kPersistentWarps}};
  for (const auto& [kernel, decode_kernel] : decode_kernels) {
    PagedAttentionOptions options;
    options.decode_kernel = decode_kernel;
    for (const int64_t ctx : {int64_t{1024}, kMaxCtx}) {
      if (absl::Status s = set_context(ctx); !s.ok()) return s;
      for (const int64_t batch : {int64_t{1}, int64_t{64}, int64_t{256}}) {
        const PagedAttentionCudaBatch b = decode_batch(batch, ctx);
        const size_t ws_bytes = PagedAttentionCudaWorkspaceBytes(b, p, options);
        SLUICE_ASSIGN_OR_RETURN(auto ws, DeviceBuffer<uint8_t>::Create(ws_bytes));
        int64_t call = 0;
        auto step = [&]() {
          PagedAttentionCudaBatch shifted = b;
          shifted.block_tables = d_tables.data() + ((call++ * batch) % kSeqs) * blocks_per_seq;
          return PagedAttentionCuda(q.data(), 32 * 128, k_cache.data(), v_cache.data(), shifted, p,
                                    ws.data(), o.data(), stream, options);
        };
        SLUICE_ASSIGN_OR_RETURN(auto eager_ms,
                                TimeMs(step, 3, batch == 256 && ctx == kMaxCtx ? 10 : 50, stream));
        SLUICE_ASSIGN_OR_RETURN(
            auto ms, TimeGraphMs(step, 20, batch == 256 && ctx == kMaxCtx ? 2 : 5, stream));
        const double kv_bytes = 2.0 * batch * ctx * p.num_kv_heads * 128 * sizeof(bf16);
        const double gbps = kv_bytes / (ms * 1e-3) / 1e9;
        decode.push_back({{"kernel", kernel},
                          {"batch", batch},
                          {"context", ctx},
                          {"kv_bytes_read", kv_bytes},
                          {"workspace_bytes", ws_bytes},
                          {"us", ms * 1e3},
                          {"us_eager", eager_ms * 1e3},
                          {"kv_bandwidth_gbps", gbps},
                          {"fraction_of_copy", gbps / copy_gbps}});
      }
    }
  }

  // MLA latent attention at DeepSeek-V2-Lite shapes (16 heads, kv_lora_rank 512, rope 64):
  // decode over 1k/8k contexts; latent rows of 576 are read through the K buffer's blocks.
  nlohmann::json mla = nlohmann::json::array();
  nlohmann::json mla_prefill = nlohmann::json::array();
  {
    MlaDims dims;
    dims.num_heads = 16;
    dims.kv_lora_rank = 512;
    dims.qk_rope_head_dim = 64;
    dims.qk_nope_head_dim = 128;
    dims.v_head_dim = 128;
    dims.softmax_scale = 0.07216878364870322f;  // 1/sqrt(192)
    const int64_t width = dims.LatentWidth();
    {
      // (batch, context): the DeepSeek-V2-Lite decode targets, then one-tile shapes that show
      // a CTA's fixed cost (1 × 32, 128 × 32) and its per-tile cost (128 × 256).
      const std::pair<int64_t, int64_t> shapes[] = {
          {1, 1024}, {64, 1024}, {1, kMaxCtx}, {64, kMaxCtx}, {1, 32}, {128, 32}, {128, 256}};
      for (const auto& [batch, ctx] : shapes) {
        if (absl::Status s = set_context(ctx); !s.ok()) return s;
        {
          const PagedAttentionCudaBatch b = decode_batch(batch, ctx);
          const size_t ws_bytes = MlaLatentAttentionCudaWorkspaceBytes(b, dims);
          SLUICE_ASSIGN_OR_RETURN(auto ws, DeviceBuffer<uint8_t>::Create(ws_bytes));
          // Latent rows of width 576 over the K buffer: num_blocks·16 rows of 576 fit in it.
          // Consecutive calls take other rows of the block table (as for paged decode).
          int64_t call = 0;
          auto step = [&]() {
            PagedAttentionCudaBatch shifted = b;
            shifted.block_tables = d_tables.data() + ((call++ * batch) % kSeqs) * blocks_per_seq;
            return MlaLatentAttentionCuda(q.data(), dims.num_heads * width, k_cache.data(), kBlock,
                                          shifted, dims, ws.data(), o.data(), stream);
          };
          SLUICE_ASSIGN_OR_RETURN(auto eager_ms, TimeMs(step, 3, 20, stream));
          SLUICE_ASSIGN_OR_RETURN(auto ms, TimeGraphMs(step, 20, 5, stream));
          const double bytes = static_cast<double>(batch) * ctx * width * sizeof(bf16);
          const double fmas =
              static_cast<double>(batch) * ctx * dims.num_heads * (width + dims.kv_lora_rank);
          const double gbps = bytes / (ms * 1e-3) / 1e9;
          mla.push_back({{"batch", batch},
                         {"context", ctx},
                         {"workspace_bytes", ws_bytes},
                         {"us", ms * 1e3},
                         {"us_eager", eager_ms * 1e3},
                         {"latent_bandwidth_gbps", gbps},
                         {"fraction_of_copy", gbps / copy_gbps},
                         {"tflops", 2 * fmas / (ms * 1e-3) / 1e12}});
        }
      }
    }
    // Causal prefill of one 4096-token sequence with no cached prefix (tensor-core tiles):
    // 2·(width + kv_lora_rank) FLOPs per head and visible query-key pair (Q·Kᵀ, P·V).
    const int64_t tokens = 4096;
    const std::vector<int32_t> starts1 = {0, static_cast<int32_t>(tokens)}, ctx0 = {0};
    SLUICE_ASSIGN_OR_RETURN(auto d_starts1, DeviceBuffer<int32_t>::Create(2));
    SLUICE_ASSIGN_OR_RETURN(auto d_ctx0, DeviceBuffer<int32_t>::Create(1));
    if (absl::Status s = d_starts1.CopyFromHost(starts1.data()); !s.ok()) return s;
    if (absl::Status s = d_ctx0.CopyFromHost(ctx0.data()); !s.ok()) return s;
    PagedAttentionCudaBatch b = decode_batch(1, tokens);
    b.query_start_loc = d_starts1.data();
    b.context_lens = d_ctx0.data();
    b.num_tokens = tokens;
    b.max_query_len = tokens;
    const size_t ws_bytes = MlaLatentAttentionCudaWorkspaceBytes(b, dims);
    SLUICE_ASSIGN_OR_RETURN(auto ws, DeviceBuffer<uint8_t>::Create(ws_bytes));
    SLUICE_ASSIGN_OR_RETURN(auto ms, TimeMs(
                                         [&]() {
                                           return MlaLatentAttentionCuda(
                                               q.data(), dims.num_heads * width, k_cache.data(),
                                               kBlock, b, dims, ws.data(), o.data(), stream);
                                         },
                                         3, 20, stream));
    const double pairs = 0.5 * static_cast<double>(tokens) * static_cast<double>(tokens + 1);
    const double flops = 2.0 * pairs * dims.num_heads * (width + dims.kv_lora_rank);
    mla_prefill.push_back({{"tokens", tokens},
                           {"causal", true},
                           {"us", ms * 1e3},
                           {"tflops", flops / (ms * 1e-3) / 1e12}});
  }

  // Prefill per prefill kernel (PagedAttentionOptions::prefill_kernel; the default first), as
  // A/B.
  nlohmann::json prefill = nlohmann::json::array();
  const std::pair<const char*, PagedPrefillKernel> prefill_kernels[] = {
      {"wgmma", PagedPrefillKernel::kWgmma},
      {"fa2", PagedPrefillKernel::kFa2},
      {"mma", PagedPrefillKernel::kMmaTiles},
      {"cta", PagedPrefillKernel::kCtaTiles}};
  for (const auto& [kernel, prefill_kernel] : prefill_kernels) {
    PagedAttentionOptions options;
    options.prefill_kernel = prefill_kernel;
    for (const int64_t tokens : {int64_t{4096}, max_tokens}) {
      const std::vector<int32_t> one_start = {0, static_cast<int32_t>(tokens)};
      const std::vector<int32_t> zero = {0};
      SLUICE_ASSIGN_OR_RETURN(auto d_one_start, DeviceBuffer<int32_t>::Create(2));
      SLUICE_ASSIGN_OR_RETURN(auto d_zero, DeviceBuffer<int32_t>::Create(1));
      if (absl::Status s = d_one_start.CopyFromHost(one_start.data()); !s.ok()) return s;
      if (absl::Status s = d_zero.CopyFromHost(zero.data()); !s.ok()) return s;
      PagedAttentionCudaBatch b;
      b.query_start_loc = d_one_start.data();
      b.context_lens = d_zero.data();
      b.block_tables = d_tables.data();
      b.max_blocks_per_seq = tokens / kBlock;
      b.num_sequences = 1;
      b.num_tokens = tokens;
      b.max_query_len = tokens;
      b.max_seq_len = tokens;
      const size_t ws_bytes = PagedAttentionCudaWorkspaceBytes(b, p, options);
      SLUICE_ASSIGN_OR_RETURN(auto ws, DeviceBuffer<uint8_t>::Create(ws_bytes));
      SLUICE_ASSIGN_OR_RETURN(auto ms, TimeMs(
                                           [&]() {
                                             return PagedAttentionCuda(
                                                 q.data(), 32 * 128, k_cache.data(), v_cache.data(),
                                                 b, p, ws.data(), o.data(), stream, options);
                                           },
                                           3, tokens == 4096 ? 50 : 10, stream));
      const double pairs = 0.5 * static_cast<double>(tokens) * static_cast<double>(tokens + 1);
      const double flops = 4.0 * 128 * p.num_heads * pairs;
      prefill.push_back({{"kernel", kernel},
                         {"tokens", tokens},
                         {"causal", true},
                         {"ms", ms},
                         {"tflops", flops / (ms * 1e-3) / 1e12}});
    }
  }
  return nlohmann::json{
      {"shape",
       {{"num_heads", 32}, {"num_kv_heads", 8}, {"head_dim", 128}, {"block_size", kBlock}}},
      {"decode", decode},
      {"prefill", prefill},
      {"mla_latent_decode_deepseek_v2_lite", mla},
      {"mla_latent_prefill_deepseek_v2_lite", mla_prefill}};
}

// MoE routed experts at DeepSeek-V2-Lite shapes. Call i of a timed run uses routing set
// i mod kSets; set s sends token t's k-th row to expert (kTopK·(s·T + t) + k) mod kExperts, so
// consecutive decode calls touch disjoint experts and stream their weights from HBM.
absl::StatusOr<nlohmann::json> BenchMoe(double copy_gbps, std::mt19937& rng, cudaStream_t stream) {
  constexpr int64_t kExperts = 64, kHidden = 2048, kInter = 1408, kTopK = 6, kSets = 16;
  const int64_t expert_elems = 3 * kHidden * kInter;
  SLUICE_ASSIGN_OR_RETURN(
      auto w_gate_up,
      RandomDevice(static_cast<size_t>(kExperts * 2 * kInter * kHidden), rng, -0.02f, 0.02f));
  SLUICE_ASSIGN_OR_RETURN(
      auto w_down,
      RandomDevice(static_cast<size_t>(kExperts * kHidden * kInter), rng, -0.02f, 0.02f));
  nlohmann::json rows = nlohmann::json::array();
  // kAuto's choice for every token count, plus the other candidate around the GEMV/grouped
  // crossover (8, 16), to check kMoeGemvMaxTokens.
  const std::pair<int64_t, MoeExpertsPath> cases[] = {
      {1, MoeExpertsPath::kAuto},    {4, MoeExpertsPath::kAuto},   {8, MoeExpertsPath::kAuto},
      {8, MoeExpertsPath::kGrouped}, {16, MoeExpertsPath::kGemv},  {16, MoeExpertsPath::kAuto},
      {64, MoeExpertsPath::kAuto},   {128, MoeExpertsPath::kAuto}, {512, MoeExpertsPath::kAuto},
      {4096, MoeExpertsPath::kAuto}};
  for (const auto& [t, asked] : cases) {
    MoeExpertsPath path = asked;
    if (path == MoeExpertsPath::kAuto) {  // the same rule as MoeExpertsCuda's
      path = t <= kMoeGemvMaxTokens ? MoeExpertsPath::kGemv : MoeExpertsPath::kGrouped;
    }
    const bool decode = path != MoeExpertsPath::kGrouped;
    const char* path_name = path == MoeExpertsPath::kGemv ? "gemv" : "grouped";
    std::vector<int32_t> ids(static_cast<size_t>(kSets * t * kTopK));
    for (int64_t s = 0; s < kSets; ++s) {
      for (int64_t r = 0; r < t * kTopK; ++r) {
        ids[s * t * kTopK + r] = static_cast<int32_t>((s * t * kTopK + r) % kExperts);
      }
    }
    // Distinct experts one call touches (the same for every set).
    std::vector<bool> touched(kExperts, false);
    for (int64_t r = 0; r < t * kTopK; ++r) touched[ids[r]] = true;
    const int64_t n_touched = std::count(touched.begin(), touched.end(), true);
    std::vector<float> weights(ids.size(), 1.0f / kTopK);
    SLUICE_ASSIGN_OR_RETURN(auto d_ids, DeviceBuffer<int32_t>::Create(ids.size()));
    SLUICE_ASSIGN_OR_RETURN(auto d_w, DeviceBuffer<float>::Create(weights.size()));
    if (absl::Status s = d_ids.CopyFromHost(ids.data()); !s.ok()) return s;
    if (absl::Status s = d_w.CopyFromHost(weights.data()); !s.ok()) return s;
    SLUICE_ASSIGN_OR_RETURN(auto x,
                            RandomDevice(static_cast<size_t>(t * kHidden), rng, -1.0f, 1.0f));
    SLUICE_ASSIGN_OR_RETURN(auto out, DeviceBuffer<bf16>::Create(static_cast<size_t>(t * kHidden)));
    const size_t ws_bytes = MoeCudaWorkspaceBytes(t, kTopK, kExperts, kHidden, kInter);
    SLUICE_ASSIGN_OR_RETURN(auto ws, DeviceBuffer<uint8_t>::Create(ws_bytes));
    int64_t call = 0;
    auto run = [&]() {
      const int64_t set = call++ % kSets;
      return MoeExpertsCuda(x.data(), d_ids.data() + set * t * kTopK, d_w.data() + set * t * kTopK,
                            t, kHidden, kInter, kTopK, kExperts, w_gate_up.data(), w_down.data(),
                            out.data(), MoeCudaWorkspace{ws.data(), ws_bytes}, stream, path);
    };
    SLUICE_ASSIGN_OR_RETURN(auto ms, TimeMs(run, 3, decode ? 200 : 20, stream));
    const double weight_bytes = 2.0 * expert_elems * n_touched;
    const double flops = 2.0 * expert_elems * t * kTopK;
    nlohmann::json row = {{"tokens", t},
                          {"path", path_name},
                          {"experts_touched", n_touched},
                          {"ms", ms},
                          {"weight_bytes", weight_bytes},
                          {"weight_gbps", weight_bytes / (ms * 1e-3) / 1e9},
                          {"fraction_of_copy", weight_bytes / (ms * 1e-3) / 1e9 / copy_gbps},
                          {"tflops", flops / (ms * 1e-3) / 1e12}};
    rows.push_back(row);
  }

  // DeepSeek-V3 routing (sigmoid + bias, 8 groups keep 4, top-8 of 256) for 1 and 4096 tokens.
  MoeRoutingParams p;
  p.num_experts = 256;
  p.top_k = 8;
  p.n_group = 8;
  p.topk_group = 4;
  p.routed_scaling_factor = 2.5f;
  nlohmann::json routing = nlohmann::json::array();
  for (const int64_t t : {1, 4096}) {
    SLUICE_ASSIGN_OR_RETURN(auto logits, DeviceBuffer<float>::Create(static_cast<size_t>(t * 256)));
    SLUICE_ASSIGN_OR_RETURN(auto bias, DeviceBuffer<float>::Create(256));
    SLUICE_ASSIGN_OR_RETURN(auto ids, DeviceBuffer<int32_t>::Create(static_cast<size_t>(t * 8)));
    SLUICE_ASSIGN_OR_RETURN(auto w, DeviceBuffer<float>::Create(static_cast<size_t>(t * 8)));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(logits.data(), 0, logits.bytes()), "cudaMemset");
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(bias.data(), 0, bias.bytes()), "cudaMemset");
    SLUICE_ASSIGN_OR_RETURN(auto ms, TimeMs(
                                         [&]() {
                                           return MoeRoutingCuda(logits.data(), bias.data(), t, p,
                                                                 ids.data(), w.data(), stream);
                                         },
                                         3, 100, stream));
    routing.push_back({{"tokens", t}, {"ms", ms}});
  }
  return nlohmann::json{
      {"shape",
       {{"experts", kExperts}, {"hidden", kHidden}, {"intermediate", kInter}, {"top_k", kTopK}}},
      {"experts", rows},
      {"routing_deepseek_v3", routing}};
}

// SampleRowsCuda per parameter set, on rows × 151,936 bf16 logits (peaked and flat), every row
// with the same parameters and its own draw.
absl::StatusOr<nlohmann::json> BenchSampling(std::mt19937& rng, cudaStream_t stream) {
  constexpr int64_t kVocab = 151936;
  struct Set {
    const char* name;
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
  };
  const Set sets[] = {{"greedy", 0.0f, 0, 1.0f, 0.0f},         {"temperature 1", 1.0f, 0, 1.0f, 0.0f},
                      {"top_k 50, T 0.7", 0.7f, 50, 1.0f, 0.0f}, {"top_p 0.9", 1.0f, 0, 0.9f, 0.0f},
                      {"top_k 50, top_p 0.9, T 0.7", 0.7f, 50, 0.9f, 0.0f},
                      {"min_p 0.05", 1.0f, 0, 1.0f, 0.05f}};
  nlohmann::json rows_out = nlohmann::json::array();
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (const int64_t rows : {int64_t{1}, int64_t{256}}) {
    for (const bool peaked : {true, false}) {
      std::normal_distribution<float> normal(0.0f, peaked ? 2.0f : 0.3f);
      std::uniform_int_distribution<int64_t> pick(0, kVocab - 1);
      std::uniform_real_distribution<float> boost(8.0f, 14.0f);
      std::vector<bf16> host(static_cast<size_t>(rows * kVocab));
      for (auto& v : host) v = FloatToBf16(normal(rng));
      if (peaked) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int j = 0; j < 5; ++j) host[r * kVocab + pick(rng)] = FloatToBf16(boost(rng));
        }
      }
      SLUICE_ASSIGN_OR_RETURN(auto logits, DeviceBuffer<bf16>::Create(host.size()));
      SLUICE_RETURN_IF_ERROR(logits.CopyFromHost(host.data()));
      SLUICE_ASSIGN_OR_RETURN(auto tokens, DeviceBuffer<int32_t>::Create(rows));
      SLUICE_ASSIGN_OR_RETURN(auto logprobs, DeviceBuffer<float>::Create(rows));
      SLUICE_ASSIGN_OR_RETURN(auto params, DeviceBuffer<SamplingRow>::Create(rows));
      for (const Set& set : sets) {
        std::vector<SamplingRow> p(static_cast<size_t>(rows));
        for (auto& row : p) {
          row.temperature = set.temperature;
          row.top_k = set.top_k;
          row.top_p = set.top_p;
          row.min_p = set.min_p;
          row.uniform = unit(rng);
        }
        SLUICE_RETURN_IF_ERROR(params.CopyFromHost(p.data()));
        SLUICE_ASSIGN_OR_RETURN(auto ms, TimeMs(
                                             [&]() {
                                               return SampleRowsCuda(logits.data(), rows, kVocab,
                                                                     params.data(), tokens.data(),
                                                                     logprobs.data(), nullptr, 0,
                                                                     stream);
                                             },
                                             3, 20, stream));
        rows_out.push_back({{"rows", rows},
                            {"vocab", kVocab},
                            {"logits", peaked ? "peaked" : "flat"},
                            {"params", set.name},
                            {"ms", ms}});
      }
    }
  }
  return rows_out;
}

// --gemm-context-only (see the top of the file): per shape and condition, the mean µs and
// TFLOP/s of one GEMM call.
absl::StatusOr<nlohmann::json> BenchGemmContext(std::mt19937& rng, cudaStream_t stream) {
  constexpr size_t kRow = size_t{32} << 10, kPitch = size_t{512} << 10;
  constexpr size_t kSweepRows = 33600;  // 1.1 GB of 32 KiB rows
  SLUICE_ASSIGN_OR_RETURN(auto big, DeviceBuffer<uint8_t>::Create(kPitch * kSweepRows));
  SLUICE_ASSIGN_OR_RETURN(auto sink, DeviceBuffer<uint8_t>::Create(kRow * kSweepRows));
  SLUICE_ASSIGN_OR_RETURN(auto lt, CublasLt::Create());
  using Before = std::function<cudaError_t()>;
  const std::vector<std::pair<std::string, Before>> conditions = {
      {"back_to_back", [] { return cudaSuccess; }},
      {"after_100mb_read",
       [&] {
         return cudaMemcpyAsync(sink.data(), big.data(), size_t{100} << 20,
                                cudaMemcpyDeviceToDevice, stream);
       }},
      {"after_1.1gb_contiguous",
       [&] {
         return cudaMemcpyAsync(sink.data(), big.data(), kRow * kSweepRows,
                                cudaMemcpyDeviceToDevice, stream);
       }},
      {"after_1.1gb_paged_sweep", [&] {
         return cudaMemcpy2DAsync(sink.data(), kRow, big.data(), kPitch, kRow, kSweepRows,
                                  cudaMemcpyDeviceToDevice, stream);
       }}};
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096},
                          {"down", 4096, 14336}};
  cudaEvent_t start, stop;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "cudaEventCreate");
  nlohmann::json rows = nlohmann::json::array();
  for (const int64_t m : {int64_t{64}, int64_t{256}}) {
    for (const Shape& sh : shapes) {
      SLUICE_ASSIGN_OR_RETURN(auto x,
                              RandomDevice(static_cast<size_t>(m * sh.k), rng, -1.0f, 1.0f));
      SLUICE_ASSIGN_OR_RETURN(auto w,
                              RandomDevice(static_cast<size_t>(sh.n * sh.k), rng, -1.0f, 1.0f));
      SLUICE_ASSIGN_OR_RETURN(auto y, DeviceBuffer<bf16>::Create(static_cast<size_t>(m * sh.n)));
      auto gemm = [&] {
        return LinearCuda(*lt, x.data(), w.data(), nullptr, y.data(), m, sh.n, sh.k, stream);
      };
      for (int i = 0; i < 3; ++i) {
        if (absl::Status st = gemm(); !st.ok()) return st;
      }
      constexpr int kReps = 12;
      std::vector<double> total(conditions.size(), 0.0);
      for (int rep = 0; rep < kReps; ++rep) {
        for (size_t c = 0; c < conditions.size(); ++c) {
          SLUICE_CUDA_RETURN_IF_ERROR(conditions[c].second(), "GEMM context: memcpy");
          SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream), "cudaEventRecord");
          if (absl::Status st = gemm(); !st.ok()) return st;
          SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream), "cudaEventRecord");
          SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop), "cudaEventSynchronize");
          float ms = 0;
          SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop),
                                      "cudaEventElapsedTime");
          total[c] += ms;
        }
      }
      nlohmann::json row = {{"shape", sh.name}, {"m", m}, {"n", sh.n}, {"k", sh.k}};
      for (size_t c = 0; c < conditions.size(); ++c) {
        const double us = total[c] / kReps * 1e3;
        row[conditions[c].first + "_us"] = us;
        row[conditions[c].first + "_tflops"] = 2.0 * m * sh.n * sh.k / (us * 1e-6) / 1e12;
      }
      rows.push_back(row);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return rows;
}

absl::StatusOr<nlohmann::json> Run(bool attention_only, bool sampling_only) {
  nlohmann::json out;
  SLUICE_ASSIGN_OR_RETURN(auto name, CudaDeviceName());
  int device = 0, sms = 0, driver = 0, runtime = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  out["gpu"] = name;
  out["multiprocessors"] = sms;
  out["cuda_driver_version"] = driver;
  out["cuda_runtime_version"] = runtime;
  SLUICE_ASSIGN_OR_RETURN(auto stream_holder, CudaStream::Create());
  cudaStream_t stream = stream_holder.get();
  std::mt19937 rng(1234);

  // Copy bandwidth: 2 GiB buffers, bytes read + written.
  const size_t copy_bytes = size_t{2} << 30;
  SLUICE_ASSIGN_OR_RETURN(auto src, DeviceBuffer<uint8_t>::Create(copy_bytes));
  SLUICE_ASSIGN_OR_RETURN(auto dst, DeviceBuffer<uint8_t>::Create(copy_bytes));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(src.data(), 1, copy_bytes), "cudaMemset");
  SLUICE_ASSIGN_OR_RETURN(auto copy_ms,
                          TimeMs(
                              [&]() -> absl::Status {
                                SLUICE_CUDA_RETURN_IF_ERROR(
                                    cudaMemcpyAsync(dst.data(), src.data(), copy_bytes,
                                                    cudaMemcpyDeviceToDevice, stream),
                                    "cudaMemcpyAsync");
                                return absl::OkStatus();
                              },
                              3, 20, stream));
  const double copy_gbps = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  out["copy"] = {{"bytes_per_copy", copy_bytes},
                 {"ms", copy_ms},
                 {"bandwidth_gbps_read_plus_write", copy_gbps}};
  src = DeviceBuffer<uint8_t>();
  dst = DeviceBuffer<uint8_t>();
  if (sampling_only) {
    SLUICE_ASSIGN_OR_RETURN(auto sampling, BenchSampling(rng, stream));
    out["sampling_qwen_vocab"] = sampling;
    return out;
  }
  if (attention_only) {
    SLUICE_ASSIGN_OR_RETURN(auto attention, BenchAttention(copy_gbps, rng, stream));
    out["paged_attention_llama3_8b"] = attention;
    return out;
  }

  // bf16 GEMM through cuBLASLt (y = x·Wᵀ, fp32 accumulation), random data.
  SLUICE_ASSIGN_OR_RETURN(auto lt, CublasLt::Create());
  nlohmann::json gemms = nlohmann::json::array();
  for (int64_t size : {4096, 8192}) {
    const int64_t m = size, n = size, k = size;
    SLUICE_ASSIGN_OR_RETURN(auto x, RandomDevice(static_cast<size_t>(m * k), rng, -1.0f, 1.0f));
    SLUICE_ASSIGN_OR_RETURN(auto w, RandomDevice(static_cast<size_t>(n * k), rng, -1.0f, 1.0f));
    SLUICE_ASSIGN_OR_RETURN(auto y, DeviceBuffer<bf16>::Create(static_cast<size_t>(m * n)));
    SLUICE_ASSIGN_OR_RETURN(auto ms, TimeMs(
                                         [&]() {
                                           return LinearCuda(*lt, x.data(), w.data(), nullptr,
                                                             y.data(), m, n, k, stream);
                                         },
                                         5, size == 4096 ? 100 : 30, stream));
    const double tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
    gemms.push_back({{"m", m}, {"n", n}, {"k", k}, {"ms", ms}, {"tflops", tflops}});
  }
  out["gemm_bf16_cublaslt"] = gemms;

  // Memory-bound kernels on a 32768 × 8192 bf16 tensor (512 MiB).
  const int64_t rows = 32768, dim = 8192;
  const size_t n = static_cast<size_t>(rows * dim);
  SLUICE_ASSIGN_OR_RETURN(auto a, RandomDevice(n, rng, -2.0f, 2.0f));
  SLUICE_ASSIGN_OR_RETURN(auto b, RandomDevice(n, rng, -2.0f, 2.0f));
  SLUICE_ASSIGN_OR_RETURN(auto o, DeviceBuffer<bf16>::Create(n));
  SLUICE_ASSIGN_OR_RETURN(auto weight, RandomDevice(static_cast<size_t>(dim), rng, 0.5f, 1.5f));
  nlohmann::json mem = nlohmann::json::array();
  auto record = [&](const std::string& op, int64_t op_rows, int64_t op_dim, double bytes,
                    double ms) {
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    mem.push_back({{"op", op},
                   {"rows", op_rows},
                   {"dim", op_dim},
                   {"bytes_moved", bytes},
                   {"ms", ms},
                   {"bandwidth_gbps", gbps},
                   {"fraction_of_copy", gbps / copy_gbps}});
  };
  const double tensor_bytes = 2.0 * n;
  // vecs_per_thread 0 is the launcher's default; 1, 2 and 4 are the variants it chooses from.
  for (const int vpt : {0, 1, 2, 4}) {
    const std::string suffix = vpt == 0 ? " (default)" : absl::StrCat(" vecs_per_thread=", vpt);
    auto rms = [&]() {
      return RmsNormCudaTuned(a.data(), dim, nullptr, weight.data(), o.data(), dim, rows, dim,
                              1e-6f, vpt, stream);
    };
    SLUICE_ASSIGN_OR_RETURN(auto rms_ms, TimeMs(rms, 3, 20, stream));
    record("rms_norm" + suffix, rows, dim, 2 * tensor_bytes + 2.0 * dim, rms_ms);
    auto add = [&]() {
      return RmsNormCudaTuned(a.data(), dim, b.data(), weight.data(), o.data(), dim, rows, dim,
                              1e-6f, vpt, stream);
    };
    SLUICE_ASSIGN_OR_RETURN(auto add_ms, TimeMs(add, 3, 20, stream));
    record("add_rms_norm" + suffix, rows, dim, 4 * tensor_bytes + 2.0 * dim, add_ms);
  }
  SLUICE_ASSIGN_OR_RETURN(
      auto silu_ms, TimeMs([&]() { return SiluMulCuda(a.data(), o.data(), rows / 2, dim, stream); },
                           3, 20, stream));
  record("silu_mul (input [rows, 2 dim])", rows / 2, dim, 1.5 * tensor_bytes, silu_ms);
  out["memory_bound_kernels"] = mem;
  a = DeviceBuffer<bf16>();
  b = DeviceBuffer<bf16>();
  o = DeviceBuffer<bf16>();
  SLUICE_ASSIGN_OR_RETURN(auto attention, BenchAttention(copy_gbps, rng, stream));
  out["paged_attention_llama3_8b"] = attention;
  SLUICE_ASSIGN_OR_RETURN(auto moe, BenchMoe(copy_gbps, rng, stream));
  out["moe_deepseek_v2_lite"] = moe;
  SLUICE_ASSIGN_OR_RETURN(auto sampling, BenchSampling(rng, stream));
  out["sampling_qwen_vocab"] = sampling;
  return out;
}

}  // namespace
}  // namespace sluice::kernels

int main(int argc, char** argv) {
  if (!sluice::kernels::CudaAvailable()) {
    std::fprintf(stderr, "cuda_kernel_bench: no CUDA device\n");
    return 1;
  }
  const char* out_path = nullptr;
  bool attention_only = false, sampling_only = false, gemm_context_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--attention-only") {
      attention_only = true;
    } else if (std::string(argv[i]) == "--sampling-only") {
      sampling_only = true;
    } else if (std::string(argv[i]) == "--gemm-context-only") {
      gemm_context_only = true;
    } else {
      out_path = argv[i];
    }
  }
  absl::StatusOr<nlohmann::json> result;
  if (gemm_context_only) {
    std::mt19937 rng(1234);
    cudaStream_t stream = nullptr;
    result = sluice::kernels::BenchGemmContext(rng, stream);
  } else {
    result = sluice::kernels::Run(attention_only, sampling_only);
  }
  if (!result.ok()) {
    std::fprintf(stderr, "cuda_kernel_bench: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const std::string text = result->dump(2);
  std::printf("%s\n", text.c_str());
  if (out_path != nullptr) {
    std::ofstream f(out_path);
    f << text << "\n";
    if (!f) {
      std::fprintf(stderr, "cuda_kernel_bench: cannot write %s\n", out_path);
      return 1;
    }
  }
  return 0;
}
