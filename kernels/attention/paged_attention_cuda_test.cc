// PagedAttentionCuda / WriteKvCacheCuda against the float32 CPU reference (paged_attention.h)
// on fresh random bf16 inputs: decode (split-KV and not), prefill chunks over cached prefixes,
// mixed batches, sliding windows, GQA group sizes, the head dims of the supported models and
// fixtures, scattered block tables, graph-style loose bounds, and bad arguments. Cache slots
// no sequence owns hold NaN, so a read of the wrong block shows up as a NaN output. Needs a
// GPU: part of kernels_cuda_test, skipped without a device.
#include "kernels/attention/paged_attention_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/attention/paged_prefill_wgmma.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/rope/rope.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

// Probabilities are rounded to bf16 before P·V (as in FlashAttention-2) and the output is
// bf16: a few bf16 roundings per element. atol is relative to max|out|; outputs are weighted
// means of V, so near-zero outputs come from cancellation and need the absolute slack.
constexpr double kRtol = 1.0 / 64;
constexpr double kAtol = 1.0 / 128;

struct SeqSpec {
  int32_t context;  // cached tokens before this step
  int32_t query;    // new tokens this step
};

struct Case {
  std::string name;
  PagedAttentionParams params;
  std::vector<SeqSpec> seqs;
  int64_t q_stride_pad = 0;     // extra elements per q row (fused-QKV style stride)
  int64_t extra_query_len = 0;  // loosen max_query_len beyond the batch's (graph bounds)
  int64_t extra_seq_len = 0;    // loosen max_seq_len likewise
  bool zero_q = false;  // all-zero q: uniform softmax over the visible keys (out = mean of V)
  bool error_map = false;  // on a mismatch, print which (token, head, 8-column chunk) are off
  // More launches of the same step, each into a NaN-filled output and checked in full and
  // bitwise against the first (state a launch leaves behind, or an order of work that depends
  // on timing, shows up from the second launch on): `launches` eager ones in a row, then one
  // captured in a CUDA graph on a stream and replayed `graph_replays` times.
  int launches = 1;
  int graph_replays = 0;
  PagedAttentionOptions options;  // the kernel choices every launch of the case plans with
};

PagedAttentionParams Params(int64_t heads, int64_t kv_heads, int64_t d, int64_t dv, int64_t block,
                            int64_t window = 0) {
  PagedAttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = d;
  p.v_head_dim = dv;
  p.block_size = block;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.sliding_window = window;
  return p;
}

// Step metadata on the device, and the batch view of it.
struct DeviceStep {
  DeviceBuffer<int32_t> query_start, context_lens, tables;
  PagedAttentionCudaBatch batch;
  DeviceStep(const std::vector<int32_t>& start, const std::vector<int32_t>& contexts,
             const std::vector<int32_t>& block_tables, int64_t max_blocks, int64_t num_tokens,
             int64_t max_query_len, int64_t max_seq_len)
      : query_start(Upload(start)), context_lens(Upload(contexts)), tables(Upload(block_tables)) {
    batch.query_start_loc = query_start.data();
    batch.context_lens = context_lens.data();
    batch.block_tables = tables.data();
    batch.max_blocks_per_seq = max_blocks;
    batch.num_sequences = static_cast<int64_t>(contexts.size());
    batch.num_tokens = num_tokens;
    batch.max_query_len = max_query_len;
    batch.max_seq_len = max_seq_len;
  }
};

// Runs one case on the device and against PagedAttentionCpu.
void RunCase(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(c.name);
  const PagedAttentionParams& p = c.params;
  const int64_t num_seqs = static_cast<int64_t>(c.seqs.size());
  int64_t num_tokens = 0, max_query = 0, max_seq = 0, max_blocks = 1;
  for (const SeqSpec& s : c.seqs) {
    num_tokens += s.query;
    max_query = std::max<int64_t>(max_query, s.query);
    max_seq = std::max<int64_t>(max_seq, s.context + s.query);
    max_blocks =
        std::max<int64_t>(max_blocks, (s.context + s.query + p.block_size - 1) / p.block_size);
  }
  max_blocks += 1;  // a spare column: entries past the last block must be ignored
  int64_t total_blocks = 0;
  for (const SeqSpec& s : c.seqs) {
    total_blocks += (s.context + s.query + p.block_size - 1) / p.block_size;
  }
  total_blocks = total_blocks * 2 + 3;  // unowned blocks in between

  // Scattered block tables: a random permutation of physical blocks; unused entries are -1
  // (must never be read) except the spare column, which points at a NaN block.
  std::vector<int32_t> physical(static_cast<size_t>(total_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs * max_blocks), -1);
  const int64_t k_per_token = p.num_kv_heads * p.head_dim;
  const int64_t v_per_token = p.num_kv_heads * p.v_head_dim;
  const int64_t slots = total_blocks * p.block_size;
  std::vector<bf16> k_cache(static_cast<size_t>(slots * k_per_token),
                            FloatToBf16(std::numeric_limits<float>::quiet_NaN()));
  std::vector<bf16> v_cache(static_cast<size_t>(slots * v_per_token), k_cache[0]);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  size_t next = 0;
  std::vector<int32_t> query_start(c.seqs.size() + 1, 0);
  std::vector<int32_t> context_lens(c.seqs.size());
  for (int64_t s = 0; s < num_seqs; ++s) {
    const SeqSpec& spec = c.seqs[static_cast<size_t>(s)];
    query_start[s + 1] = query_start[s] + spec.query;
    context_lens[s] = spec.context;
    const int64_t len = spec.context + spec.query;
    const int64_t nb = (len + p.block_size - 1) / p.block_size;
    for (int64_t b = 0; b < nb; ++b) tables[s * max_blocks + b] = physical[next++];
    if (nb < max_blocks) tables[s * max_blocks + nb] = physical[physical.size() - 1];
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t slot =
          static_cast<int64_t>(tables[s * max_blocks + pos / p.block_size]) * p.block_size +
          pos % p.block_size;
      for (int64_t i = 0; i < k_per_token; ++i) {
        k_cache[slot * k_per_token + i] = FloatToBf16(dist(rng));
      }
      for (int64_t i = 0; i < v_per_token; ++i) {
        v_cache[slot * v_per_token + i] = FloatToBf16(dist(rng));
      }
    }
  }
  const int64_t q_stride = p.num_heads * p.head_dim + c.q_stride_pad;
  // Scores up to ~±4·sqrt(d)·scale keep the softmax neither flat nor one-hot.
  auto q = RandomBf16(static_cast<size_t>(num_tokens * q_stride), rng, -2.0f, 2.0f);
  if (c.zero_q) std::fill(q.begin(), q.end(), FloatToBf16(0.0f));

  std::vector<int32_t> cpu_tables = tables;
  for (auto& e : cpu_tables) e = std::max(e, 0);
  std::vector<PagedSequence> sequences(c.seqs.size());
  for (int64_t s = 0; s < num_seqs; ++s) {
    sequences[s].query_start = query_start[s];
    sequences[s].num_query_tokens = c.seqs[s].query;
    sequences[s].num_context_tokens = c.seqs[s].context;
    sequences[s].block_table = cpu_tables.data() + s * max_blocks;
  }
  const auto qf = ToFloat(q);
  const auto kf = ToFloat(k_cache);
  const auto vf = ToFloat(v_cache);
  std::vector<float> want(static_cast<size_t>(num_tokens * p.num_heads * p.v_head_dim));
  PagedAttentionCpu(qf.data(), q_stride, kf.data(), vf.data(), sequences.data(), num_seqs, p,
                    want.data());

  auto d_q = Upload(q);
  auto d_k = Upload(k_cache);
  auto d_v = Upload(v_cache);
  auto d_out = NanBuffer(want.size());
  const DeviceStep step(query_start, context_lens, tables, max_blocks, num_tokens,
                        max_query + c.extra_query_len, max_seq + c.extra_seq_len);
  const PagedAttentionCudaBatch& batch = step.batch;
  const size_t ws_bytes = PagedAttentionCudaWorkspaceBytes(batch, p, c.options);
  auto ws = DeviceBuffer<uint8_t>::Create(ws_bytes);
  ASSERT_TRUE(ws.ok()) << ws.status();
  if (ws_bytes > 0) {
    ASSERT_EQ(cudaMemset(ws->data(), 0xFF, ws_bytes), cudaSuccess);
  }
  const absl::Status st = PagedAttentionCuda(d_q.data(), q_stride, d_k.data(), d_v.data(), batch, p,
                                             ws->data(), d_out.data(), nullptr, c.options);
  ASSERT_TRUE(st.ok()) << st;
  const std::vector<float> got = Download(d_out);
  ExpectClose(absl::StrCat(c.name, " (workspace ", ws_bytes, " B)"), got, want, kRtol, kAtol);
  const size_t out_bytes = want.size() * sizeof(bf16);
  auto check_again = [&](const std::string& what) {
    const std::vector<float> again = Download(d_out);
    ExpectClose(absl::StrCat(c.name, " ", what), again, want, kRtol, kAtol);
    EXPECT_TRUE(again == got) << c.name << " " << what << ": not bitwise the first launch's";
  };
  for (int i = 1; i < c.launches; ++i) {
    ASSERT_EQ(cudaMemset(d_out.data(), 0xFF, out_bytes), cudaSuccess);
    ASSERT_TRUE(PagedAttentionCuda(d_q.data(), q_stride, d_k.data(), d_v.data(), batch, p,
                                   ws->data(), d_out.data(), nullptr, c.options)
                    .ok());
    check_again(absl::StrCat("eager launch ", i + 1));
  }
  if (c.graph_replays > 0) {
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status cap = PagedAttentionCuda(d_q.data(), q_stride, d_k.data(), d_v.data(),
                                                batch, p, ws->data(), d_out.data(), stream,
                                                c.options);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(cap.ok()) << cap;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int i = 0; i < c.graph_replays; ++i) {
      ASSERT_EQ(cudaMemsetAsync(d_out.data(), 0xFF, out_bytes, stream), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      check_again(absl::StrCat("graph replay ", i + 1));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  if (c.error_map) {
    // One line per token (≤ 80): per head (≤ 4), one mark per 8 output columns, 'x' where an
    // element is out of tolerance (the same test as Compare: |got − want| > atol·max|want| +
    // rtol·|want|) or not finite. Shows layout mistakes (rows, columns, keys) at a glance.
    double max_ref = 0.0;
    for (float w : want) max_ref = std::max(max_ref, std::abs(static_cast<double>(w)));
    int64_t bad = 0;
    std::string map;
    for (int64_t tok = 0; tok < std::min<int64_t>(num_tokens, 80); ++tok) {
      std::string line;
      for (int64_t h = 0; h < std::min<int64_t>(p.num_heads, 4); ++h) {
        for (int64_t c8 = 0; c8 < p.v_head_dim; c8 += 8) {
          bool off = false;
          for (int64_t i = c8; i < std::min<int64_t>(c8 + 8, p.v_head_dim); ++i) {
            const size_t at = static_cast<size_t>((tok * p.num_heads + h) * p.v_head_dim + i);
            const double d = std::abs(static_cast<double>(got[at]) - want[at]);
            off |= !std::isfinite(got[at]) || d > kAtol * max_ref + kRtol * std::abs(want[at]);
          }
          line += off ? 'x' : '.';
          bad += off;
        }
        line += ' ';
      }
      map += line + "\n";
    }
    if (bad > 0) {
      std::printf("[error-map] %s (token rows, per head 8-column chunks):\n%s", c.name.c_str(),
                  map.c_str());
      for (int64_t i = 0; i < std::min<int64_t>(16, p.v_head_dim); ++i) {
        std::printf("[error-map] token 0 head 0 col %lld: got %g want %g\n",
                    static_cast<long long>(i), got[static_cast<size_t>(i)],
                    want[static_cast<size_t>(i)]);
      }
    }
  }
}

std::vector<SeqSpec> Decode(const std::vector<int32_t>& contexts) {
  std::vector<SeqSpec> out;
  for (int32_t c : contexts) out.push_back({c, 1});
  return out;
}
std::vector<SeqSpec> Decode(std::initializer_list<int32_t> contexts) {
  return Decode(std::vector<int32_t>(contexts));
}

// n decode contexts: `first`, then (i · 53) mod `mod` for the rest (a spread of lengths).
std::vector<int32_t> SpreadContexts(int n, std::initializer_list<int32_t> first, int32_t mod) {
  std::vector<int32_t> out(first);
  for (int i = static_cast<int>(out.size()); i < n; ++i) out.push_back((i * 53) % mod);
  return out;
}

TEST(PagedAttentionCudaTest, DecodeLlama3Shapes) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  // Batch 1 at 3000 tokens splits the keys across CTAs; batch 8 with short contexts does not.
  RunCase({"decode b1 ctx3000", Params(32, 8, 128, 128, 16), Decode({3000})}, rng);
  RunCase({"decode b8 mixed ctx", Params(32, 8, 128, 128, 16),
           Decode({0, 1, 15, 16, 17, 100, 513, 1200})},
          rng);
}

