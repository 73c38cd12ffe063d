// PagedAttentionBoundedCuda against PagedAttentionBoundedCpu (paged_attention_bounded.h) on
// random bf16 inputs: key starts above the window's first key (replay rows and the decode rows
// after a replay shorter than the window), at 0, null, without a window; GQA groups, the head
// dims of qwen3-hybrid-tiny (16) and sluice-mini-swa (64) up to 256, scattered block tables.
// Cache positions below a key start hold NaN, so reading one shows up as a NaN output. Then a
// frozen layer (ForwardInput::kv_frozen_layers) as the CUDA Llama runner runs it: RoPE with
// every slot -1 leaves the cache bit for bit, and attention (bounded for a sliding layer, the
// default PagedAttentionCuda for a full one) reads the cached K/V of the query tokens' own
// positions, not the step's new ones. Needs a GPU: part of kernels_cuda_test.
#include "kernels/attention/paged_attention_bounded_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/attention/paged_attention_bounded.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/rope/rope.h"
#include "kernels/rope/rope_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

// As paged_attention_cuda_test.cc: a few bf16 roundings per output element.
constexpr double kRtol = 1.0 / 64;
constexpr double kAtol = 1.0 / 128;

struct Seq {
  int32_t context, query, key_start;
};

struct BoundedCase {
  std::string name;
  int64_t heads, kv_heads, head_dim, block_size, window;
  std::vector<Seq> seqs;
  bool null_start = false;
  int64_t q_stride_pad = 0;
};

// A step's host data: scattered block tables, a bf16 cache whose positions below each key start
// are NaN, q rows.
struct HostStep {
  PagedAttentionParams p;
  std::vector<int32_t> query_start, context_lens, starts, tables;
  int64_t max_blocks = 0, num_tokens = 0, max_query = 0, max_seq = 0, q_stride = 0;
  std::vector<bf16> k_cache, v_cache, q;
  std::vector<PagedSequence> cpu_seqs;
};

