#include "kernels/mla_attention/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

struct SeqPlan {
  int32_t num_context_tokens;
  int32_t num_query_tokens;
};

struct Problem {
  MlaDims dims;
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  std::vector<float> cache;                    // [num_blocks, block_size, R + dr]
  std::vector<float> w_kv_b;                   // [H, dn + dv, R]
  std::vector<float> q;                        // [T, H, dn + dr]
  std::vector<std::vector<int32_t>> tables;    // per sequence
  std::vector<MlaSequence> sequences;
  int64_t num_tokens = 0;
};

Problem MakeProblem(const MlaDims& dims, int64_t block_size, const std::vector<SeqPlan>& plans,
                    std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p;
  p.dims = dims;
  p.block_size = block_size;
  int64_t blocks_needed = 0;
  for (const SeqPlan& s : plans) {
    blocks_needed += (s.num_context_tokens + s.num_query_tokens + block_size - 1) / block_size;
  }
  p.num_blocks = blocks_needed + 3;  // spare blocks hold garbage that must not be read
  p.cache.resize(p.num_blocks * block_size * dims.LatentWidth());
  for (float& v : p.cache) v = normal(rng);
  const int64_t rows = dims.num_heads * (dims.qk_nope_head_dim + dims.v_head_dim);
  p.w_kv_b.resize(rows * dims.kv_lora_rank);
  for (float& v : p.w_kv_b) v = 0.2f * normal(rng);
  std::vector<int32_t> free_blocks(p.num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  size_t next = 0;
  for (const SeqPlan& s : plans) {
    const int64_t n = (s.num_context_tokens + s.num_query_tokens + block_size - 1) / block_size;
    p.tables.emplace_back(free_blocks.begin() + next, free_blocks.begin() + next + n);
    next += n;
  }
  int32_t start = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    MlaSequence seq;
    seq.query_start = start;
    seq.num_query_tokens = plans[i].num_query_tokens;
    seq.num_context_tokens = plans[i].num_context_tokens;
    seq.block_table = p.tables[i];
    p.sequences.push_back(seq);
    start += plans[i].num_query_tokens;
  }
  p.num_tokens = start;
  p.q.resize(p.num_tokens * dims.num_heads * (dims.qk_nope_head_dim + dims.qk_rope_head_dim));
  for (float& v : p.q) v = normal(rng);
  return p;
}

// Naive MLA: expands per-head keys [W_UK·c, k_pe] and values W_UV·c for every cached token and
// runs standard softmax attention, in double precision.
std::vector<double> NaiveMla(const Problem& p) {
  const MlaDims& d = p.dims;
  const int64_t H = d.num_heads, R = d.kv_lora_rank, dn = d.qk_nope_head_dim,
                dr = d.qk_rope_head_dim, dv = d.v_head_dim, W = d.LatentWidth();
  std::vector<double> out(p.num_tokens * H * dv, 0.0);
  for (const MlaSequence& s : p.sequences) {
    for (int32_t i = 0; i < s.num_query_tokens; ++i) {
      const int64_t t = s.query_start + i;
      const int64_t num_keys = s.num_context_tokens + i + 1;
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = p.q.data() + (t * H + h) * (dn + dr);
        std::vector<double> scores(num_keys);
        std::vector<std::vector<double>> values(num_keys, std::vector<double>(dv));
        for (int64_t j = 0; j < num_keys; ++j) {
          const int64_t slot = s.block_table[j / p.block_size] * p.block_size + j % p.block_size;
          const float* c = p.cache.data() + slot * W;
          double score = 0;
          for (int64_t a = 0; a < dn; ++a) {
            double k = 0;
            for (int64_t r = 0; r < R; ++r) k += double{p.w_kv_b[(h * (dn + dv) + a) * R + r]} * c[r];
            score += qh[a] * k;
          }
          for (int64_t a = 0; a < dr; ++a) score += double{qh[dn + a]} * c[R + a];
          scores[j] = score * d.softmax_scale;
          for (int64_t v = 0; v < dv; ++v) {
            double val = 0;
            for (int64_t r = 0; r < R; ++r) {
              val += double{p.w_kv_b[(h * (dn + dv) + dn + v) * R + r]} * c[r];
            }
            values[j][v] = val;
          }
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double& sc : scores) sum += sc = std::exp(sc - mx);
        for (int64_t j = 0; j < num_keys; ++j) {
          for (int64_t v = 0; v < dv; ++v) {
            out[(t * H + h) * dv + v] += scores[j] / sum * values[j][v];
          }
        }
      }
    }
  }
  return out;
}

