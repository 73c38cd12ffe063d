// MlaLatentAttentionCuda against MlaAttentionCpu (mla_attention.h) on fresh random inputs:
// the test absorbs W_UK into the query on the host (rounded to bf16 as the engine's GEMM
// would), runs the CUDA latent attention, applies W_UV on the host and compares with the CPU
// reference's full MLA output. Unowned cache blocks hold NaN, so a wrong block read shows up.
// Needs a GPU: part of kernels_cuda_test, skipped without a device.
#include "kernels/mla_attention/mla_attention_cuda.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla_attention/mla_attention.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::Upload;

constexpr double kRtol = 1.0 / 64;  // bf16 q_latent, probabilities and latent output
constexpr double kAtol = 1.0 / 128;

struct Seq {
  int32_t context, query;
};

MlaDims Dims(int64_t heads, int64_t rank, int64_t rope, int64_t nope, int64_t v) {
  MlaDims d;
  d.num_heads = heads;
  d.kv_lora_rank = rank;
  d.qk_rope_head_dim = rope;
  d.qk_nope_head_dim = nope;
  d.v_head_dim = v;
  d.softmax_scale = 1.0f / std::sqrt(static_cast<float>(nope + rope));
  return d;
}

// pdl_bits: MlaLatentAttentionVUpCuda's programmatic-dependent-launch pieces.
void RunCase(const std::string& name, const MlaDims& d, int64_t block_size,
             const std::vector<Seq>& seqs, std::mt19937& rng, int pdl_bits = 0) {
  SCOPED_TRACE(name);
  const int64_t H = d.num_heads, R = d.kv_lora_rank, dn = d.qk_nope_head_dim,
                dr = d.qk_rope_head_dim, dv = d.v_head_dim, W = d.LatentWidth();
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto bf = [](float x) { return Bf16ToFloat(FloatToBf16(x)); };

  int64_t tokens = 0, max_query = 0, max_seq = 0, max_blocks = 1, used_blocks = 0;
  for (const Seq& s : seqs) {
    tokens += s.query;
    max_query = std::max<int64_t>(max_query, s.query);
    max_seq = std::max<int64_t>(max_seq, s.context + s.query);
    const int64_t nb = (s.context + s.query + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, nb);
    used_blocks += nb;
  }
  const int64_t num_blocks = 2 * used_blocks + 2;
  std::vector<int32_t> physical(static_cast<size_t>(num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  std::vector<float> cache(static_cast<size_t>(num_blocks * block_size * W),
                           std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> tables(seqs.size() * static_cast<size_t>(max_blocks), 0);
  std::vector<int32_t> starts(seqs.size() + 1, 0), ctx(seqs.size());
  std::vector<MlaSequence> cpu_seqs(seqs.size());
  size_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t len = seqs[s].context + seqs[s].query;
    const int64_t nb = (len + block_size - 1) / block_size;
    int32_t* row = tables.data() + s * max_blocks;
    for (int64_t b = 0; b < nb; ++b) row[b] = physical[next++];
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t slot = int64_t{row[pos / block_size]} * block_size + pos % block_size;
      for (int64_t i = 0; i < W; ++i) cache[slot * W + i] = bf(unit(rng));
    }
    starts[s + 1] = starts[s] + seqs[s].query;
    ctx[s] = seqs[s].context;
    cpu_seqs[s].query_start = starts[s];
    cpu_seqs[s].num_query_tokens = seqs[s].query;
    cpu_seqs[s].num_context_tokens = seqs[s].context;
    cpu_seqs[s].block_table = absl::MakeConstSpan(row, static_cast<size_t>(nb));
  }
  std::vector<float> w(static_cast<size_t>(H * (dn + dv) * R));
  for (float& x : w) x = bf(0.1f * unit(rng));
  std::vector<float> q(static_cast<size_t>(tokens * H * (dn + dr)));
  for (float& x : q) x = bf(unit(rng));

  std::vector<float> want(static_cast<size_t>(tokens * H * dv));
  MlaPagedCache cpu_cache{cache.data(), num_blocks, block_size};
  ASSERT_TRUE(
      MlaAttentionCpu(q.data(), H * (dn + dr), w.data(), cpu_seqs, d, cpu_cache, want.data()).ok());

  // Absorbed query [q_lat = W_UKᵀ·q_nope, q_pe] in bf16.
  std::vector<bf16> q_latent(static_cast<size_t>(tokens * H * W));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.data() + (t * H + h) * (dn + dr);
      bf16* dst = q_latent.data() + (t * H + h) * W;
      for (int64_t r = 0; r < R; ++r) {
        float acc = 0.0f;
        for (int64_t a = 0; a < dn; ++a) acc += w[(h * (dn + dv) + a) * R + r] * qh[a];
        dst[r] = FloatToBf16(acc);
      }
      for (int64_t a = 0; a < dr; ++a) dst[R + a] = FloatToBf16(qh[dn + a]);
    }
  }
  std::vector<bf16> cache_bf(cache.size());
  for (size_t i = 0; i < cache.size(); ++i) cache_bf[i] = FloatToBf16(cache[i]);

  auto d_q = Upload(q_latent);
  auto d_cache = Upload(cache_bf);
  auto d_starts = Upload(starts);
  auto d_ctx = Upload(ctx);
  auto d_tables = Upload(tables);
  auto d_out = NanBuffer(static_cast<size_t>(tokens * H * R));
  PagedAttentionCudaBatch batch;
  batch.query_start_loc = d_starts.data();
  batch.context_lens = d_ctx.data();
  batch.block_tables = d_tables.data();
  batch.max_blocks_per_seq = max_blocks;
  batch.num_sequences = static_cast<int64_t>(seqs.size());
  batch.num_tokens = tokens;
  batch.max_query_len = max_query;
  batch.max_seq_len = max_seq;
  const size_t ws_bytes = MlaLatentAttentionCudaWorkspaceBytes(batch, d);
  auto ws = DeviceBuffer<uint8_t>::Create(ws_bytes);
  ASSERT_TRUE(ws.ok()) << ws.status();
  const absl::Status st = MlaLatentAttentionCuda(d_q.data(), H * W, d_cache.data(), block_size,
                                                 batch, d, ws->data(), d_out.data(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
  const std::vector<float> latent = Download(d_out);
  for (float x : latent) ASSERT_TRUE(std::isfinite(x)) << "unwritten or NaN latent output";

  std::vector<float> got(want.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* o = latent.data() + (t * H + h) * R;
      for (int64_t v = 0; v < dv; ++v) {
        const float* wv = w.data() + (h * (dn + dv) + dn + v) * R;
        float acc = 0.0f;
        for (int64_t r = 0; r < R; ++r) acc += wv[r] * o[r];
        got[(t * H + h) * dv + v] = acc;
      }
    }
  }
  ExpectClose(absl::StrCat(name, " (workspace ", ws_bytes, " B)"), got, want, kRtol, kAtol);

  // MlaLatentAttentionVUpCuda (combine and W_UV in one launch) into NaN-filled outputs with a
  // padded token stride: every head's values against the CPU reference, the padding untouched;
  // a second launch (same workspace, fresh outputs) gives the same bits.
  std::vector<bf16> w_bf(w.size());
  for (size_t i = 0; i < w.size(); ++i) w_bf[i] = FloatToBf16(w[i]);
  auto d_w = Upload(w_bf);
  const int64_t out_stride = H * dv + 8;
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    auto d_lat = NanBuffer(static_cast<size_t>(tokens * H * R));
    auto d_attn = NanBuffer(static_cast<size_t>(tokens * out_stride));
    const absl::Status sv = MlaLatentAttentionVUpCuda(
        d_q.data(), H * W, d_cache.data(), block_size, batch, d, ws->data(), d_lat.data(),
        d_w.data() + dn * R, (dn + dv) * R, dv, d_attn.data(), out_stride, nullptr, pdl_bits);
    ASSERT_TRUE(sv.ok()) << sv;
    const std::vector<float> attn = Download(d_attn);
    std::vector<float> fused(want.size());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < out_stride; ++i) {
        const float x = attn[t * out_stride + i];
        if (i >= H * dv) {
          ASSERT_TRUE(std::isnan(x)) << "padding written at token " << t << " column " << i;
        } else {
          fused[t * H * dv + i] = x;
        }
      }
    }
    ExpectClose(absl::StrCat(name, " fused combine + W_UV, launch ", rep), fused, want, kRtol,
                kAtol);
    if (rep == 0) {
      first = attn;
    } else {
      for (size_t i = 0; i < attn.size(); ++i) {
        if (std::isnan(first[i])) continue;
        ASSERT_EQ(attn[i], first[i]) << "relaunch differs at " << i;
      }
    }
  }
}