// With PagedAttentionOptions::pdl, the decode attention kernel and its split-KV combine are
// programmatic dependents; the results still match the CPU reference.
TEST(PagedAttentionCudaTest, DecodeUnderPdl) {
  SLUICE_SKIP_WITHOUT_CUDA();
  if (!PdlSupported()) GTEST_SKIP() << "programmatic dependent launch needs sm_90";
  auto rng = cuda_test::Rng();
  Case b1{"pdl decode b1 ctx1024", Params(32, 8, 128, 128, 16), Decode({1024})};
  b1.options.pdl = true;
  RunCase(b1, rng);
  Case b8{"pdl decode b8 mixed ctx", Params(32, 8, 128, 128, 16),
          Decode({0, 1, 15, 16, 17, 100, 513, 1200})};
  b8.options.pdl = true;
  RunCase(b8, rng);
}

// A case with its kernel choices.
Case With(Case c, const PagedAttentionOptions& options) {
  c.options = options;
  return c;
}
PagedAttentionOptions DecodeOptions(PagedDecodeKernel k) {
  PagedAttentionOptions o;
  o.decode_kernel = k;
  return o;
}
PagedAttentionOptions PrefillOptions(PagedPrefillKernel k) {
  PagedAttentionOptions o;
  o.prefill_kernel = k;
  return o;
}
const char* DecodeKernelTag(PagedDecodeKernel k) {
  return k == PagedDecodeKernel::kAuto        ? "auto "
         : k == PagedDecodeKernel::kWarpRings ? "rings "
                                              : "persistent ";
}

