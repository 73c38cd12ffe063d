// PagedAttentionBoundedCpu: with no key start it is PagedAttentionCpu; with one, positions
// below it (NaN in the cache) are never read and the result is PagedAttentionCpu over a
// contiguous copy of keys [start, end) with the context shortened by start (the relative
// window mask then covers max(start, i - window + 1)..i) — the gather the CPU Llama model does
// for sliding_kv_start.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention/paged_attention.h"
#include "kernels/attention/paged_attention_bounded.h"

namespace sluice::kernels {
namespace {

struct Spec {
  int32_t context, query, key_start;
};

struct Step {
  PagedAttentionParams p;
  std::vector<Spec> specs;
  std::vector<std::vector<int32_t>> tables;
  std::vector<PagedSequence> seqs;
  std::vector<int32_t> starts;
  std::vector<float> q, k_cache, v_cache;
  int64_t num_tokens = 0;
};

// Random K/V in a scattered paged cache; positions below a sequence's key start hold NaN.
Step MakeStep(const std::vector<Spec>& specs, int64_t heads, int64_t kv_heads, int64_t d,
              int64_t window, int64_t block, uint32_t seed) {
  Step s;
  s.p.num_heads = heads;
  s.p.num_kv_heads = kv_heads;
  s.p.head_dim = d;
  s.p.v_head_dim = d;
  s.p.block_size = block;
  s.p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  s.p.sliding_window = window;
  s.specs = specs;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0, 1);
  int64_t total_blocks = 0;
  for (const Spec& x : specs) total_blocks += (x.context + x.query + block - 1) / block;
  std::vector<int32_t> ids(static_cast<size_t>(total_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t stride = kv_heads * d;
  s.k_cache.assign(static_cast<size_t>(total_blocks * block * stride), NAN);
  s.v_cache = s.k_cache;
  size_t next = 0;
  for (const Spec& x : specs) {
    const int64_t n = (x.context + x.query + block - 1) / block;
    s.tables.emplace_back(ids.begin() + next, ids.begin() + next + n);
    next += n;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& x = specs[i];
    for (int64_t pos = x.key_start; pos < x.context + x.query; ++pos) {
      const int64_t slot = int64_t{s.tables[i][pos / block]} * block + pos % block;
      for (int64_t c = 0; c < stride; ++c) {
        s.k_cache[slot * stride + c] = dist(rng);
        s.v_cache[slot * stride + c] = dist(rng);
      }
    }
    s.seqs.push_back({static_cast<int32_t>(s.num_tokens), x.query, x.context,
                      s.tables[i].data()});
    s.starts.push_back(x.key_start);
    s.num_tokens += x.query;
  }
  s.q.resize(static_cast<size_t>(s.num_tokens * heads * d));
  for (float& v : s.q) v = dist(rng);
  return s;
}

// PagedAttentionCpu over each sequence's keys [start, end) copied to a contiguous cache.
std::vector<float> GatheredReference(const Step& s) {
  const int64_t stride = s.p.num_kv_heads * s.p.head_dim, bs = s.p.block_size;
  std::vector<float> out(static_cast<size_t>(s.num_tokens * s.p.num_heads * s.p.v_head_dim));
  for (size_t i = 0; i < s.specs.size(); ++i) {
    const Spec& x = s.specs[i];
    const int64_t keys = x.context + x.query - x.key_start;
    const int64_t blocks = (keys + bs - 1) / bs;
    std::vector<float> k(static_cast<size_t>(blocks * bs * stride)), v(k.size());
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t pos = x.key_start + j;
      const int64_t slot = int64_t{s.tables[i][pos / bs]} * bs + pos % bs;
      std::copy_n(s.k_cache.begin() + slot * stride, stride, k.begin() + j * stride);
      std::copy_n(s.v_cache.begin() + slot * stride, stride, v.begin() + j * stride);
    }
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    const PagedSequence seq{s.seqs[i].query_start, x.query, x.context - x.key_start,
                            table.data()};
    PagedAttentionCpu(s.q.data(), s.p.num_heads * s.p.head_dim, k.data(), v.data(), &seq, 1, s.p,
                      out.data());
  }
  return out;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << "element " << i;
  }
}

std::vector<float> Bounded(const Step& s, bool null_start) {
  std::vector<float> out(static_cast<size_t>(s.num_tokens * s.p.num_heads * s.p.v_head_dim));
  PagedAttentionBoundedCpu(s.q.data(), s.p.num_heads * s.p.head_dim, s.k_cache.data(),
                           s.v_cache.data(), s.seqs.data(), null_start ? nullptr : s.starts.data(),
                           static_cast<int64_t>(s.seqs.size()), s.p, out.data());
  return out;
}

TEST(PagedAttentionBoundedCpu, NoKeyStartIsPagedAttention) {
  for (int64_t window : {0, 5}) {
    SCOPED_TRACE(window);
    const Step s = MakeStep({{0, 9, 0}, {13, 1, 0}, {6, 4, 0}}, 4, 2, 16, window, 4, 11);
    std::vector<float> want(static_cast<size_t>(s.num_tokens * 4 * 16));
    PagedAttentionCpu(s.q.data(), 4 * 16, s.k_cache.data(), s.v_cache.data(), s.seqs.data(), 3,
                      s.p, want.data());
    ExpectNear(Bounded(s, /*null_start=*/true), want);
    ExpectNear(Bounded(s, /*null_start=*/false), want);  // all starts 0
  }
}

TEST(PagedAttentionBoundedCpu, KeyStartBoundsSlidingWindow) {
  // Window 8. Sequence 0: a replay of positions [20, 30) (start 20 > i - 7 for its first
  // queries, below it for the later ones). Sequence 1: one decode token at 23 with start 20
  // (reaches below: bounded). Sequence 2: start 3 well below every window (no effect).
  // Sequence 3: start 0.
  const Step s = MakeStep({{20, 10, 20}, {23, 1, 20}, {30, 2, 3}, {5, 3, 0}}, 6, 2, 32, 8, 4, 7);
  ExpectNear(Bounded(s, false), GatheredReference(s));
}

TEST(PagedAttentionBoundedCpu, KeyStartWithoutWindow) {
  // Full attention restricted to [start, i]: the gathered reference without a window.
  const Step s = MakeStep({{17, 5, 9}, {4, 4, 4}}, 2, 1, 8, 0, 4, 3);
  ExpectNear(Bounded(s, false), GatheredReference(s));
}

}  // namespace
}  // namespace sluice::kernels