TEST(MlaLatentAttentionCudaTest, DeepSeekV2LiteDecode) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  // 16 heads, kv_lora_rank 512, rope 64, nope 128, v 128; batch 1 long context splits.
  RunCase("v2-lite decode b1 ctx 2000", Dims(16, 512, 64, 128, 128), 64, {{2000, 1}}, rng);
  RunCase("v2-lite decode b4", Dims(16, 512, 64, 128, 128), 16,
          {{0, 1}, {31, 1}, {700, 1}, {90, 1}}, rng);
}

// The shapes bench/configs/deepseek-v2-lite runs (block 16): decode at batch 1 and 64 over
// ~1k contexts (tensor-core kernel, split into 64-row partitions and combined).
TEST(MlaLatentAttentionCudaTest, DeepSeekV2LiteDecodeBenchShapes) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const MlaDims d = Dims(16, 512, 64, 128, 128);
  RunCase("v2-lite decode b1 ctx 1024", d, 16, {{1023, 1}}, rng);
  std::vector<Seq> seqs;
  for (int32_t s = 0; s < 64; ++s) seqs.push_back({1000 + 3 * s, 1});
  RunCase("v2-lite decode b64 ctx 1000..1189", d, 16, seqs, rng);
}

// Decode shapes that take each ring depth of the pipelined decode kernel (the shape rule:
// latency-bound grids of a few sequences the deep ring, one CTA per SM; others the shallow
// ring): batch 1 (one 32-row tile per partition; 8000 keys: 128 splits), batch 64 (two
// partitions each), short and empty-partition contexts, fewer than 16 heads and several head
// groups.
TEST(MlaLatentAttentionCudaTest, DecodeRings) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const MlaDims d = Dims(16, 512, 64, 128, 128);
  std::vector<Seq> b64;
  for (int32_t s = 0; s < 64; ++s) b64.push_back({(s * 71) % 1400, 1});
  RunCase("b1 ctx 1023", d, 16, {{1023, 1}}, rng);
  RunCase("b1 ctx 8000 block 64", d, 64, {{8000, 1}}, rng);
  RunCase("b1 ctx 100", d, 16, {{100, 1}}, rng);
  RunCase("b64 mixed", d, 16, b64, rng);
  RunCase("short", d, 16, {{0, 1}, {1, 1}, {31, 1}, {32, 1}, {33, 1}, {95, 1}}, rng);
  RunCase("8 heads block 7", Dims(8, 512, 64, 128, 128), 7, {{500, 1}, {3, 1}}, rng);
  RunCase("40 heads", Dims(40, 512, 64, 128, 128), 16, {{300, 1}, {1000, 1}}, rng);
  RunCase("rank 256 rope 32", Dims(16, 256, 32, 64, 64), 16, {{700, 1}, {5, 1}}, rng);
}