// The plan of a launch of these bounds (device metadata is not read: the plan depends on the
// host-side bounds only).
PagedAttentionPlanInfo PlanOf(const PagedAttentionParams& p, int64_t num_sequences,
                              int64_t max_query_len, int64_t max_seq_len,
                              const PagedAttentionOptions& options = {}) {
  static const int32_t kDummy = 0;
  PagedAttentionCudaBatch b;
  b.query_start_loc = b.context_lens = b.block_tables = &kDummy;
  b.max_blocks_per_seq = (max_seq_len + p.block_size - 1) / p.block_size;
  b.num_sequences = num_sequences;
  b.num_tokens = num_sequences * max_query_len;
  b.max_query_len = max_query_len;
  b.max_seq_len = max_seq_len;
  auto plan = DescribePagedAttentionPlan(b, p, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : PagedAttentionPlanInfo{};
}

// The plan's shape rules at the served shapes: Llama-3-8B decode takes the warp rings with
// split keys at batch 1 and the persistent decode warps with the swapped math once the units
// fill the GPU (batch 2048: 16384 units, more than any GPU's resident warps); prefill takes
// wgmma at head dim 128 on a compute 9.0 device (FA2 elsewhere and with a window), FA2 at 64,
// the MMA tiles at 16 and 32, the CTA tiles at 192/128 and 256; forced kernels fall back along
// the chain where they do not serve.
TEST(PagedAttentionCudaTest, PlanShapeRules) {
  SLUICE_SKIP_WITHOUT_CUDA();
  const PagedAttentionParams llama = Params(32, 8, 128, 128, 16);
  const PagedAttentionPlanInfo b1 = PlanOf(llama, 1, 1, 1025);
  EXPECT_EQ(b1.kernel, PagedAttentionKernel::kWarpRings);
  EXPECT_GT(b1.num_splits, 1);
  const PagedAttentionPlanInfo big = PlanOf(llama, 2048, 1, 1025);
  EXPECT_EQ(big.kernel, PagedAttentionKernel::kPersistentWarps);
  EXPECT_TRUE(big.swapped);
  EXPECT_EQ(big.num_splits, 1);
  // 4-token chunks at group 4 (16 rows a unit): the persistent warps' m16-row math.
  const PagedAttentionPlanInfo chunks = PlanOf(llama, 2048, 4, 1025);
  EXPECT_EQ(chunks.kernel, PagedAttentionKernel::kPersistentWarps);
  EXPECT_FALSE(chunks.swapped);
  // Head dim 64: the 4-warp persistent shape, never swapped.
  EXPECT_FALSE(PlanOf(Params(32, 8, 64, 64, 16), 2048, 1, 1025).swapped);
  EXPECT_EQ(PlanOf(llama, 1, 1, 1025, DecodeOptions(PagedDecodeKernel::kPersistentWarps)).kernel,
            PagedAttentionKernel::kPersistentWarps);
  EXPECT_EQ(PlanOf(llama, 2048, 1, 1025, DecodeOptions(PagedDecodeKernel::kWarpRings)).kernel,
            PagedAttentionKernel::kWarpRings);

  int device = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), cudaSuccess);
  const bool hopper = major == 9 && minor == 0;
  EXPECT_EQ(PlanOf(llama, 1, 4096, 4096).kernel,
            hopper ? PagedAttentionKernel::kWgmma : PagedAttentionKernel::kFa2);
  EXPECT_EQ(PlanOf(Params(32, 8, 128, 128, 16, 100), 1, 4096, 4096).kernel,
            PagedAttentionKernel::kFa2);
  EXPECT_EQ(PlanOf(Params(16, 4, 64, 64, 16), 1, 300, 300).kernel, PagedAttentionKernel::kFa2);
  EXPECT_EQ(PlanOf(Params(4, 2, 16, 16, 16), 1, 300, 300).kernel,
            PagedAttentionKernel::kMmaTiles);
  EXPECT_EQ(PlanOf(Params(4, 4, 24, 16, 16), 1, 300, 300).kernel,
            PagedAttentionKernel::kMmaTiles);
  EXPECT_EQ(PlanOf(Params(16, 16, 192, 128, 64), 1, 300, 300).kernel,
            PagedAttentionKernel::kCtaTiles);
  EXPECT_EQ(PlanOf(Params(8, 4, 256, 256, 16), 1, 300, 300).kernel,
            PagedAttentionKernel::kCtaTiles);
  EXPECT_EQ(PlanOf(llama, 1, 300, 300, PrefillOptions(PagedPrefillKernel::kCtaTiles)).kernel,
            PagedAttentionKernel::kCtaTiles);
  EXPECT_EQ(PlanOf(llama, 1, 300, 300, PrefillOptions(PagedPrefillKernel::kMmaTiles)).kernel,
            PagedAttentionKernel::kMmaTiles);
  EXPECT_EQ(PlanOf(Params(8, 2, 32, 32, 16), 1, 300, 300, PrefillOptions(PagedPrefillKernel::kFa2))
                .kernel,
            PagedAttentionKernel::kMmaTiles);
  // A non-positive scale keeps the CTA tiles (the others fold the scale into the exponent).
  PagedAttentionParams zero_scale = llama;
  zero_scale.scale = 0.0f;
  EXPECT_EQ(PlanOf(zero_scale, 1, 300, 300).kernel, PagedAttentionKernel::kCtaTiles);
}

// Every decode kernel (PagedAttentionOptions::decode_kernel: the served choice, the warp rings
// and the persistent decode warps forced at every batch) over the split plans and masks
// decode meets: one tile per partition at batch 1, loose graph bounds, a batch of 64 (whole
// waves of 2-warp rings), a window, empty and partial slices (contexts 0, 1, 15, 17), odd
// block sizes, GQA groups 1/4/7/16 and every padded head-dim variant (the rings of the wide
// ones shrink; the persistent warps take their 4-warp shape off head dim 128).
TEST(PagedAttentionCudaTest, DecodeKernels) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  std::vector<SeqSpec> b64;
  for (int i = 0; i < 64; ++i) b64.push_back({static_cast<int32_t>((i * 53) % 1300), 1});
  // 300 sequences (2400 units at 8 KV heads), mostly short to keep the caches small; one of
  // 1100 keys makes the persistent warps split (partitions past the short ones' ends are
  // empty units).
  std::vector<SeqSpec> b300 = Decode({0, 1, 15, 16, 17, 1100});
  for (int i = 6; i < 300; ++i) b300.push_back({static_cast<int32_t>((i * 53) % 200), 1});
  for (const PagedDecodeKernel kernel : {PagedDecodeKernel::kWarpRings,
                                         PagedDecodeKernel::kPersistentWarps,
                                         PagedDecodeKernel::kAuto}) {
    const PagedAttentionOptions o = DecodeOptions(kernel);
    const std::string tag = DecodeKernelTag(kernel);
    Case loose{tag + "b1 ctx1023 bound 1104", Params(32, 8, 128, 128, 16), Decode({1023})};
    loose.extra_seq_len = 1104 - 1024;
    RunCase(With(loose, o), rng);
    RunCase(With({tag + "b1 ctx 64", Params(32, 8, 128, 128, 16), Decode({64})}, o), rng);
    RunCase(With({tag + "b64", Params(32, 8, 128, 128, 16), b64}, o), rng);
    RunCase(With({tag + "short contexts", Params(32, 8, 128, 128, 16), Decode({0, 1, 15, 17, 64})},
                 o),
            rng);
    RunCase(With({tag + "window 200", Params(32, 8, 128, 128, 16, 200), Decode({900, 3, 250})}, o),
            rng);
    RunCase(With({tag + "block 7 g7", Params(28, 4, 128, 128, 7), Decode({130, 7, 600})}, o), rng);
    RunCase(With({tag + "d64 g1", Params(8, 8, 64, 64, 16), Decode({130, 7, 600})}, o), rng);
    RunCase(With({tag + "d16 g2 window", Params(4, 2, 16, 16, 4, 16), Decode({40, 3, 17})}, o),
            rng);
    RunCase(With({tag + "d192 dv128", Params(16, 16, 192, 128, 64), Decode({200, 1500})}, o), rng);
    RunCase(With({tag + "d256 g2", Params(8, 4, 256, 256, 16), Decode({200, 1500})}, o), rng);
    RunCase(With({tag + "mqa 16", Params(16, 1, 128, 128, 32), Decode({10, 4000})}, o), rng);
    RunCase(With({tag + "16 kv heads g2", Params(32, 16, 128, 128, 16), Decode({130, 7, 600, 0})},
                 o),
            rng);
    // Decode-shaped launches with several query tokens per sequence (4 × group 4 ≤ 16 rows).
    RunCase(With({tag + "4-token chunks", Params(32, 8, 128, 128, 16), {{300, 4}, {0, 3}, {77, 2}}},
                 o),
            rng);
    // More (sequence, KV head) units than resident warps (2400 vs ~1056 on an H200): the
    // served choice takes the persistent warps, each streaming several units back to back,
    // with empty and one-slice units (contexts 0, 1, 15, 16) and split-KV units past a
    // sequence's end; forced rings run 2400 CTAs. Repeated launches and graph replays are
    // bitwise equal (every unit has one owner and a fixed key order).
    Case several{tag + "b300 several units a warp", Params(32, 8, 128, 128, 16), b300};
    several.launches = 2;
    several.graph_replays = 2;
    RunCase(With(several, o), rng);
    RunCase(With({tag + "b300 d64 window", Params(16, 8, 64, 64, 16, 100), b300}, o), rng);
    RunCase(With({tag + "b300 d192 dv128", Params(16, 8, 192, 128, 64), b300}, o), rng);
  }
}

