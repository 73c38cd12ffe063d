#include "kernels/moe/moe_experts.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/linear/linear.h"

namespace sluice::kernels {
namespace {

struct RandomExperts {
  int64_t hidden, inter;
  std::vector<std::vector<float>> gate_up, down;
  std::vector<MoeExpertWeights> views;
};

RandomExperts MakeExperts(int64_t n, int64_t hidden, int64_t inter, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.1f);
  RandomExperts r{hidden, inter, {}, {}, {}};
  for (int64_t e = 0; e < n; ++e) {
    r.gate_up.emplace_back(2 * inter * hidden);
    r.down.emplace_back(hidden * inter);
    for (float& v : r.gate_up.back()) v = normal(rng);
    for (float& v : r.down.back()) v = normal(rng);
  }
  for (int64_t e = 0; e < n; ++e) r.views.push_back({r.gate_up[e].data(), r.down[e].data()});
  return r;
}

// Naive per-token loop in double precision.
std::vector<double> NaiveMoe(const std::vector<float>& x, int64_t tokens, const RandomExperts& ex,
                             const std::vector<int32_t>& ids, const std::vector<float>& w,
                             int64_t top_k) {
  const int64_t h = ex.hidden, inter = ex.inter;
  std::vector<double> out(tokens * h, 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t e = ids[t * top_k + k];
      std::vector<double> act(inter);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < h; ++c) {
          g += double{ex.gate_up[e][i * h + c]} * x[t * h + c];
          u += double{ex.gate_up[e][(inter + i) * h + c]} * x[t * h + c];
        }
        act[i] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t c = 0; c < h; ++c) {
        double y = 0;
        for (int64_t i = 0; i < inter; ++i) y += double{ex.down[e][c * inter + i]} * act[i];
        out[t * h + c] += w[t * top_k + k] * y;
      }
    }
  }
  return out;
}

TEST(MoeExpertsTest, MatchesNaivePerTokenLoop) {
  std::mt19937 rng(11);
  struct Shape {
    int64_t experts, hidden, inter, top_k, tokens;
  };
  for (const Shape& s : {Shape{8, 64, 32, 2, 1}, Shape{8, 64, 32, 2, 23}, Shape{16, 384, 96, 2, 32},
                         Shape{16, 48, 20, 4, 70}, Shape{4, 33, 17, 1, 9}}) {
    RandomExperts ex = MakeExperts(s.experts, s.hidden, s.inter, rng);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(s.experts) - 1);
    std::vector<float> x(s.tokens * s.hidden), w(s.tokens * s.top_k);
    std::vector<int32_t> ids(s.tokens * s.top_k);
    for (float& v : x) v = normal(rng);
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t k = 0; k < s.top_k; ++k) {
        int32_t e;
        bool dup;
        do {  // distinct experts per token, as a router produces
          e = pick(rng);
          dup = false;
          for (int64_t j = 0; j < k; ++j) dup |= ids[t * s.top_k + j] == e;
        } while (dup);
        ids[t * s.top_k + k] = e;
        w[t * s.top_k + k] = 0.5f + 0.5f * std::abs(normal(rng));
      }
    }
    std::vector<float> out(s.tokens * s.hidden, 123.0f);
    MoeWorkspace ws;
    ASSERT_TRUE(MoeExpertsCpu(x.data(), s.tokens, s.hidden, s.inter, ids.data(), w.data(),
                              s.top_k, ex.views, out.data(), ws)
                    .ok());
    std::vector<double> ref = NaiveMoe(x, s.tokens, ex, ids, w, s.top_k);
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      max_err = std::max(max_err, std::abs(out[i] - ref[i]));
      max_ref = std::max(max_ref, std::abs(ref[i]));
    }
    EXPECT_GT(max_ref, 0.01);
    EXPECT_LT(max_err, 2e-5 * std::max(1.0, max_ref)) << "hidden " << s.hidden;
  }
}