// At every decode PDL level (cuda_runner::CudaRunnerOptions::decode_pdl_level): the decode
// kernel a programmatic dependent (its metadata reads and first tile copies before its
// dependency wait, the newest row and Q after it), and the combine + W_UV kernel with the pieces
// MlaDecodePdlBits(level) gives (level 2: its W_UV loads before its wait): the same checks against the CPU reference (the
// newest row in a tile copied before the wait, in a later one, and partitions that end before
// it).
TEST(MlaLatentAttentionCudaTest, DecodePdlLevels) {
  SLUICE_SKIP_WITHOUT_CUDA();
  if (!PdlSupported()) GTEST_SKIP() << "no griddepcontrol below sm_90";
  auto rng = cuda_test::Rng();
  const MlaDims d = Dims(16, 512, 64, 128, 128);
  std::vector<Seq> b64;
  for (int32_t s = 0; s < 64; ++s) b64.push_back({(s * 71) % 1400, 1});
  for (const int level : {0, 1, 2, 3}) {
    const int bits = MlaDecodePdlBits(level);
    EXPECT_EQ(bits, level >= 2 ? kMlaPdlLevel2 : level == 1 ? kMlaPdlLevel1 : 0);
    const std::string tag = "decode pdl level " + std::to_string(level) + " ";
    RunCase(tag + "b1 ctx 1023", d, 16, {{1023, 1}}, rng, bits);
    RunCase(tag + "b1 ctx 8000 block 64", d, 64, {{8000, 1}}, rng, bits);
    RunCase(tag + "b1 ctx 100", d, 16, {{100, 1}}, rng, bits);
    RunCase(tag + "b64 mixed", d, 16, b64, rng, bits);
    RunCase(tag + "short", d, 16, {{0, 1}, {1, 1}, {31, 1}, {32, 1}, {33, 1}, {95, 1}}, rng, bits);
    RunCase(tag + "40 heads", Dims(40, 512, 64, 128, 128), 16, {{300, 1}, {1000, 1}}, rng, bits);
    RunCase(tag + "rank 256 rope 32", Dims(16, 256, 32, 64, 64), 16, {{700, 1}, {5, 1}}, rng,
            bits);
  }
}