// The swapped GQA decode math of the persistent decode warps (≤ 8 query rows a unit at head
// dims 65..128) against the CPU reference, on grids with more units than resident warps (the
// served choice takes the persistent warps there): groups 1, 2, 4 and 8, 2-token chunks (8 rows
// at group 4), contexts 0, 1 and across block and slice edges (contiguous slices of 16- and
// 32-key blocks), a sliding window, head dims 96 (zero-padded to 128) and 128, and split-KV
// partials at batch 3 (persistent warps forced); repeated launches and graph replays bitwise.
// 16 rows a unit (4-token chunks at group 4) take the m16-row math.
TEST(PagedAttentionCudaTest, DecodeSwappedMatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const std::vector<SeqSpec> b300 = Decode(SpreadContexts(300, {0, 1, 15, 16, 17, 1100}, 200));
  std::vector<SeqSpec> chunks2, chunks4;
  for (int i = 0; i < 300; ++i) {
    chunks2.push_back({static_cast<int32_t>((i * 37) % 300), 2});
    chunks4.push_back({static_cast<int32_t>((i * 37) % 300), 4});
  }
  std::vector<Case> cases = {
      {"swapped b300 g4", Params(32, 8, 128, 128, 16), b300},
      {"swapped b300 g8", Params(64, 8, 128, 128, 16), b300},
      {"swapped b300 g2 window 100", Params(16, 8, 128, 128, 16, 100), b300},
      {"swapped b300 g1 d96", Params(8, 8, 96, 96, 16), b300},
      {"swapped b300 2-token chunks g4", Params(32, 8, 128, 128, 16), chunks2},
      {"swapped b300 g4 block 32", Params(32, 8, 128, 128, 32), b300}};
  for (Case& c : cases) {
    c.launches = 2;
    c.graph_replays = 2;
    int32_t max_seq = 0;
    for (const SeqSpec& q : c.seqs) max_seq = std::max(max_seq, q.context + q.query);
    const PagedAttentionPlanInfo plan = PlanOf(c.params, 300, c.seqs[0].query, max_seq);
    EXPECT_EQ(plan.kernel, PagedAttentionKernel::kPersistentWarps) << c.name;
    EXPECT_TRUE(plan.swapped) << c.name;
    RunCase(c, rng);
  }
  const PagedAttentionOptions persistent = DecodeOptions(PagedDecodeKernel::kPersistentWarps);
  const PagedAttentionPlanInfo split = PlanOf(Params(32, 8, 128, 128, 16), 3, 1, 1501, persistent);
  EXPECT_TRUE(split.swapped);
  EXPECT_GT(split.num_splits, 1);
  RunCase(With({"swapped persistent split", Params(32, 8, 128, 128, 16), Decode({1500, 7, 900})},
               persistent),
          rng);
  EXPECT_FALSE(PlanOf(Params(32, 8, 128, 128, 16), 300, 4, 305).swapped);
  RunCase({"m16 rows 4-token chunks g4", Params(32, 8, 128, 128, 16), chunks4}, rng);
}

TEST(PagedAttentionCudaTest, PrefillChunksOverCachedPrefix) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  RunCase({"prefill 300 fresh", Params(32, 8, 128, 128, 16), {{0, 300}}}, rng);
  RunCase({"prefill chunk 77 over 1000", Params(32, 8, 128, 128, 16), {{1000, 77}}}, rng);
  RunCase({"prefill chunks x3", Params(16, 4, 64, 64, 16), {{0, 65}, {128, 64}, {33, 1}}}, rng);
}

// The MMA-tile and CTA-tile prefill kernels (PagedAttentionOptions::prefill_kernel; served
// at head dims ≤ 32 and above 128) forced at every shape, against the CPU reference over the
// shapes prefill meets: a fresh prompt with a partial last tile and one spanning many key
// tiles, chunks over a cached prefix (few CTAs: the split-KV plan), sliding windows, GQA groups
// 1/4/8 and 7, head dims 16/24/64/128 (and 192/256, which keep the CTA tiles), odd block sizes,
// q rows with a stride that rules out 16-byte copies, and decode rows in the same launch.
TEST(PagedAttentionCudaTest, PrefillKernels) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const PagedPrefillKernel kernel :
       {PagedPrefillKernel::kMmaTiles, PagedPrefillKernel::kCtaTiles}) {
    const std::string tag =
        kernel == PagedPrefillKernel::kMmaTiles ? "prefill mma tiles " : "prefill cta tiles ";
    const PagedAttentionOptions o = PrefillOptions(kernel);
    // Every case below with these options.
    auto run = [&](Case c) { RunCase(With(std::move(c), o), rng); };
    run({tag + "fresh 300 g4", Params(32, 8, 128, 128, 16), {{0, 300}}});
    run({tag + "fresh 1030 g4", Params(8, 2, 128, 128, 16), {{0, 1030}}});
    run({tag + "chunk 77 over 1000", Params(32, 8, 128, 128, 16), {{1000, 77}}});
    run({tag + "chunk 200 over 3000 g8", Params(32, 4, 128, 128, 16), {{3000, 200}}});
    run({tag + "chunks d64 g4", Params(16, 4, 64, 64, 16), {{0, 65}, {128, 64}, {33, 1}}});
    run({tag + "mha d64 g1", Params(8, 8, 64, 64, 16), {{0, 129}, {500, 40}}});
    run({tag + "d128 g7 block 7", Params(28, 4, 128, 128, 7), {{90, 20}, {0, 333}}});
    run({tag + "window 100", Params(32, 8, 128, 128, 16, 100), {{300, 150}, {1, 1}}});
    run({tag + "window 37 fresh", Params(8, 2, 64, 64, 16, 37), {{0, 400}}});
    run({tag + "d16 g2 window 16", Params(4, 2, 16, 16, 4, 16), {{40, 1}, {17, 7}, {0, 50}}});
    run({tag + "d24 dv16 mha", Params(4, 4, 24, 16, 16), {{0, 33}, {90, 20}}});
    // The CUDA DeepSeek runner's MHA-form MLA prefill (group 1, v_head_dim < head_dim): fresh
    // prompts of 36-200 tokens over scattered blocks of 4 and 16 at the attention shapes of
    // deepseek-v3-tiny (24/16), sluice-mini-moe (64/32) and DeepSeek-V2/V3 (192/128).
    run({tag + "mla d24 dv16 block 4", Params(4, 4, 24, 16, 4), {{0, 36}, {0, 48}}});
    run({tag + "mla d64 dv32 block 16", Params(6, 6, 64, 32, 16), {{0, 150}, {0, 48}}});
    run({tag + "mla d192 dv128 block 4", Params(16, 16, 192, 128, 4), {{0, 48}, {0, 200}}});
    run({tag + "mla d192 dv128 block 16", Params(16, 16, 192, 128, 16), {{0, 200}, {30, 48}}});
    run({tag + "d192 dv128 (cta tiles)", Params(16, 16, 192, 128, 64), {{0, 70}}});
    run({tag + "d256 g2 (cta tiles)", Params(8, 4, 256, 256, 16), {{100, 40}}});
    run({tag + "mixed with decode rows",
         Params(32, 8, 128, 128, 16),
         {{700, 1}, {0, 40}, {2500, 1}, {64, 130}, {1100, 17}}});
    // q_token_stride 8·64 + 2: not a whole number of 16-byte chunks (32-bit Q loads).
    Case odd{tag + "q stride pad 2", Params(8, 2, 64, 64, 16), {{50, 30}, {0, 90}}};
    odd.q_stride_pad = 2;
    run(odd);
    Case loose{tag + "loose bounds", Params(32, 8, 128, 128, 16), {{0, 20}, {100, 1}}};
    loose.extra_query_len = 100;
    loose.extra_seq_len = 3000;
    run(loose);
  }
}

TEST(PagedAttentionCudaTest, MixedBatch) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  RunCase({"mixed decode+prefill",
           Params(32, 8, 128, 128, 16),
           {{700, 1}, {0, 40}, {2500, 1}, {64, 130}, {5, 1}, {0, 1}, {1100, 17}}},
          rng);
  // Odd block size and a padded q stride (q read from a fused QKV buffer).
  Case odd{"mixed block 7 q stride pad", Params(8, 2, 64, 64, 7), {{50, 3}, {0, 20}, {333, 1}}};
  odd.q_stride_pad = 2 * 2 * 64;
  RunCase(odd, rng);
}

TEST(PagedAttentionCudaTest, SlidingWindow) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  RunCase({"window 16 fixture dims", Params(4, 2, 16, 16, 16, 16), {{40, 1}, {0, 50}, {7, 9}}},
          rng);
  RunCase({"window 1000 decode b1 ctx 5000", Params(32, 8, 128, 128, 16, 1000), Decode({5000})},
          rng);
  RunCase({"window 100 prefill", Params(32, 8, 128, 128, 16, 100), {{300, 150}, {1, 1}}}, rng);
  // qwen3-hybrid-tiny's sliding layers as the CUDA runner runs them: block 4, q read from fused
  // QKV rows, loose bounds as in a captured graph (max_seq_len 512), decode tokens past the
  // window beside a prefill chunk that crosses it.
  Case qwen{"window 16 block 4 fused qkv graph bounds",
            Params(4, 2, 16, 16, 4, 16),
            {{40, 1}, {17, 7}, {3, 1}, {0, 20}}};
  qwen.q_stride_pad = 2 * 2 * 16;
  qwen.extra_seq_len = 512 - 41;
  RunCase(qwen, rng);
}

