// The MLA plumbing CPU references (mla_plumbing.h) on small hand-worked cases.
#include "kernels/mla_attention/mla_plumbing.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

// RoPE table with one frequency (rotary_dim 2): angle = position · 1.
RopeTable UnitRope() {
  RopeTable t;
  t.inv_freq = {1.0f};
  return t;
}

// c_kv = [3, 4]: mean square 12.5; norm weights [1, 2]; k_pe [1, 0] at position 1 rotates to
// [cos 1, sin 1]; two query heads' rope channels rotate alike; slot 2 of a 4-slot cache is
// written, the rest untouched; a token with slot -1 writes no cache row but its queries.
TEST(MlaPlumbingCpuTest, PrologueNormsRotatesAndWritesTheSlot) {
  const RopeTable rope = UnitRope();
  const std::vector<float> kv = {3, 4, 1, 0, /*token 1*/ 0, 5, 0, 2};
  const std::vector<float> kv_norm = {1, 2};
  const std::vector<float> q_pe = {1, 0, 0, 1, /*token 1*/ 2, 0, 0, 0};  // [2 tokens, 2 heads, 2]
  std::vector<float> q_out(8, -7.0f);
  std::vector<float> cache(4 * 4, -9.0f);
  const std::vector<int32_t> pos = {1, 0};
  const std::vector<int64_t> slots = {2, -1};
  MlaPrologueCpuArgs a;
  a.kv = kv.data();
  a.kv_stride = 4;
  a.kv_norm = kv_norm.data();
  a.eps = 0.0f;
  a.q_pe = q_pe.data();
  a.q_token_stride = 4;
  a.q_head_stride = 2;
  a.q_out = q_out.data();
  a.q_out_token_stride = 4;
  a.q_out_head_stride = 2;
  a.heads = 2;
  a.R = 2;
  a.dr = 2;
  a.positions = pos.data();
  a.slots = slots.data();
  a.rope = &rope;
  a.cache = cache.data();
  MlaPrologueCpu(a, 2);
  const float inv = 1.0f / std::sqrt(12.5f);
  const float c = std::cos(1.0f), s = std::sin(1.0f);
  const std::vector<float> want_cache = {-9, -9, -9, -9, -9, -9, -9, -9,
                                         3 * inv, 4 * inv * 2, c, s, -9, -9, -9, -9};
  for (size_t i = 0; i < cache.size(); ++i) EXPECT_FLOAT_EQ(cache[i], want_cache[i]) << i;
  // Token 0 (position 1): [1, 0] → [cos, sin]; [0, 1] → [-sin, cos]. Token 1 (position 0): as is.
  const std::vector<float> want_q = {c, s, -s, c, 2, 0, 0, 0};
  for (size_t i = 0; i < q_out.size(); ++i) EXPECT_FLOAT_EQ(q_out[i], want_q[i]) << i;
}

// Two heads, dn 2, R 3: out[h, r] = Σ_d q[h, d] · w[h, d, r], with padded strides.
TEST(MlaPlumbingCpuTest, AbsorbQuery) {
  const std::vector<float> q = {1, 2, 0, /*head 1*/ -1, 3, 0};  // head stride 3
  const std::vector<float> w = {1, 0, 2, 0, 1, 1, 99,            // head 0: [2, 3] + pad
                                2, 2, 2, 1, 0, -1, 99};          // head 1
  std::vector<float> out(2 * 4, -5.0f);                          // head stride 4
  MlaAbsorbQueryCpu(q.data(), 6, 3, w.data(), 7, out.data(), 8, 4, 1, 2, 2, 3);
  const std::vector<float> want = {1, 2, 4, -5, /*head 1*/ 1, -2, -5, -5};
  EXPECT_EQ(out, want);
}

// Block size 2; sequence 0: 1 cached row + 2 new tokens over blocks {3, 1} (slots 6, 7, 2);
// sequence 1: 1 row in block 0 (slot 0); 4 rows per sequence, the rest zeros.
TEST(MlaPlumbingCpuTest, GatherLatent) {
  std::vector<float> cache(8 * 3);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<float>(i);  // slot k: 3k..
  const std::vector<int32_t> ctx = {1, 0}, qsl = {0, 2, 3}, tables = {3, 1, 0, 0};
  std::vector<float> kv_c(8 * 2, -1.0f), k_pe(8, -1.0f);
  MlaGatherLatentCpu(cache.data(), 2, 1, ctx.data(), qsl.data(), tables.data(), 2, 2, 2, 4,
                     kv_c.data(), k_pe.data());
  const std::vector<float> want_c = {18, 19, 21, 22, 6, 7, 0, 0, /*seq 1*/ 0, 1, 0, 0, 0, 0, 0, 0};
  const std::vector<float> want_p = {20, 23, 8, 0, /*seq 1*/ 2, 0, 0, 0};
  EXPECT_EQ(kv_c, want_c);
  EXPECT_EQ(k_pe, want_p);
}

// One row, two heads, dn 2, dr 1, dv 1: K = [k_nope_h, k_pe], V = v_h.
TEST(MlaPlumbingCpuTest, AssembleKv) {
  const std::vector<float> kv_up = {1, 2, 3, /*head 1*/ 4, 5, 6};
  const std::vector<float> k_pe = {9};
  std::vector<float> k(6), v(2);
  MlaAssembleKvCpu(kv_up.data(), k_pe.data(), 1, 2, 2, 1, 1, k.data(), v.data());
  EXPECT_EQ(k, (std::vector<float>{1, 2, 9, 4, 5, 9}));
  EXPECT_EQ(v, (std::vector<float>{3, 6}));
}

}  // namespace
}  // namespace sluice::kernels