// Prefill through the 4-token tensor-core tiles: a 300-token chunk over a 200-token cached
// prefix (split across CTAs; causal rows inside a tile), mixed with a decode sequence, and
// enough query tiles (≥ 2 per SM on an H200) that nothing splits.
TEST(MlaLatentAttentionCudaTest, DeepSeekV2LitePrefillChunks) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const MlaDims d = Dims(16, 512, 64, 128, 128);
  RunCase("v2-lite prefill 300 over 200", d, 16, {{200, 300}}, rng);
  RunCase("v2-lite prefill 301 over 200 + decode", d, 16, {{200, 301}, {1000, 1}, {0, 2}}, rng);
  RunCase("8 heads prefill unsplit", Dims(8, 512, 64, 128, 128), 16,
          {{0, 360}, {50, 350}, {10, 370}}, rng);
}

TEST(MlaLatentAttentionCudaTest, PrefillChunksAndHeadGroups) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  // 40 heads: two full groups of 16 and a partial one; prefill chunks over cached prefixes.
  RunCase("40 heads mixed", Dims(40, 512, 64, 128, 128), 16, {{100, 20}, {0, 7}, {300, 1}}, rng);
  // deepseek-v3-tiny fixture dims.
  RunCase("v3-tiny fixture", Dims(4, 32, 8, 16, 16), 16, {{0, 9}, {40, 3}, {5, 1}}, rng);
  // kv_lora_rank 36 (not a multiple of 8: the fused W_UV's 4-byte weight path), v_head_dim 8.
  RunCase("rank 36 rope 4", Dims(2, 36, 4, 8, 8), 16, {{20, 1}, {3, 2}, {0, 1}}, rng);
}