TEST(PagedAttentionCudaTest, HeadDimsAndGroups) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const std::vector<SeqSpec> seqs = {{200, 1}, {0, 33}, {1500, 1}, {90, 20}};
  // llama-tiny / qwen3-tiny fixtures (16), deepseek-v3-tiny unabsorbed (24/16), DeepSeek
  // V2/V3 unabsorbed (192/128), Gemma-style 256, MHA and group 7 (Qwen2-7B: 28/4), MQA 16.
  RunCase({"d16 g2", Params(4, 2, 16, 16, 16), seqs}, rng);
  RunCase({"d24 dv16 mha", Params(4, 4, 24, 16, 16), seqs}, rng);
  RunCase({"d64 g1", Params(8, 8, 64, 64, 16), seqs}, rng);
  RunCase({"d128 g7", Params(28, 4, 128, 128, 16), seqs}, rng);
  RunCase({"d192 dv128", Params(16, 16, 192, 128, 64), seqs}, rng);
  RunCase({"d256 g2", Params(8, 4, 256, 256, 16), seqs}, rng);
  RunCase({"d128 mqa 16", Params(16, 1, 128, 128, 32), seqs}, rng);
  RunCase({"d128 decode g16", Params(16, 1, 128, 128, 16), Decode({10, 4000})}, rng);
}

TEST(PagedAttentionCudaTest, LooseGraphBoundsGiveTheSameResult) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  // A captured decode graph sizes its grid for the bucket's bounds, not this step's batch.
  Case c{"decode loose bounds", Params(32, 8, 128, 128, 16), Decode({10, 900, 64})};
  c.extra_seq_len = 8192 - 901;
  RunCase(c, rng);
  Case pre{"prefill loose bounds", Params(32, 8, 128, 128, 16), {{0, 20}, {100, 1}}};
  pre.extra_query_len = 100;
  pre.extra_seq_len = 3000;
  RunCase(pre, rng);
}