// A token's output is bit-identical alone and inside a batch (LinearCpu is batch invariant and
// the combine order is fixed).
TEST(MoeExpertsTest, BatchInvariant) {
  std::mt19937 rng(5);
  const int64_t experts = 16, hidden = 96, inter = 40, top_k = 2, tokens = 29;
  RandomExperts ex = MakeExperts(experts, hidden, inter, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(tokens * hidden), w(tokens * top_k);
  std::vector<int32_t> ids(tokens * top_k);
  for (float& v : x) v = normal(rng);
  for (int64_t t = 0; t < tokens; ++t) {
    ids[t * 2] = static_cast<int32_t>(t % experts);
    ids[t * 2 + 1] = static_cast<int32_t>((t * 7 + 3) % experts == t % experts ? (t + 1) % experts
                                                                               : (t * 7 + 3) % experts);
    w[t * 2] = 0.7f;
    w[t * 2 + 1] = 1.3f;
  }
  std::vector<float> batch_out(tokens * hidden);
  MoeWorkspace ws;
  ASSERT_TRUE(MoeExpertsCpu(x.data(), tokens, hidden, inter, ids.data(), w.data(), top_k,
                            ex.views, batch_out.data(), ws)
                  .ok());
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> single(hidden);
    ASSERT_TRUE(MoeExpertsCpu(x.data() + t * hidden, 1, hidden, inter, ids.data() + t * top_k,
                              w.data() + t * top_k, top_k, ex.views, single.data(), ws)
                    .ok());
    for (int64_t c = 0; c < hidden; ++c) {
      ASSERT_EQ(single[c], batch_out[t * hidden + c]) << "token " << t << " channel " << c;
    }
  }
}

// Experts stored as bfloat16 give the bits of the same values in float32, with a mix of both
// storages in one call.
TEST(MoeExpertsTest, Bf16ExpertsMatchFloat32Bits) {
  std::mt19937 rng(9);
  const int64_t experts = 6, hidden = 72, inter = 40, top_k = 2, tokens = 7;
  RandomExperts ex = MakeExperts(experts, hidden, inter, rng);
  std::vector<std::vector<uint16_t>> gate_up16(experts), down16(experts);
  for (int64_t e = 0; e < experts; ++e) {
    for (float& v : ex.gate_up[e]) gate_up16[e].push_back(ToBf16(v));
    for (float& v : ex.down[e]) down16[e].push_back(ToBf16(v));
    // The float32 matrices hold the bfloat16 values, widened.
    for (size_t i = 0; i < ex.gate_up[e].size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(gate_up16[e][i]) << 16;
      std::memcpy(&ex.gate_up[e][i], &bits, sizeof(bits));
    }
    for (size_t i = 0; i < ex.down[e].size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(down16[e][i]) << 16;
      std::memcpy(&ex.down[e][i], &bits, sizeof(bits));
    }
  }
  std::vector<MoeExpertWeights> mixed(experts);
  for (int64_t e = 0; e < experts; ++e) {
    if (e % 3 == 0) {
      mixed[e] = ex.views[e];
    } else {
      mixed[e].gate_up_bf16 = gate_up16[e].data();
      if (e % 3 == 1) {
        mixed[e].down_bf16 = down16[e].data();
      } else {
        mixed[e].down = ex.down[e].data();
      }
    }
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(tokens * hidden), w(tokens * top_k);
  std::vector<int32_t> ids(tokens * top_k);
  for (float& v : x) v = normal(rng);
  for (int64_t t = 0; t < tokens; ++t) {
    ids[t * 2] = static_cast<int32_t>(t % experts);
    ids[t * 2 + 1] = static_cast<int32_t>((t + 2) % experts);
    w[t * 2] = 0.6f;
    w[t * 2 + 1] = 0.4f;
  }
  std::vector<float> want(tokens * hidden), got(tokens * hidden);
  MoeWorkspace ws;
  ASSERT_TRUE(MoeExpertsCpu(x.data(), tokens, hidden, inter, ids.data(), w.data(), top_k,
                            ex.views, want.data(), ws)
                  .ok());
  ASSERT_TRUE(MoeExpertsCpu(x.data(), tokens, hidden, inter, ids.data(), w.data(), top_k, mixed,
                            got.data(), ws)
                  .ok());
  for (int64_t i = 0; i < tokens * hidden; ++i) ASSERT_EQ(want[i], got[i]) << i;

  // A matrix with both storages, or neither, is refused.
  mixed[1].gate_up = ex.gate_up[1].data();
  absl::Status both = MoeExpertsCpu(x.data(), tokens, hidden, inter, ids.data(), w.data(), top_k,
                                    mixed, got.data(), ws);
  EXPECT_EQ(both.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(both.message().find("expert 1"), std::string::npos) << both.message();
  mixed[1] = MoeExpertWeights{};
  EXPECT_EQ(MoeExpertsCpu(x.data(), tokens, hidden, inter, ids.data(), w.data(), top_k, mixed,
                          got.data(), ws)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MoeExpertsTest, RejectsExpertIdOutOfRange) {
  std::mt19937 rng(3);
  RandomExperts ex = MakeExperts(4, 16, 8, rng);
  std::vector<float> x(16, 1.0f), out(16);
  const int32_t ids[2] = {1, 4};
  const float w[2] = {1.0f, 1.0f};
  MoeWorkspace ws;
  absl::Status s = MoeExpertsCpu(x.data(), 1, 16, 8, ids, w, 2, ex.views, out.data(), ws);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expert 4"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace sluice::kernels
