// The MLA plumbing kernels (mla_plumbing_cuda.h) against their CPU references (mla_plumbing.h)
// on random bf16 inputs: the prologue and the absorbed query (separate and in one launch) within
// bf16 rounding, the MHA form's gather and K/V assembly and the layout helpers exactly.
// Needs a GPU: part of kernels_cuda_test, skipped without a device.
#include "kernels/mla_attention/mla_plumbing_cuda.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla_attention/mla_plumbing.h"
#include "kernels/rope/rope.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

// bf16 outputs computed in fp32: one rounding, plus fp32 summation order for the GEMV.
constexpr double kRtol = 1.0 / 128;
constexpr double kAtol = 1.0 / 256;

struct Dims {
  int64_t heads, R, dr, dn;
};

// The prologue (cache rows, rotated query channels) and the absorbed query of T tokens, each
// through MlaPrologueCuda + MlaAbsorbQueryCuda and through MlaPrologueAbsorbCuda, against the
// CPU references; rows of unused cache slots stay NaN; a token with slot -1 writes no row.
void CheckPrologueAndAbsorb(const std::string& name, const Dims& d, int64_t T, bool interleave) {
  SCOPED_TRACE(absl::StrCat(name, " T=", T, interleave ? " interleaved" : ""));
  auto rng = cuda_test::Rng();
  const int64_t W = d.R + d.dr, qk = d.dn + d.dr, slots_n = 2 * T + 3;
  RopeParams rp;
  rp.rotary_dim = d.dr;
  auto table = MakeRopeTable(rp);
  ASSERT_TRUE(table.ok()) << table.status();
  const auto kv = RandomBf16(static_cast<size_t>(T * W), rng, -2.0f, 2.0f);
  const auto kv_norm = RandomBf16(static_cast<size_t>(d.R), rng, 0.5f, 1.5f);
  const auto q = RandomBf16(static_cast<size_t>(T * d.heads * qk), rng, -1.0f, 1.0f);
  const auto w = RandomBf16(static_cast<size_t>(d.heads * d.dn * d.R), rng, -0.1f, 0.1f);
  std::vector<int32_t> pos(T);
  std::vector<int64_t> slots(T);
  for (int64_t t = 0; t < T; ++t) {
    pos[t] = static_cast<int32_t>(7 * t + 3);
    slots[t] = t == 1 ? -1 : 2 * t + 1;
  }
  // CPU references.
  const auto kv_f = ToFloat(kv), norm_f = ToFloat(kv_norm), q_f = ToFloat(q), w_f = ToFloat(w);
  std::vector<float> want_cache(static_cast<size_t>(slots_n * W), std::nanf(""));
  std::vector<float> want_qpe(static_cast<size_t>(T * d.heads * d.dr));
  MlaPrologueCpuArgs c;
  c.kv = kv_f.data();
  c.kv_stride = W;
  c.kv_norm = norm_f.data();
  c.eps = 1e-6f;
  c.q_pe = q_f.data() + d.dn;
  c.q_token_stride = d.heads * qk;
  c.q_head_stride = qk;
  c.q_out = want_qpe.data();
  c.q_out_token_stride = d.heads * d.dr;
  c.q_out_head_stride = d.dr;
  c.heads = d.heads;
  c.R = d.R;
  c.dr = d.dr;
  c.positions = pos.data();
  c.slots = slots.data();
  c.rope = &*table;
  c.interleave = interleave;
  c.cache = want_cache.data();
  MlaPrologueCpu(c, T);
  std::vector<float> want_abs(static_cast<size_t>(T * d.heads * d.R));
  MlaAbsorbQueryCpu(q_f.data(), d.heads * qk, qk, w_f.data(), d.dn * d.R, want_abs.data(),
                    d.heads * d.R, d.R, T, d.heads, d.dn, d.R);

  auto d_kv = Upload(kv), d_norm = Upload(kv_norm), d_q = Upload(q), d_w = Upload(w);
  auto d_pos = Upload(pos);
  auto d_slots = Upload(slots);
  auto d_inv = Upload(table->inv_freq);
  for (const bool merged : {false, true}) {
    SCOPED_TRACE(merged ? "MlaPrologueAbsorbCuda" : "MlaPrologueCuda + MlaAbsorbQueryCuda");
    auto d_cache = NanBuffer(static_cast<size_t>(slots_n * W));
    auto d_qpe = NanBuffer(static_cast<size_t>(T * d.heads * d.dr));
    auto d_abs = NanBuffer(static_cast<size_t>(T * d.heads * d.R));
    MlaPrologueArgs a;
    a.kv = d_kv.data();
    a.kv_stride = W;
    a.kv_norm = d_norm.data();
    a.eps = 1e-6f;
    a.q_pe = d_q.data() + d.dn;
    a.q_token_stride = d.heads * qk;
    a.q_head_stride = qk;
    a.q_out = d_qpe.data();
    a.q_out_token_stride = d.heads * d.dr;
    a.q_out_head_stride = d.dr;
    a.heads = d.heads;
    a.R = d.R;
    a.dr = d.dr;
    a.positions = d_pos.data();
    a.slots = d_slots.data();
    a.inv_freq = d_inv.data();
    a.scaling = table->attention_scaling;
    a.interleave = interleave;
    a.cache = d_cache.data();
    if (merged) {
      ASSERT_TRUE(MlaPrologueAbsorbCuda(a, d_q.data(), d.heads * qk, qk, d_w.data(), d.dn * d.R,
                                        d_abs.data(), d.heads * d.R, d.R, T, d.heads, d.dn, d.R,
                                        nullptr)
                      .ok());
    } else {
      ASSERT_TRUE(MlaPrologueCuda(a, T, nullptr).ok());
      ASSERT_TRUE(MlaAbsorbQueryCuda(d_q.data(), d.heads * qk, qk, d_w.data(), d.dn * d.R,
                                     d_abs.data(), d.heads * d.R, d.R, T, d.heads, d.dn, d.R,
                                     nullptr)
                      .ok());
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> cache = Download(d_cache);
    std::vector<float> got_rows, want_rows;
    for (int64_t slot = 0; slot < slots_n; ++slot) {
      const bool written = !std::isnan(want_cache[slot * W]);
      for (int64_t i = 0; i < W; ++i) {
        if (written) {
          got_rows.push_back(cache[slot * W + i]);
          want_rows.push_back(want_cache[slot * W + i]);
        } else {
          ASSERT_TRUE(std::isnan(cache[slot * W + i])) << "slot " << slot << " written";
        }
      }
    }
    ExpectClose("cache rows", got_rows, want_rows, kRtol, kAtol);
    ExpectClose("query rope channels", Download(d_qpe), want_qpe, kRtol, kAtol);
    ExpectClose("absorbed query", Download(d_abs), want_abs, kRtol, kAtol);
  }
}

TEST(MlaPlumbingCudaTest, PrologueAndAbsorbMatchCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  const Dims v2lite{16, 512, 64, 128};
  const Dims tiny{4, 32, 8, 16};
  for (const int64_t T : {int64_t{1}, int64_t{3}, kMlaAbsorbMaxTokens}) {
    for (const bool interleave : {false, true}) {
      CheckPrologueAndAbsorb("v2-lite dims", v2lite, T, interleave);
      CheckPrologueAndAbsorb("tiny dims", tiny, T, interleave);
    }
  }
}

// The MHA form's gather (two sequences over scattered blocks, rows past each length zeroed)
// and K/V assembly, and the layout helpers: exact copies of the CPU references' values.
TEST(MlaPlumbingCudaTest, GatherAssembleAndHelpersMatchCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const Dims& d : {Dims{16, 512, 64, 128}, Dims{2, 6, 2, 3}}) {
    SCOPED_TRACE(absl::StrCat("R=", d.R, " dr=", d.dr));
    const int64_t W = d.R + d.dr, bs = 4, blocks = 12, bps = 5, rows_per_seq = bps * bs;
    const int64_t dv = d.dn + 1;
    const auto cache = RandomBf16(static_cast<size_t>(blocks * bs * W), rng, -1.0f, 1.0f);
    const std::vector<int32_t> ctx = {5, 0}, qsl = {0, 3, 20};
    const std::vector<int32_t> tables = {11, 2, 7, 0, 0, /*seq 1*/ 1, 3, 5, 9, 10};
    const int64_t rows = 2 * rows_per_seq;
    std::vector<float> want_c(static_cast<size_t>(rows * d.R)), want_p(static_cast<size_t>(rows * d.dr));
    const auto cache_f = ToFloat(cache);
    MlaGatherLatentCpu(cache_f.data(), d.R, d.dr, ctx.data(), qsl.data(), tables.data(), bps, bs,
                       2, rows_per_seq, want_c.data(), want_p.data());
    auto d_cache = Upload(cache);
    auto d_ctx = Upload(ctx), d_qsl = Upload(qsl), d_tables = Upload(tables);
    auto d_c = NanBuffer(static_cast<size_t>(rows * d.R));
    auto d_p = NanBuffer(static_cast<size_t>(rows * d.dr));
    ASSERT_TRUE(MlaGatherLatentCuda(d_cache.data(), d.R, d.dr, d_ctx.data(), d_qsl.data(),
                                    d_tables.data(), bps, bs, 2, rows_per_seq, d_c.data(),
                                    d_p.data(), nullptr)
                    .ok());
    EXPECT_EQ(Download(d_c), want_c);
    EXPECT_EQ(Download(d_p), want_p);

    const int64_t r = 7;
    const auto kv_up = RandomBf16(static_cast<size_t>(r * d.heads * (d.dn + dv)), rng, -1.0f, 1.0f);
    const auto k_pe = RandomBf16(static_cast<size_t>(r * d.dr), rng, -1.0f, 1.0f);
    std::vector<float> want_k(static_cast<size_t>(r * d.heads * (d.dn + d.dr)));
    std::vector<float> want_v(static_cast<size_t>(r * d.heads * dv));
    const auto up_f = ToFloat(kv_up), pe_f = ToFloat(k_pe);
    MlaAssembleKvCpu(up_f.data(), pe_f.data(), r, d.heads, d.dn, d.dr, dv, want_k.data(),
                     want_v.data());
    auto d_up = Upload(kv_up), d_pe = Upload(k_pe);
    auto d_k = NanBuffer(want_k.size()), d_v = NanBuffer(want_v.size());
    ASSERT_TRUE(MlaAssembleKvCuda(d_up.data(), d_pe.data(), r, d.heads, d.dn, d.dr, dv,
                                  d_k.data(), d_v.data(), nullptr)
                    .ok());
    EXPECT_EQ(Download(d_k), want_k);
    EXPECT_EQ(Download(d_v), want_v);
  }
  // CopyHeadsCuda: 3 tokens × 2 heads × 5 channels out of wider rows; AddInPlaceCuda: one bf16
  // rounding of the fp32 sum.
  const auto src = RandomBf16(3 * 16, rng, -1.0f, 1.0f);
  auto d_src = Upload(src);
  auto d_dst = NanBuffer(3 * 12);
  ASSERT_TRUE(CopyHeadsCuda(d_src.data() + 1, {16, 7}, d_dst.data(), {12, 6}, 3, 2, 5, nullptr)
                  .ok());
  const std::vector<float> dst = Download(d_dst), src_f = ToFloat(src);
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 6; ++i) {
        const float got = dst[t * 12 + h * 6 + i];
        if (i < 5) {
          EXPECT_EQ(got, src_f[t * 16 + 1 + h * 7 + i]) << t << " " << h << " " << i;
        } else {
          EXPECT_TRUE(std::isnan(got)) << "past the width: " << t << " " << h;
        }
      }
    }
  }
  const auto x = RandomBf16(1000, rng, -1.0f, 1.0f), y = RandomBf16(1000, rng, -1.0f, 1.0f);
  auto d_x = Upload(x), d_y = Upload(y);
  ASSERT_TRUE(AddInPlaceCuda(d_y.data(), d_x.data(), 1000, nullptr).ok());
  const std::vector<float> sum = Download(d_y), x_f = ToFloat(x), y_f = ToFloat(y);
  for (size_t i = 0; i < sum.size(); ++i) {
    ASSERT_EQ(sum[i], Bf16ToFloat(FloatToBf16(x_f[i] + y_f[i]))) << i;
  }
}

}  // namespace
}  // namespace sluice::kernels