TEST(PagedAttentionCudaTest, RejectsBadArguments) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto q = DeviceBuffer<bf16>::Create(4096);
  auto kv = DeviceBuffer<bf16>::Create(4096);
  auto meta = DeviceBuffer<int32_t>::Create(16);
  ASSERT_TRUE(q.ok() && kv.ok() && meta.ok());
  PagedAttentionCudaBatch b;
  b.query_start_loc = meta->data();
  b.context_lens = meta->data();
  b.block_tables = meta->data();
  b.max_blocks_per_seq = 1;
  b.num_sequences = 1;
  b.num_tokens = 1;
  b.max_query_len = 1;
  b.max_seq_len = 1;
  const PagedAttentionParams good = Params(4, 2, 16, 16, 16);
  auto call = [&](const PagedAttentionCudaBatch& batch, const PagedAttentionParams& p) {
    return PagedAttentionCuda(q->data(), 64, kv->data(), kv->data(), batch, p, nullptr, q->data(),
                              nullptr)
        .code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  auto p = good;
  p.num_kv_heads = 3;  // 4 heads not a multiple of 3
  EXPECT_EQ(call(b, p), kInvalid);
  p = good;
  p.head_dim = 12;  // not a multiple of 8
  EXPECT_EQ(call(b, p), kInvalid);
  p = good;
  p.v_head_dim = 512;  // too wide for the kernel
  EXPECT_EQ(call(b, p), kInvalid);
  p = good;
  p.block_size = 0;
  EXPECT_EQ(call(b, p), kInvalid);
  p = good;
  p.sliding_window = -1;
  EXPECT_EQ(call(b, p), kInvalid);
  auto bb = b;
  bb.num_sequences = 0;
  EXPECT_EQ(call(bb, good), kInvalid);
  bb = b;
  bb.max_query_len = 2;  // > max_seq_len
  EXPECT_EQ(call(bb, good), kInvalid);
  bb = b;
  bb.block_tables = nullptr;
  EXPECT_EQ(call(bb, good), kInvalid);
  EXPECT_EQ(PagedAttentionCuda(q->data(), 63, kv->data(), kv->data(), b, good, nullptr, q->data(),
                               nullptr)
                .code(),
            kInvalid);  // q stride below num_heads·head_dim
  EXPECT_EQ(PagedAttentionCuda(q->data(), 64, kv->data() + 1, kv->data(), b, good, nullptr,
                               q->data(), nullptr)
                .code(),
            kInvalid);  // misaligned cache
  // A split-KV launch without its workspace.
  bb = b;
  bb.max_seq_len = 32768;
  const PagedAttentionParams llama = Params(32, 8, 128, 128, 16);
  ASSERT_GT(PagedAttentionCudaWorkspaceBytes(bb, llama), 0u);
  EXPECT_EQ(PagedAttentionCuda(q->data(), 4096, kv->data(), kv->data(), bb, llama, nullptr,
                               q->data(), nullptr)
                .code(),
            kInvalid);
  EXPECT_EQ(PagedAttentionCudaWorkspaceBytes(b, p), 0u);  // invalid params: no workspace
  EXPECT_EQ(DescribePagedAttentionPlan(b, p).status().code(), kInvalid);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// PagedAttentionRopeDecodeCuda (decode fusion) on one decode step: qkv rows of unrotated q, k,
// v; every sequence's new key slot starts as NaN (a read before the fused write shows up), as
// does every slot no sequence owns. Reference: RopeCpu on q and k, rounded to bf16 (the
// rotation is rounded once on the GPU too), k and v written to the new slots, then
// PagedAttentionCpu. Checks every output element, the new K rows (within one rounding) and V
// rows (exact), and that no other cache element changed (bitwise).
void RunFusedDecodeCase(const std::string& name, const PagedAttentionParams& p,
                        const RopeParams& rope_params, const std::vector<int32_t>& contexts,
                        std::mt19937& rng, const PagedAttentionOptions& options = {},
                        int launches = 1) {
  SCOPED_TRACE(name);
  auto table = MakeRopeTable(rope_params);
  ASSERT_TRUE(table.ok()) << table.status();
  auto d_table = UploadRopeTable(*table);
  ASSERT_TRUE(d_table.ok()) << d_table.status();
  const int64_t T = static_cast<int64_t>(contexts.size());
  const int64_t kv = p.num_kv_heads * p.head_dim;
  const int64_t q_dim = p.num_heads * p.head_dim;
  const int64_t stride = q_dim + 2 * kv + 8;  // padded fused-QKV row
  int64_t max_blocks = 1, total_blocks = 3, max_seq = 1;
  for (const int32_t c : contexts) {
    max_blocks = std::max<int64_t>(max_blocks, c / p.block_size + 1);
    total_blocks += 2 * (c / p.block_size + 1);
    max_seq = std::max<int64_t>(max_seq, c + 1);
  }
  std::vector<int32_t> physical(static_cast<size_t>(total_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  const bf16 nan = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
  const int64_t num_slots = total_blocks * p.block_size;
  std::vector<bf16> k_cache(static_cast<size_t>(num_slots * kv), nan), v_cache = k_cache;
  std::vector<int32_t> tables(static_cast<size_t>(T * max_blocks), 0);
  std::vector<int32_t> query_start(static_cast<size_t>(T + 1));
  std::vector<int32_t> positions(contexts);
  std::vector<int64_t> slots(static_cast<size_t>(T));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  size_t next = 0;
  for (int64_t s = 0; s < T; ++s) {
    query_start[s + 1] = static_cast<int32_t>(s + 1);
    const int32_t ctx = contexts[s];
    for (int64_t b = 0; b <= ctx / p.block_size; ++b) tables[s * max_blocks + b] = physical[next++];
    for (int64_t pos = 0; pos <= ctx; ++pos) {
      const int64_t slot =
          int64_t{tables[s * max_blocks + pos / p.block_size]} * p.block_size + pos % p.block_size;
      if (pos == ctx) {
        slots[s] = slot;  // stays NaN: the fused launch writes it
        continue;
      }
      for (int64_t i = 0; i < kv; ++i) {
        k_cache[slot * kv + i] = FloatToBf16(dist(rng));
        v_cache[slot * kv + i] = FloatToBf16(dist(rng));
      }
    }
  }
  const auto qkv = RandomBf16(static_cast<size_t>(T * stride), rng, -2.0f, 2.0f);

  // CPU reference.
  std::vector<float> rotated = ToFloat(qkv);
  RopeCpu(rotated.data(), T, p.num_heads + p.num_kv_heads, stride, p.head_dim, 0,
          positions.data(), *table, false);
  rotated = cuda_test::RoundTrip(rotated);
  std::vector<float> kf = ToFloat(k_cache), vf = ToFloat(v_cache);
  WriteKvCacheCpu(rotated.data() + q_dim, stride, rotated.data() + q_dim + kv, stride,
                  slots.data(), T, kv, kv, kf.data(), vf.data());
  std::vector<PagedSequence> sequences(static_cast<size_t>(T));
  for (int64_t s = 0; s < T; ++s) {
    sequences[s] = {static_cast<int32_t>(s), 1, contexts[s], tables.data() + s * max_blocks};
  }
  std::vector<float> want(static_cast<size_t>(T * p.num_heads * p.v_head_dim));
  PagedAttentionCpu(rotated.data(), stride, kf.data(), vf.data(), sequences.data(), T, p,
                    want.data());

  auto d_qkv = Upload(qkv);
  auto d_k = Upload(k_cache);
  auto d_v = Upload(v_cache);
  auto d_pos = Upload(positions);
  auto d_slots = Upload(slots);
  auto d_out = NanBuffer(want.size());
  const DeviceStep step(query_start, contexts, tables, max_blocks, T, 1, max_seq);
  const PagedAttentionCudaBatch& batch = step.batch;
  ASSERT_TRUE(PagedAttentionDecodeFusionApplies(batch, p, rope_params.rotary_dim, options));
  const size_t ws_bytes = PagedAttentionCudaWorkspaceBytes(batch, p, options);
  auto ws = DeviceBuffer<uint8_t>::Create(std::max<size_t>(ws_bytes, 16));
  ASSERT_TRUE(ws.ok()) << ws.status();
  ASSERT_EQ(cudaMemset(ws->data(), 0xFF, std::max<size_t>(ws_bytes, 16)), cudaSuccess);
  const absl::Status st = PagedAttentionRopeDecodeCuda(
      d_qkv.data(), stride, d_k.data(), d_v.data(), batch, p, d_pos.data(), *d_table,
      d_slots.data(), ws->data(), d_out.data(), nullptr, options);
  ASSERT_TRUE(st.ok()) << st;
  ExpectClose(absl::StrCat(name, " out (workspace ", ws_bytes, " B)"), Download(d_out), want,
              kRtol, kAtol);
  // Launches after the first rewrite the same new rows and must give the same output.
  for (int i = 1; i < launches; ++i) {
    ASSERT_EQ(cudaMemset(d_out.data(), 0xFF, want.size() * sizeof(bf16)), cudaSuccess);
    ASSERT_TRUE(PagedAttentionRopeDecodeCuda(d_qkv.data(), stride, d_k.data(), d_v.data(), batch,
                                             p, d_pos.data(), *d_table, d_slots.data(),
                                             ws->data(), d_out.data(), nullptr, options)
                    .ok());
    ExpectClose(absl::StrCat(name, " out, launch ", i + 1), Download(d_out), want, kRtol, kAtol);
  }
  EXPECT_EQ(Download(d_qkv), ToFloat(qkv)) << "qkv must be left unrotated";

  // Cache: the new rows as the reference wrote them; every other element bit-identical.
  const std::vector<float> got_k = Download(d_k), got_v = Download(d_v);
  std::vector<float> new_k_got, new_k_want;
  std::vector<char> is_new(static_cast<size_t>(num_slots), 0);
  for (int64_t s = 0; s < T; ++s) is_new[slots[s]] = 1;
  int64_t changed = 0;
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    for (int64_t i = slot * kv; i < (slot + 1) * kv; ++i) {
      if (is_new[slot]) {
        new_k_got.push_back(got_k[i]);
        new_k_want.push_back(kf[i]);
        if (got_v[i] != vf[i]) ++changed;
        continue;
      }
      const bool same_k = std::isnan(kf[i]) ? std::isnan(got_k[i]) : got_k[i] == kf[i];
      const bool same_v = std::isnan(vf[i]) ? std::isnan(got_v[i]) : got_v[i] == vf[i];
      if (!same_k || !same_v) ++changed;
    }
  }
  EXPECT_EQ(changed, 0) << "cache elements other than the new rows' rotated k, or a wrong new v";
  ExpectClose(name + " new k rows", new_k_got, new_k_want, 1.0 / 128, 1e-4);

  // The unfused chain of a decode step under PDL: RopeQkWriteKvCuda (which lets the next kernel
  // launch as soon as it has started) writes the new rows, then PagedAttentionCuda, whose
  // copies before its dependency wait must not read them (PrefetchBeforeWait): the new rows
  // are NaN again before every round, so an early read shows up as NaN outputs.
  if (!PdlSupported()) return;
  PagedAttentionOptions chained = options;
  chained.pdl = true;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto d_rot = Upload(qkv);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(cudaMemcpy(d_k.data(), k_cache.data(), k_cache.size() * sizeof(bf16),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_v.data(), v_cache.data(), v_cache.size() * sizeof(bf16),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_rot.data(), d_qkv.data(), qkv.size() * sizeof(bf16),
                         cudaMemcpyDeviceToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(d_out.data(), 0xFF, want.size() * sizeof(bf16)), cudaSuccess);
    // The copies above run on the legacy stream, which `stream` does not wait for.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(RopeQkWriteKvCuda(d_rot.data(), T, stride, p.num_heads, p.num_kv_heads,
                                  p.head_dim, d_pos.data(), *d_table, d_slots.data(), d_k.data(),
                                  d_v.data(), stream, /*pdl=*/true)
                    .ok());
    const absl::Status chain =
        PagedAttentionCuda(d_rot.data(), stride, d_k.data(), d_v.data(), batch, p, ws->data(),
                           d_out.data(), stream, chained);
    ASSERT_TRUE(chain.ok()) << chain;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ExpectClose(absl::StrCat(name, " unfused chain under PDL, round ", round + 1), Download(d_out),
                want, kRtol, kAtol);
  }
  cudaStreamDestroy(stream);
}
// Decode fusion under every decode kernel (the prologue precedes the warp-ring loop; the
// persistent warps write each unit's new key right before copying its slice at head dims ≤ 128,
// all of a warp's new keys first at wider ones) and the split plans: batch 1 with the new key
// in a partition of its own (1024) or last in one (1023, 3000), mixed contexts incl. 0, 1 and
// block boundaries, a sliding window, Llama-3 (head_dim 128, llama3 table), head_dim 64 with a
// partial YaRN-scaled rotary span (the unrotated k tail goes to the cache too) and group 1, and
// head_dim 256; on the persistent warps also several units a warp (each unit's q rotated with
// its own position, the swapped math rotating q on load).
TEST(PagedAttentionCudaTest, DecodeRopeFusionMatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const RopeParams llama = cuda_test::Llama3Rope();
  RopeParams yarn;
  yarn.rope_type = "yarn";
  yarn.theta = 10000.0;
  yarn.rotary_dim = 32;
  yarn.factor = 4.0;
  yarn.original_max_position_embeddings = 1024;
  RopeParams plain;
  plain.theta = 10000.0;
  plain.rotary_dim = 64;
  RopeParams wide = plain;
  wide.rotary_dim = 256;
  for (const PagedDecodeKernel kernel : {PagedDecodeKernel::kWarpRings,
                                         PagedDecodeKernel::kPersistentWarps,
                                         PagedDecodeKernel::kAuto}) {
    const PagedAttentionOptions o = DecodeOptions(kernel);
    const std::string tag = DecodeKernelTag(kernel);
    const PagedAttentionParams llama_p = Params(32, 8, 128, 128, 16);
    RunFusedDecodeCase(tag + "llama b1 ctx3000", llama_p, llama, {3000}, rng, o);
    RunFusedDecodeCase(tag + "llama b1 ctx1023", llama_p, llama, {1023}, rng, o);
    RunFusedDecodeCase(tag + "llama b1 ctx1024", llama_p, llama, {1024}, rng, o);
    RunFusedDecodeCase(tag + "llama b8", llama_p, llama, {0, 1, 15, 16, 17, 100, 513, 1200}, rng,
                       o);
    RunFusedDecodeCase(tag + "llama window 200", Params(32, 8, 128, 128, 16, 200), llama,
                       {900, 3, 250, 199, 200}, rng, o);
    RunFusedDecodeCase(tag + "d64 partial yarn g4", Params(16, 4, 64, 64, 16), yarn,
                       {130, 7, 600, 64, 0}, rng, o);
    RunFusedDecodeCase(tag + "d64 g1 block 7", Params(8, 8, 64, 64, 7), plain, {130, 0, 2000},
                       rng, o);
    RunFusedDecodeCase(tag + "d256 g2", Params(8, 4, 256, 256, 16), wide, {130, 0, 700, 17}, rng,
                       o);
    if (kernel != PagedDecodeKernel::kWarpRings) {
      std::vector<int32_t> b300 = {0, 1, 15, 16, 17, 1100};
      for (int i = 6; i < 300; ++i) b300.push_back((i * 53) % 200);
      EXPECT_TRUE(PlanOf(llama_p, 300, 1, 1101, o).swapped);
      RunFusedDecodeCase(tag + "llama b300", llama_p, llama, b300, rng, o, 2);
      RunFusedDecodeCase(tag + "g8 b300", Params(64, 8, 128, 128, 16), llama, b300, rng, o);
      RunFusedDecodeCase(tag + "16 kv heads b300", Params(32, 16, 128, 128, 16), llama, b300, rng,
                         o);
      RunFusedDecodeCase(tag + "d256 b300", Params(8, 4, 256, 256, 16), wide, b300, rng, o);
    }
  }
}

