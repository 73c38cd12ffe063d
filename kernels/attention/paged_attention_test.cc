#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention/paged_attention.h"

namespace sluice::kernels {
namespace {

struct SeqSpec {
  int32_t num_context;
  int32_t num_query;
};

// Builds a random scenario: per-sequence contiguous K/V of all positions, a scattered paged
// cache holding the same values, and checks PagedAttentionCpu against a naive softmax.
void RunScenario(const std::vector<SeqSpec>& specs, int64_t heads, int64_t kv_heads,
                 int64_t head_dim, int64_t v_dim, int64_t block_size, int64_t window,
                 uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0, 1);
  int64_t total_blocks = 0;
  std::vector<int64_t> nblocks;
  for (const auto& s : specs) {
    nblocks.push_back((s.num_context + s.num_query + block_size - 1) / block_size);
    total_blocks += nblocks.back();
  }
  // Shuffled block ids.
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<int32_t>> tables;
  size_t next = 0;
  for (int64_t n : nblocks) {
    tables.emplace_back(ids.begin() + next, ids.begin() + next + n);
    next += n;
  }
  const int64_t kstride = kv_heads * head_dim, vstride = kv_heads * v_dim;
  std::vector<float> k_cache(total_blocks * block_size * kstride, NAN);
  std::vector<float> v_cache(total_blocks * block_size * vstride, NAN);
  std::vector<std::vector<float>> ks, vs;  // per sequence, contiguous
  std::vector<PagedSequence> seqs;
  int32_t num_tokens = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    const int64_t total = specs[s].num_context + specs[s].num_query;
    ks.emplace_back(total * kstride);
    vs.emplace_back(total * vstride);
    for (float& x : ks.back()) x = dist(rng);
    for (float& x : vs.back()) x = dist(rng);
    for (int64_t p = 0; p < total; ++p) {
      const int64_t slot = int64_t{tables[s][p / block_size]} * block_size + p % block_size;
      std::copy_n(ks[s].begin() + p * kstride, kstride, k_cache.begin() + slot * kstride);
      std::copy_n(vs[s].begin() + p * vstride, vstride, v_cache.begin() + slot * vstride);
    }
    seqs.push_back({num_tokens, specs[s].num_query, specs[s].num_context, tables[s].data()});
    num_tokens += specs[s].num_query;
  }
  const int64_t q_stride = heads * head_dim + 3;  // padded rows
  std::vector<float> q(num_tokens * q_stride);
  for (float& x : q) x = dist(rng);
  std::vector<float> out(num_tokens * heads * v_dim, NAN);
  PagedAttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.v_head_dim = v_dim;
  p.block_size = block_size;
  p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  p.sliding_window = window;
  PagedAttentionCpu(q.data(), q_stride, k_cache.data(), v_cache.data(), seqs.data(),
                    static_cast<int64_t>(seqs.size()), p, out.data());
  const int64_t group = heads / kv_heads;
  for (size_t s = 0; s < specs.size(); ++s) {
    for (int32_t t = 0; t < specs[s].num_query; ++t) {
      const int64_t row = seqs[s].query_start + t;
      const int64_t pos = specs[s].num_context + t;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / group;
        std::vector<double> sc;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j <= pos; ++j) {
          if (window > 0 && !(pos - window < j)) continue;  // transformers: i - w < j <= i
          double d = 0;
          for (int64_t c = 0; c < head_dim; ++c) {
            d += double{q[row * q_stride + h * head_dim + c]} *
                 ks[s][j * kstride + kvh * head_dim + c];
          }
          sc.push_back(d * p.scale);
          keys.push_back(j);
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t c = 0; c < v_dim; ++c) {
          double o = 0;
          for (size_t i = 0; i < keys.size(); ++i) {
            o += sc[i] / sum * vs[s][keys[i] * vstride + kvh * v_dim + c];
          }
          ASSERT_NEAR(out[(row * heads + h) * v_dim + c], o, 2e-5)
              << "seq " << s << " pos " << pos << " head " << h << " ch " << c;
        }
      }
    }
  }
}

TEST(PagedAttentionTest, DecodeSingleSequence) { RunScenario({{20, 1}}, 4, 2, 16, 16, 4, 0, 1); }

TEST(PagedAttentionTest, PrefillFromScratch) { RunScenario({{0, 23}}, 4, 4, 8, 8, 16, 0, 2); }

TEST(PagedAttentionTest, MixedPrefillChunksAndDecodesGqa) {
  RunScenario({{0, 9}, {30, 1}, {14, 7}, {3, 1}}, 8, 2, 16, 12, 4, 0, 3);
}

TEST(PagedAttentionTest, SlidingWindow) {
  RunScenario({{0, 40}, {50, 1}, {17, 7}}, 4, 2, 16, 16, 4, 16, 4);
  RunScenario({{5, 3}}, 2, 1, 64, 64, 16, 1, 5);  // window 1: each query sees only itself
}

TEST(PagedAttentionTest, WindowOneReturnsOwnValue) {
  // With window 1 the output is exactly the query position's own V.
  const int64_t bs = 2;
  const int32_t table[] = {1, 0};
  std::vector<float> k_cache(2 * bs * 4, 0.5f), v_cache(2 * bs * 4);
  for (size_t i = 0; i < v_cache.size(); ++i) v_cache[i] = static_cast<float>(i);
  std::vector<float> q(3 * 4, 1.0f), out(3 * 4);
  PagedSequence seq{0, 3, 0, table};
  PagedAttentionParams p;
  p.num_heads = 1;
  p.num_kv_heads = 1;
  p.head_dim = 4;
  p.v_head_dim = 4;
  p.block_size = bs;
  p.sliding_window = 1;
  PagedAttentionCpu(q.data(), 4, k_cache.data(), v_cache.data(), &seq, 1, p, out.data());
  // Positions 0, 1 live in block 1 (slots 2, 3); position 2 in block 0 (slot 0).
  const int slots[] = {2, 3, 0};
  for (int t = 0; t < 3; ++t) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(out[t * 4 + c], v_cache[slots[t] * 4 + c]);
  }
}

TEST(WriteKvCacheTest, WritesSlotsAndSkipsNegative) {
  const float k[] = {1, 2, 3, 4, 5, 6};       // 3 tokens x 2
  const float v[] = {10, 11, 12, 13, 14, 15};  // 3 tokens x 2, stride 2
  const int64_t slots[] = {3, -1, 0};
  std::vector<float> kc(8, 0.0f), vc(8, 0.0f);
  WriteKvCacheCpu(k, 2, v, 2, slots, 3, 2, 2, kc.data(), vc.data());
  EXPECT_EQ(kc, (std::vector<float>{5, 6, 0, 0, 0, 0, 1, 2}));
  EXPECT_EQ(vc, (std::vector<float>{14, 15, 0, 0, 0, 0, 10, 11}));
}

}  // namespace
}  // namespace sluice::kernels