// Both prefill kernels, as the shape rule picks them (the pipelined kernel where the rank and
// row width are multiples of 64, the one-tile kernel otherwise: row width 288): chunked prefill
// over cached prefixes (split across CTAs, and unsplit), partial query tiles (chunks not a
// multiple of 4 tokens, contexts not a multiple of the 64-row tile), prefill mixed with decode
// sequences, 1000 tokens from scratch (several tiles through the ring), fewer than 16 heads and
// several head groups, a smaller rank (warps idle in P·V).
TEST(MlaLatentAttentionCudaTest, PrefillKernels) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const MlaDims d = Dims(16, 512, 64, 128, 128);
  RunCase("300 over 200", d, 16, {{200, 300}}, rng);
  RunCase("301 over 200 + decode", d, 16, {{200, 301}, {1000, 1}, {0, 2}}, rng);
  RunCase("1000 from scratch", d, 16, {{0, 1000}}, rng);
  RunCase("partial tiles block 7", d, 7, {{63, 5}, {65, 3}, {0, 1}, {127, 6}}, rng);
  RunCase("8 heads unsplit", Dims(8, 512, 64, 128, 128), 16, {{0, 360}, {50, 350}, {10, 370}},
          rng);
  RunCase("40 heads", Dims(40, 512, 64, 128, 128), 16, {{100, 20}, {0, 7}, {300, 1}}, rng);
  RunCase("rank 256 rope 64", Dims(16, 256, 64, 64, 64), 16, {{70, 130}, {0, 9}}, rng);
  RunCase("rank 256 rope 32 (one-tile kernel)", Dims(16, 256, 32, 64, 64), 16,
          {{70, 130}, {0, 9}}, rng);
}

TEST(MlaLatentAttentionCudaTest, RejectsBadArguments) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto buf = DeviceBuffer<bf16>::Create(1 << 16);
  auto meta = DeviceBuffer<int32_t>::Create(16);
  ASSERT_TRUE(buf.ok() && meta.ok());
  PagedAttentionCudaBatch b;
  b.query_start_loc = b.context_lens = b.block_tables = meta->data();
  b.max_blocks_per_seq = b.num_sequences = b.num_tokens = b.max_query_len = b.max_seq_len = 1;
  auto call = [&](const MlaDims& d, int64_t block_size) {
    return MlaLatentAttentionCuda(buf->data(), 16 * 1024, buf->data(), block_size, b, d, nullptr,
                                  buf->data(), nullptr)
        .code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(call(Dims(16, 1024, 64, 128, 128), 16), kInvalid);  // rank > 512
  EXPECT_EQ(call(Dims(16, 510, 4, 128, 128), 16), kInvalid);    // width 514 not a multiple of 8
  EXPECT_EQ(call(Dims(0, 512, 64, 128, 128), 16), kInvalid);
  EXPECT_EQ(call(Dims(16, 512, 64, 128, 128), 0), kInvalid);
  EXPECT_EQ(MlaLatentAttentionCuda(buf->data(), 100, buf->data(), 16, b,
                                   Dims(16, 512, 64, 128, 128), nullptr, buf->data(), nullptr)
                .code(),
            kInvalid);  // q stride below num_heads · width
  const MlaDims v2 = Dims(16, 512, 64, 128, 128);
  auto vup = [&](const bf16* w, int64_t w_stride, int64_t dv, int64_t out_stride) {
    return MlaLatentAttentionVUpCuda(buf->data(), 16 * 576, buf->data(), 16, b, v2, nullptr,
                                     buf->data(), w, w_stride, dv, buf->data(), out_stride,
                                     nullptr)
        .code();
  };
  EXPECT_EQ(vup(nullptr, 256 * 512, 128, 16 * 128), kInvalid);
  EXPECT_EQ(vup(buf->data() + 1, 256 * 512, 128, 16 * 128), kInvalid);  // w_uv 2-byte aligned
  EXPECT_EQ(vup(buf->data(), 256 * 512 + 1, 128, 16 * 128), kInvalid);  // odd head stride
  EXPECT_EQ(vup(buf->data(), 100 * 512, 128, 16 * 128), kInvalid);      // stride < dv · rank
  EXPECT_EQ(vup(buf->data(), 256 * 512, 0, 16 * 128), kInvalid);
  EXPECT_EQ(vup(buf->data(), 256 * 512, 128, 16 * 128 - 1), kInvalid);  // out stride short
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace sluice::kernels