// Launches the fusion does not serve are refused (the runner then keeps two launches).
TEST(PagedAttentionCudaTest, DecodeRopeFusionRejectsOtherLaunches) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto meta = DeviceBuffer<int32_t>::Create(16);
  ASSERT_TRUE(meta.ok());
  PagedAttentionCudaBatch b;
  b.query_start_loc = b.context_lens = b.block_tables = meta->data();
  b.max_blocks_per_seq = 1;
  b.num_sequences = 1;
  b.num_tokens = 2;
  b.max_query_len = 2;  // a prefill chunk
  b.max_seq_len = 8;
  const PagedAttentionParams p = Params(32, 8, 128, 128, 16);
  EXPECT_FALSE(PagedAttentionDecodeFusionApplies(b, p, 128));
  b.num_tokens = 1;
  b.max_query_len = 1;
  EXPECT_TRUE(PagedAttentionDecodeFusionApplies(b, p, 128));
  EXPECT_TRUE(PagedAttentionDecodeFusionApplies(b, p, 64));
  EXPECT_FALSE(PagedAttentionDecodeFusionApplies(b, p, 6));    // pairs straddle the halves
  EXPECT_FALSE(PagedAttentionDecodeFusionApplies(b, p, 256));  // wider than the head
  EXPECT_FALSE(PagedAttentionDecodeFusionApplies(b, Params(32, 1, 128, 128, 16), 128));  // g 32
  EXPECT_FALSE(PagedAttentionDecodeFusionApplies(b, Params(16, 16, 192, 128, 64), 64));  // d≠dv
  // Unsplit decode launches pay: 64 sequences × 8 KV heads (512 units, warp rings) and 256
  // (2048 units, at least the resident warps: the persistent warps, with their deferred
  // new-key writes) do; 16 (128 units) and 300 (2400 units, 2.3 waves of persistent warps,
  // evened out by a split) split their keys, and prefill chunks are not decode launches.
  PagedAttentionCudaBatch pays = b;
  pays.num_sequences = 64;
  pays.num_tokens = 64;
  pays.max_seq_len = 1100;
  EXPECT_TRUE(PagedAttentionDecodeFusionPays(pays, p));
  pays.num_sequences = 16;
  pays.num_tokens = 16;
  EXPECT_FALSE(PagedAttentionDecodeFusionPays(pays, p));
  pays.num_sequences = 256;
  pays.num_tokens = 256;
  EXPECT_TRUE(PagedAttentionDecodeFusionPays(pays, p));
  // The persistent warps at head dim 256 write their new keys first: no gain there.
  EXPECT_FALSE(PagedAttentionDecodeFusionPays(pays, Params(8, 4, 256, 256, 16),
                                              DecodeOptions(PagedDecodeKernel::kPersistentWarps)));
  pays.num_sequences = 300;
  pays.num_tokens = 300;
  EXPECT_FALSE(PagedAttentionDecodeFusionPays(pays, p));
  pays.num_sequences = 1;
  pays.num_tokens = 64;
  pays.max_query_len = 64;
  EXPECT_FALSE(PagedAttentionDecodeFusionPays(pays, p));
  pays.max_seq_len = 0;
  EXPECT_FALSE(PagedAttentionDecodeFusionPays(pays, p));  // invalid sizes
  RopeTable t;
  t.inv_freq.assign(64, 1.0f);
  auto table = UploadRopeTable(t);
  ASSERT_TRUE(table.ok());
  auto buf = DeviceBuffer<bf16>::Create(8192);
  ASSERT_TRUE(buf.ok());
  b.max_query_len = 2;
  EXPECT_EQ(PagedAttentionRopeDecodeCuda(buf->data(), 48 * 128, buf->data(), buf->data(), b, p,
                                         meta->data(), *table, nullptr, nullptr, buf->data(),
                                         nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WriteKvCacheCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  struct Shape {
    int64_t k_elems, v_elems, k_stride, v_stride;
  };
  // Vector path (multiples of 8, 16-byte strides), scalar path (odd sizes), MLA latent (no V).
  for (const Shape& sh :
       {Shape{1024, 1024, 3072, 3072}, Shape{24, 16, 30, 17}, Shape{576, 0, 576, 0}}) {
    const int64_t tokens = 37, slots = 100;
    const auto k = RandomBf16(static_cast<size_t>(tokens * sh.k_stride), rng, -1.0f, 1.0f);
    const auto v = RandomBf16(static_cast<size_t>(std::max<int64_t>(1, tokens * sh.v_stride)), rng,
                              -1.0f, 1.0f);
    std::vector<int64_t> slot(static_cast<size_t>(tokens));
    std::vector<int64_t> perm(static_cast<size_t>(slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t t = 0; t < tokens; ++t) slot[t] = t % 5 == 4 ? -1 : perm[t];
    auto d_k = Upload(k);
    auto d_v = Upload(v);
    auto d_slot = Upload(slot);
    auto d_kc = NanBuffer(static_cast<size_t>(slots * sh.k_elems));
    auto d_vc = NanBuffer(static_cast<size_t>(std::max<int64_t>(1, slots * sh.v_elems)));
    ASSERT_TRUE(WriteKvCacheCuda(d_k.data(), sh.k_stride, sh.v_elems ? d_v.data() : nullptr,
                                 sh.v_stride, d_slot.data(), tokens, sh.k_elems, sh.v_elems,
                                 d_kc.data(), sh.v_elems ? d_vc.data() : nullptr, nullptr)
                    .ok());
    const auto kf = ToFloat(k);
    const auto vf = ToFloat(v);
    std::vector<float> kc(d_kc.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> vc(d_vc.size(), std::numeric_limits<float>::quiet_NaN());
    WriteKvCacheCpu(kf.data(), sh.k_stride, vf.data(), sh.v_stride, slot.data(), tokens, sh.k_elems,
                    sh.v_elems, kc.data(), vc.data());
    const auto got_k = Download(d_kc);
    const auto got_v = Download(d_vc);
    // Exact copy, and untouched slots stay NaN.
    for (size_t i = 0; i < kc.size(); ++i) {
      ASSERT_TRUE(std::isnan(kc[i]) ? std::isnan(got_k[i]) : got_k[i] == kc[i]) << "k " << i;
    }
    for (size_t i = 0; i < vc.size(); ++i) {
      ASSERT_TRUE(std::isnan(vc[i]) ? std::isnan(got_v[i]) : got_v[i] == vc[i]) << "v " << i;
    }
  }
  // Bad sizes.
  EXPECT_EQ(
      WriteKvCacheCuda(nullptr, 8, nullptr, 0, nullptr, 1, 8, 0, nullptr, nullptr, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
}

// The FlashAttention-2 tile-shape prefill kernel (PagedPrefillKernel::kFa2: served at head
// dims 64 and, without wgmma, 128) forced at every shape, against the CPU reference, every
// output element: fresh prompts whose rows (tokens × group) are not multiples of the 128-row
// tile or of the 64-key tile, several sequences of chunked prefill over cached prefixes, a long
// chunk over a prefix (split-KV partials), GQA 4:1, 2:1, 7:1 and 1:1, head dims 128, 64 and
// padded 96/64, block sizes 16, 32, 64, 8 and 7, a sliding window, a q stride that rules out
// 16-byte copies, decode rows in the same launch, and head dim 32 (not served: the MMA tiles).
TEST(PagedAttentionCudaTest, Fa2PrefillKernels) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  {
    const std::string tag = "fa2 prefill ";
    const PagedAttentionOptions o = PrefillOptions(PagedPrefillKernel::kFa2);
    EXPECT_EQ(PlanOf(Params(32, 8, 128, 128, 16), 1, 300, 300, o).kernel,
              PagedAttentionKernel::kFa2);
    // Every case below with these options (shadows the file's RunCase).
    auto RunCase = [&](Case c, std::mt19937& r) { kernels::RunCase(With(std::move(c), o), r); };
    RunCase({tag + "fresh 300 g4", Params(32, 8, 128, 128, 16), {{0, 300}}}, rng);
    RunCase({tag + "fresh 1030 g4", Params(8, 2, 128, 128, 16), {{0, 1030}}}, rng);
    RunCase({tag + "chunks over prefixes g4",
             Params(32, 8, 128, 128, 16),
             {{0, 77}, {1000, 77}, {333, 150}, {64, 64}, {17, 5}}},
            rng);
    RunCase({tag + "chunk 200 over 3000 g8", Params(32, 4, 128, 128, 16), {{3000, 200}}}, rng);
    RunCase({tag + "d64 g4 chunks", Params(16, 4, 64, 64, 16), {{0, 65}, {128, 64}, {33, 1}}},
            rng);
    RunCase({tag + "mha d64", Params(8, 8, 64, 64, 16), {{0, 129}, {500, 40}}}, rng);
    RunCase({tag + "d96 dv64 g2", Params(8, 4, 96, 64, 16), {{0, 100}, {50, 37}}}, rng);
    RunCase({tag + "d128 g7 block 7", Params(28, 4, 128, 128, 7), {{90, 20}, {0, 333}}}, rng);
    RunCase({tag + "block 32 g4", Params(16, 4, 128, 128, 32), {{0, 270}, {200, 90}}}, rng);
    RunCase({tag + "block 64 d64 g2", Params(8, 4, 64, 64, 64), {{0, 300}, {130, 33}}}, rng);
    RunCase({tag + "block 8 g4", Params(16, 4, 128, 128, 8), {{0, 200}, {77, 60}}}, rng);
    RunCase({tag + "window 100", Params(32, 8, 128, 128, 16, 100), {{300, 150}, {1, 1}}}, rng);
    RunCase({tag + "mixed with decode rows",
             Params(32, 8, 128, 128, 16),
             {{700, 1}, {0, 40}, {2500, 1}, {64, 130}, {1100, 17}}},
            rng);
    Case odd{tag + "q stride pad 2", Params(8, 2, 128, 128, 16), {{50, 30}, {0, 90}}};
    odd.q_stride_pad = 2;
    RunCase(odd, rng);
    RunCase({tag + "d32 (mma tiles fallback)", Params(8, 2, 32, 32, 16), {{0, 70}}}, rng);
  }
}

// The Hopper wgmma prefill kernel (PagedPrefillKernel::kWgmma, the default; paged_prefill_wgmma.cu)
// against the CPU reference, every output element: fresh prompts whose rows (tokens × group)
// are not multiples of the 128-row tile or of the 64-key tile (and one that is), chunked prefill
// over cached prefixes, a long chunk over a prefix (split-KV partials), GQA 4:1, 8:1, 7:1 and
// 1:1, block sizes 16, 32, 64, 8 and 7 (no power of two), a q stride that rules out 16-byte
// copies, decode rows in the same launch, and launches it does not serve (sliding window, head
// dims 64 and 32: the FA2 kernel / the MMA tiles). On a compute 9.0 device the kernel must serve
// head dim 128 (so these cases run it rather than the fallback).
TEST(PagedAttentionCudaTest, WgmmaPrefillKernel) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  int device = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), cudaSuccess);
  if (major == 9 && minor == 0) {
    EXPECT_TRUE(paged_detail::WgmmaPrefillSupports(128, 128, 0.088f, 0));
  }
  EXPECT_FALSE(paged_detail::WgmmaPrefillSupports(128, 128, 0.088f, 100));
  EXPECT_FALSE(paged_detail::WgmmaPrefillSupports(64, 64, 0.125f, 0));
  const std::string tag = "wgmma prefill ";
  // Small structured cases first (an error map on mismatch): one head, then zero q (uniform
  // softmax: only the P·V path and V's layout matter).
  Case one{tag + "one head fresh 64", Params(1, 1, 128, 128, 16), {{0, 64}}};
  one.error_map = true;
  RunCase(one, rng);
  Case flat{tag + "zero q fresh 70", Params(1, 1, 128, 128, 16), {{0, 70}}};
  flat.zero_q = true;
  flat.error_map = true;
  RunCase(flat, rng);
  Case flat_g4{tag + "zero q g4 fresh 40", Params(4, 1, 128, 128, 16), {{0, 40}}};
  flat_g4.zero_q = true;
  flat_g4.error_map = true;
  RunCase(flat_g4, rng);
  RunCase({tag + "fresh 300 g4", Params(32, 8, 128, 128, 16), {{0, 300}}}, rng);
  RunCase({tag + "fresh 1030 g4", Params(8, 2, 128, 128, 16), {{0, 1030}}}, rng);
  RunCase({tag + "fresh 128 mha", Params(4, 4, 128, 128, 16), {{0, 128}}}, rng);
  RunCase({tag + "fresh 5 g4", Params(8, 2, 128, 128, 16), {{0, 5}}}, rng);
  RunCase({tag + "chunks over prefixes g4",
           Params(32, 8, 128, 128, 16),
           {{0, 77}, {1000, 77}, {333, 150}, {64, 64}, {17, 5}}},
          rng);
  RunCase({tag + "chunk 200 over 3000 g8", Params(32, 4, 128, 128, 16), {{3000, 200}}}, rng);
  RunCase({tag + "chunk 40 over 5000 g4", Params(8, 2, 128, 128, 16), {{5000, 40}}}, rng);
  RunCase({tag + "mha chunks", Params(8, 8, 128, 128, 16), {{0, 129}, {500, 40}}}, rng);
  RunCase({tag + "d128 g7 block 7", Params(28, 4, 128, 128, 7), {{90, 20}, {0, 333}}}, rng);
  RunCase({tag + "block 32 g4", Params(16, 4, 128, 128, 32), {{0, 270}, {200, 90}}}, rng);
  RunCase({tag + "block 64 g4", Params(16, 4, 128, 128, 64), {{0, 300}, {130, 33}}}, rng);
  RunCase({tag + "block 8 g4", Params(16, 4, 128, 128, 8), {{0, 200}, {77, 60}}}, rng);
  RunCase({tag + "mixed with decode rows",
           Params(32, 8, 128, 128, 16),
           {{700, 1}, {0, 40}, {2500, 1}, {64, 130}, {1100, 17}}},
          rng);
  Case odd{tag + "q stride pad 2", Params(8, 2, 128, 128, 16), {{50, 30}, {0, 90}}};
  odd.q_stride_pad = 2;
  RunCase(odd, rng);
  Case loose{tag + "loose bounds", Params(32, 8, 128, 128, 16), {{0, 20}, {100, 1}}};
  loose.extra_query_len = 100;
  loose.extra_seq_len = 3000;
  RunCase(loose, rng);
  // Not served: the FA2 kernel (window, d64) and the MMA tiles (d32).
  RunCase({tag + "window 100 (fallback)", Params(32, 8, 128, 128, 16, 100), {{300, 150}, {1, 1}}},
          rng);
  RunCase({tag + "d64 (fallback)", Params(16, 4, 64, 64, 16), {{0, 65}, {128, 64}, {33, 1}}}, rng);
  RunCase({tag + "d32 (fallback)", Params(8, 2, 32, 32, 16), {{0, 70}}}, rng);
}

}  // namespace
}  // namespace sluice::kernels