std::vector<float> RunMla(const Problem& p, absl::Span<const MlaSequence> seqs, int64_t tokens,
                          const float* q) {
  std::vector<float> out(tokens * p.dims.num_heads * p.dims.v_head_dim, -7.0f);
  MlaPagedCache cache{const_cast<float*>(p.cache.data()), p.num_blocks, p.block_size};
  const int64_t stride = p.dims.num_heads * (p.dims.qk_nope_head_dim + p.dims.qk_rope_head_dim);
  absl::Status s = MlaAttentionCpu(q, stride, p.w_kv_b.data(), seqs, p.dims, cache, out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

MlaDims TinyDims() {  // deepseek-v3-tiny
  return MlaDims{4, 32, 16, 8, 16, 1.0f / std::sqrt(24.0f)};
}
MlaDims MiniDims() {  // sluice-mini-moe
  return MlaDims{6, 128, 32, 32, 32, 0.125f};
}

TEST(MlaAttentionTest, AbsorbedMatchesExpandedReference) {
  std::mt19937 rng(1);
  const std::vector<SeqPlan> plans = {{0, 7}, {10, 1}, {5, 3}, {33, 1}, {16, 16}};
  for (const MlaDims& dims : {TinyDims(), MiniDims()}) {
    for (int64_t block_size : {1, 4, 16}) {
      Problem p = MakeProblem(dims, block_size, plans, rng);
      std::vector<float> out = RunMla(p, p.sequences, p.num_tokens, p.q.data());
      std::vector<double> ref = NaiveMla(p);
      double max_err = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        max_err = std::max(max_err, std::abs(out[i] - ref[i]));
      }
      EXPECT_LT(max_err, 2e-5) << "heads " << dims.num_heads << " block " << block_size;
    }
  }
}

// A YaRN-style scale (≠ 1/sqrt(d)) and decode over a long context.
TEST(MlaAttentionTest, LongContextDecodeWithScaledSoftmax) {
  std::mt19937 rng(2);
  MlaDims dims = MiniDims();
  dims.softmax_scale = 0.125f * 1.3f * 1.3f;
  Problem p = MakeProblem(dims, 16, {{700, 1}, {129, 1}}, rng);
  std::vector<float> out = RunMla(p, p.sequences, p.num_tokens, p.q.data());
  std::vector<double> ref = NaiveMla(p);
  double max_err = 0;
  for (size_t i = 0; i < out.size(); ++i) max_err = std::max(max_err, std::abs(out[i] - ref[i]));
  EXPECT_LT(max_err, 2e-5);
}

// A sequence's output is bit-identical run alone and batched with others.
TEST(MlaAttentionTest, BatchInvariant) {
  std::mt19937 rng(3);
  Problem p = MakeProblem(MiniDims(), 4, {{3, 5}, {20, 1}, {0, 9}}, rng);
  std::vector<float> batched = RunMla(p, p.sequences, p.num_tokens, p.q.data());
  const int64_t per_token = p.dims.num_heads * p.dims.v_head_dim;
  const int64_t q_stride = p.dims.num_heads * (p.dims.qk_nope_head_dim + p.dims.qk_rope_head_dim);
  for (const MlaSequence& s : p.sequences) {
    MlaSequence alone = s;
    alone.query_start = 0;
    std::vector<float> single =
        RunMla(p, {alone}, s.num_query_tokens, p.q.data() + s.query_start * q_stride);
    for (int64_t i = 0; i < s.num_query_tokens * per_token; ++i) {
      ASSERT_EQ(single[i], batched[s.query_start * per_token + i]) << i;
    }
  }
}

// A speculative verify step (k + 1 query tokens of one sequence, attended in groups that share
// the cached rows' loads) gives each token the bits of a decode step of that token alone: 1..13
// query tokens cover every group size and the balanced splits (7 = 4 + 3, 13 = 5 + 4 + 4).
TEST(MlaAttentionTest, QueryTokensMatchOneTokenSteps) {
  std::mt19937 rng(4);
  std::vector<SeqPlan> plans;
  for (int32_t q = 1; q <= 13; ++q) plans.push_back({static_cast<int32_t>(3 * q + 2), q});
  for (int64_t block_size : {1, 16}) {
    Problem p = MakeProblem(MiniDims(), block_size, plans, rng);
    std::vector<float> batched = RunMla(p, p.sequences, p.num_tokens, p.q.data());
    const int64_t per_token = p.dims.num_heads * p.dims.v_head_dim;
    const int64_t q_stride =
        p.dims.num_heads * (p.dims.qk_nope_head_dim + p.dims.qk_rope_head_dim);
    for (const MlaSequence& s : p.sequences) {
      for (int32_t i = 0; i < s.num_query_tokens; ++i) {
        MlaSequence step = s;
        step.query_start = 0;
        step.num_context_tokens = s.num_context_tokens + i;
        step.num_query_tokens = 1;
        const int64_t t = s.query_start + i;
        std::vector<float> single = RunMla(p, {step}, 1, p.q.data() + t * q_stride);
        for (int64_t e = 0; e < per_token; ++e) {
          ASSERT_EQ(single[e], batched[t * per_token + e])
              << "sequence of " << s.num_query_tokens << " query tokens, token " << i
              << ", block size " << block_size;
        }
      }
    }
  }
}

TEST(MlaAttentionTest, WriteCachePlacesEntriesAtSlots) {
  const MlaDims dims = TinyDims();
  const int64_t width = dims.LatentWidth();
  std::vector<float> cache(4 * 2 * width, 0.0f);
  std::vector<float> latent(2 * width);
  std::iota(latent.begin(), latent.end(), 1.0f);
  const int64_t slots[2] = {5, 0};
  ASSERT_TRUE(MlaWriteCacheCpu(latent.data(), slots, 2, dims, {cache.data(), 4, 2}).ok());
  EXPECT_EQ(cache[5 * width], 1.0f);
  EXPECT_EQ(cache[5 * width + width - 1], static_cast<float>(width));
  EXPECT_EQ(cache[0], static_cast<float>(width + 1));
  EXPECT_EQ(cache[1 * width], 0.0f);
  const int64_t bad[1] = {8};
  EXPECT_EQ(MlaWriteCacheCpu(latent.data(), bad, 1, dims, {cache.data(), 4, 2}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MlaAttentionTest, RejectsShortBlockTableAndBadBlockId) {
  std::mt19937 rng(4);
  Problem p = MakeProblem(TinyDims(), 4, {{6, 3}}, rng);
  std::vector<float> out(3 * 4 * 16);
  MlaPagedCache cache{p.cache.data(), p.num_blocks, p.block_size};
  const int64_t stride = 4 * 24;
  MlaSequence s = p.sequences[0];
  std::vector<int32_t> short_table = {p.tables[0][0], p.tables[0][1]};  // 8 < 9 tokens
  s.block_table = short_table;
  EXPECT_EQ(MlaAttentionCpu(p.q.data(), stride, p.w_kv_b.data(), {s}, p.dims, cache, out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> bad_table = {0, 1, static_cast<int32_t>(p.num_blocks)};
  s.block_table = bad_table;
  EXPECT_EQ(MlaAttentionCpu(p.q.data(), stride, p.w_kv_b.data(), {s}, p.dims, cache, out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