HostStep MakeHostStep(const BoundedCase& c, std::mt19937& rng) {
  HostStep h;
  h.p.num_heads = c.heads;
  h.p.num_kv_heads = c.kv_heads;
  h.p.head_dim = c.head_dim;
  h.p.v_head_dim = c.head_dim;
  h.p.block_size = c.block_size;
  h.p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  h.p.sliding_window = c.window;
  int64_t total_blocks = 0;
  for (const Seq& s : c.seqs) {
    const int64_t nb = (s.context + s.query + c.block_size - 1) / c.block_size;
    h.max_blocks = std::max(h.max_blocks, nb);
    total_blocks += nb;
    h.num_tokens += s.query;
    h.max_query = std::max<int64_t>(h.max_query, s.query);
    h.max_seq = std::max<int64_t>(h.max_seq, s.context + s.query);
  }
  total_blocks = total_blocks * 2 + 1;  // unowned blocks in between
  std::vector<int32_t> physical(static_cast<size_t>(total_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  h.tables.assign(static_cast<size_t>(c.seqs.size() * h.max_blocks), -1);
  const int64_t stride = c.kv_heads * c.head_dim;
  const bf16 nan = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
  h.k_cache.assign(static_cast<size_t>(total_blocks * c.block_size * stride), nan);
  h.v_cache = h.k_cache;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  h.query_start.push_back(0);
  size_t next = 0;
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    const Seq& s = c.seqs[i];
    const int64_t len = s.context + s.query;
    const int64_t nb = (len + c.block_size - 1) / c.block_size;
    for (int64_t b = 0; b < nb; ++b) h.tables[i * h.max_blocks + b] = physical[next++];
    for (int64_t pos = s.key_start; pos < len; ++pos) {
      const int64_t slot =
          int64_t{h.tables[i * h.max_blocks + pos / c.block_size]} * c.block_size +
          pos % c.block_size;
      for (int64_t e = 0; e < stride; ++e) {
        h.k_cache[slot * stride + e] = FloatToBf16(dist(rng));
        h.v_cache[slot * stride + e] = FloatToBf16(dist(rng));
      }
    }
    h.context_lens.push_back(s.context);
    h.starts.push_back(s.key_start);
    h.cpu_seqs.push_back({h.query_start.back(), s.query, s.context,
                          h.tables.data() + i * h.max_blocks});
    h.query_start.push_back(h.query_start.back() + s.query);
  }
  h.q_stride = c.heads * c.head_dim + c.q_stride_pad;
  h.q = RandomBf16(static_cast<size_t>(h.num_tokens * h.q_stride), rng, -2.0f, 2.0f);
  return h;
}

struct DeviceStep {
  DeviceBuffer<int32_t> query_start, context_lens, tables, starts;
  PagedAttentionCudaBatch batch;
  explicit DeviceStep(const HostStep& h)
      : query_start(Upload(h.query_start)),
        context_lens(Upload(h.context_lens)),
        tables(Upload(h.tables)),
        starts(Upload(h.starts)) {
    batch.query_start_loc = query_start.data();
    batch.context_lens = context_lens.data();
    batch.block_tables = tables.data();
    batch.max_blocks_per_seq = h.max_blocks;
    batch.num_sequences = static_cast<int64_t>(h.context_lens.size());
    batch.num_tokens = h.num_tokens;
    batch.max_query_len = h.max_query;
    batch.max_seq_len = h.max_seq;
  }
};

std::vector<float> CpuReference(const HostStep& h, const std::vector<float>& q, bool null_start) {
  const std::vector<float> k = ToFloat(h.k_cache), v = ToFloat(h.v_cache);
  std::vector<float> out(static_cast<size_t>(h.num_tokens * h.p.num_heads * h.p.v_head_dim));
  PagedAttentionBoundedCpu(q.data(), h.q_stride, k.data(), v.data(), h.cpu_seqs.data(),
                           null_start ? nullptr : h.starts.data(),
                           static_cast<int64_t>(h.cpu_seqs.size()), h.p, out.data());
  return out;
}

void RunBoundedCase(const BoundedCase& c, std::mt19937& rng) {
  SCOPED_TRACE(c.name);
  const HostStep h = MakeHostStep(c, rng);
  DeviceStep d(h);
  auto q = Upload(h.q);
  auto k = Upload(h.k_cache);
  auto v = Upload(h.v_cache);
  auto out = NanBuffer(static_cast<size_t>(h.num_tokens * c.heads * c.head_dim));
  const absl::Status s = PagedAttentionBoundedCuda(
      q.data(), h.q_stride, k.data(), v.data(), d.batch, c.null_start ? nullptr : d.starts.data(),
      h.p, out.data(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ExpectClose(c.name, Download(out), CpuReference(h, ToFloat(h.q), c.null_start), kRtol, kAtol);
}

TEST(PagedAttentionBoundedCuda, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  const std::vector<BoundedCase> cases = {
      // qwen3-hybrid-tiny's sliding layers (4 heads / 2 KV heads, head dim 16, window 16): a
      // replay of [40, 50) with start 40 (> i - 15 for every row), a replay of a whole short
      // prompt (start 0), a decode row at 45 after a replay from 40 (start > 45 - 15).
      {"tiny replay", 4, 2, 16, 16, 16, {{40, 10, 40}, {0, 7, 0}, {45, 1, 40}}},
      // sluice-mini-swa (head dim 64, window 64), R = 128 over a 300-token prompt: the first
      // 63 rows are bounded by the window alone (start 172 < i - 63 for i >= 236).
      {"mini-swa replay R=128", 4, 2, 64, 16, 64, {{172, 128, 172}}},
      // R = 32 < window: every row's window reaches below the start.
      {"mini-swa replay R=32", 4, 2, 64, 16, 64, {{268, 32, 268}, {100, 1, 90}}},
      // Start exactly at i - window + 1 of the first row, and start 0 with a window.
      {"start at window edge", 8, 2, 128, 16, 32, {{50, 6, 19}, {70, 3, 0}}},
      // No window: full attention over [start, i].
      {"no window", 4, 4, 64, 16, 0, {{33, 9, 20}, {8, 8, 0}}},
      // Null key_start: plain sliding-window attention.
      {"null key start", 4, 1, 64, 8, 24, {{60, 5, 0}, {3, 2, 0}}, /*null_start=*/true},
      // Head dim 256, GQA 8, a fused-QKV row stride, odd block size.
      {"head dim 256", 16, 2, 256, 5, 40, {{97, 17, 70}}, false, 2 * 2 * 256},
      // Long window, many sequences of one decode row each.
      {"decode rows", 8, 8, 128, 16, 512,
       {{600, 1, 300}, {900, 1, 450}, {20, 1, 0}, {513, 1, 10}, {1000, 1, 0}}},
  };
  for (const BoundedCase& c : cases) RunBoundedCase(c, rng);
}

TEST(PagedAttentionBoundedCuda, RejectsBadArguments) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  const BoundedCase c{"args", 4, 2, 64, 16, 16, {{10, 2, 4}}};
  const HostStep h = MakeHostStep(c, rng);
  DeviceStep d(h);
  auto q = Upload(h.q);
  auto k = Upload(h.k_cache);
  auto v = Upload(h.v_cache);
  auto out = NanBuffer(static_cast<size_t>(h.num_tokens * 4 * 64));
  PagedAttentionParams p = h.p;
  p.num_kv_heads = 3;
  EXPECT_EQ(PagedAttentionBoundedCuda(q.data(), h.q_stride, k.data(), v.data(), d.batch, nullptr,
                                      p, out.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  p = h.p;
  p.head_dim = p.v_head_dim = 512;
  EXPECT_EQ(PagedAttentionBoundedCuda(q.data(), 4 * 512, k.data(), v.data(), d.batch, nullptr, p,
                                      out.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedAttentionBoundedCuda(q.data(), 4 * 64 - 1, k.data(), v.data(), d.batch, nullptr,
                                      h.p, out.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedAttentionBoundedCuda(q.data(), h.q_stride, nullptr, v.data(), d.batch, nullptr,
                                      h.p, out.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A frozen layer of a replay step: RopeQkWriteKvCuda with every slot -1 rotates q (and k) in
// the QKV rows but leaves the cache, which holds transferred K/V for every position the step
// covers (its own query positions included), bit for bit; attention then reads those.
TEST(PagedAttentionBoundedCuda, FrozenLayerReadsTransferredKv) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  for (const int64_t window : {int64_t{0}, int64_t{16}}) {
    SCOPED_TRACE(window);
    // Query rows [30, 42) of one sequence and [9, 12) of another; the K/V of every position
    // (queries included) were transferred.
    const BoundedCase c{"frozen", 4, 2, 16, 16, window, {{30, 12, 0}, {9, 3, 0}},
                        false, /*q_stride_pad=*/2 * 2 * 16};
    const HostStep h = MakeHostStep(c, rng);  // q rows: q, then k and v of the step (ignored)
    DeviceStep d(h);
    const int64_t q_dim = c.heads * c.head_dim;
    std::vector<int32_t> positions;
    for (size_t i = 0; i < c.seqs.size(); ++i) {
      for (int32_t t = 0; t < c.seqs[i].query; ++t) positions.push_back(c.seqs[i].context + t);
    }
    RopeParams rp;
    rp.theta = 1000000.0;
    rp.rotary_dim = c.head_dim;
    auto table = MakeRopeTable(rp);
    ASSERT_TRUE(table.ok()) << table.status();
    auto dev_table = UploadRopeTable(*table);
    ASSERT_TRUE(dev_table.ok()) << dev_table.status();
    auto qkv = Upload(h.q);
    auto k = Upload(h.k_cache);
    auto v = Upload(h.v_cache);
    auto pos = Upload(positions);
    auto no_slots = Upload(std::vector<int64_t>(static_cast<size_t>(h.num_tokens), -1));
    absl::Status s = RopeQkWriteKvCuda(qkv.data(), h.num_tokens, h.q_stride, c.heads,
                                       c.kv_heads, c.head_dim, pos.data(), *dev_table,
                                       no_slots.data(), k.data(), v.data(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    // The cache is untouched (NaN bits included).
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const auto& [buf, want] : {std::pair{&k, &h.k_cache}, std::pair{&v, &h.v_cache}}) {
      std::vector<bf16> got(want->size());
      ASSERT_TRUE(buf->CopyToHost(got.data()).ok());
      EXPECT_EQ(std::memcmp(got.data(), want->data(), got.size() * sizeof(bf16)), 0);
    }
    // The reference: q rotated on the host (fp32, rounded to bf16 as the kernel stores it).
    std::vector<float> q = ToFloat(h.q);
    RopeCpu(q.data(), h.num_tokens, c.heads, h.q_stride, c.head_dim, 0, positions.data(), *table,
            false);
    for (int64_t t = 0; t < h.num_tokens; ++t) {
      for (int64_t e = 0; e < q_dim; ++e) {
        float& x = q[t * h.q_stride + e];
        x = Bf16ToFloat(FloatToBf16(x));
      }
    }
    const std::vector<float> want = CpuReference(h, q, /*null_start=*/false);
    auto out = NanBuffer(static_cast<size_t>(h.num_tokens * q_dim));
    s = PagedAttentionBoundedCuda(qkv.data(), h.q_stride, k.data(), v.data(), d.batch,
                                  d.starts.data(), h.p, out.data(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    ExpectClose("frozen bounded", Download(out), want, kRtol, kAtol);
    // The default kernel on the same frozen cache (a full-attention layer of a replay step).
    const size_t ws_bytes = PagedAttentionCudaWorkspaceBytes(d.batch, h.p);
    DeviceBuffer<uint8_t> ws;
    if (ws_bytes > 0) {
      auto b = DeviceBuffer<uint8_t>::Create(ws_bytes);
      ASSERT_TRUE(b.ok()) << b.status();
      ws = std::move(*b);
    }
    auto out2 = NanBuffer(static_cast<size_t>(h.num_tokens * q_dim));
    s = PagedAttentionCuda(qkv.data(), h.q_stride, k.data(), v.data(), d.batch, h.p, ws.data(),
                           out2.data(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    ExpectClose("frozen default", Download(out2), want, kRtol, kAtol);
  }
}

}  // namespace
}  // namespace sluice::kernels
