// RopeCuda against RopeCpu (same RopeTable: default, llama3, YaRN; rotate-half and DeepSeek
// interleave; partial rotary spans at an offset) on fresh random bf16 inputs. Needs a GPU
// (kernels_cuda_test).
#include "kernels/rope/rope_cuda.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/rope/rope.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

struct Case {
  std::string name;
  RopeParams params;
  int64_t num_tokens, num_heads, head_stride, token_stride, offset;
  bool interleave;
  int32_t max_pos;
};

std::vector<Case> Cases() {
  const RopeParams llama = cuda_test::Llama3Rope();
  RopeParams plain;
  plain.theta = 10000.0;
  plain.rotary_dim = 64;
  RopeParams yarn;  // DeepSeek-V2-Lite: qk_rope_head_dim 64, YaRN factor 40
  yarn.rope_type = "yarn";
  yarn.theta = 10000.0;
  yarn.rotary_dim = 64;
  yarn.factor = 40.0;
  yarn.original_max_position_embeddings = 4096;
  yarn.beta_fast = 32.0;
  yarn.beta_slow = 1.0;
  yarn.mscale = 0.707;
  yarn.mscale_all_dim = 0.707;
  RopeParams yarn_plain = yarn;  // mscale 1 → attention_scaling = 0.1·ln(factor) + 1 ≠ 1
  yarn_plain.mscale = 1.0;
  yarn_plain.mscale_all_dim = 0.0;
  yarn_plain.rotary_dim = 128;
  return {
      // q of Llama-3-8B: 32 heads × 128, whole head rotated.
      {"llama3 q", llama, 19, 32, 128, 32 * 128, 0, false, 8192},
      // Fused qkv row: rotate 8 kv heads inside a wider token stride.
      {"llama3 k in qkv", llama, 5, 8, 128, 48 * 128, 32 * 128, false, 100000},
      {"default partial", plain, 7, 3, 96, 3 * 96, 16, false, 2048},
      // DeepSeek q: head = 128 nope + 64 rope channels, interleaved pairs, YaRN table.
      {"yarn interleave q", yarn, 11, 16, 192, 16 * 192, 128, true, 163840},
      // DeepSeek k_pe: one shared rope head of 64 at the end of the 576-wide latent row.
      {"yarn interleave k_pe", yarn, 33, 1, 64, 576, 512, true, 163840},
      {"yarn scaled rotate-half", yarn_plain, 9, 5, 128, 5 * 128, 0, false, 131072},
  };
}

TEST(RopeCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const Case& c : Cases()) {
    auto table = MakeRopeTable(c.params);
    ASSERT_TRUE(table.ok()) << table.status();
    auto d_table = UploadRopeTable(*table);
    ASSERT_TRUE(d_table.ok()) << d_table.status();
    const size_t n = static_cast<size_t>(c.num_tokens * c.token_stride);
    const auto x = RandomBf16(n, rng, -2.0f, 2.0f);
    std::uniform_int_distribution<int32_t> pos_dist(0, c.max_pos - 1);
    std::vector<int32_t> positions(static_cast<size_t>(c.num_tokens));
    for (auto& p : positions) p = pos_dist(rng);
    positions[0] = c.max_pos - 1;
    auto d_x = Upload(x);
    auto d_pos = Upload(positions);
    ASSERT_TRUE(RopeCuda(d_x.data(), c.num_tokens, c.num_heads, c.token_stride, c.head_stride,
                         c.offset, d_pos.data(), *d_table, c.interleave, nullptr)
                    .ok());
    auto want = ToFloat(x);
    RopeCpu(want.data(), c.num_tokens, c.num_heads, c.token_stride, c.head_stride, c.offset,
            positions.data(), *table, c.interleave);
    // Whole buffer: channels outside the rotated spans must be untouched (exactly equal).
    ExpectClose(absl::StrCat("rope ", c.name, " scaling=", table->attention_scaling), Download(d_x),
                want, 1.0 / 128, 1e-4);
  }
}

// The fused q/k rotation + KV-cache write equals RopeCpu on q and k, with the rotated k and the
// untouched v in the token's cache slot; a slot of -1 rotates but writes nothing (the cache
// keeps its NaN fill). Llama-3-8B shapes and a partial rotary span (k tail copied unrotated).
TEST(RopeCudaTest, QkWriteKvMatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  struct Shape {
    RopeParams params;
    int64_t tokens, heads, kv_heads, head_dim, pad;
  };
  const RopeParams llama = cuda_test::Llama3Rope();
  RopeParams partial;
  partial.theta = 10000.0;
  partial.rotary_dim = 32;
  // Head groups per token (one block each): Llama 10 (and a one-token decode step), partial
  // 1 and 2 (the unrotated k tail and v copies then spread over both blocks). From 16 tokens on
  // the 16-byte kernel: Llama, the partial span (k tail chunks), and a row stride that is not a
  // whole number of 16-byte chunks (the per-pair kernel again); 65600 tokens make the
  // 16-byte kernel's blocks (65535 a grid column) take a second token, refilling their
  // shared (cos, sin) table.
  for (const Shape& sh :
       {Shape{llama, 7, 32, 8, 128, 0}, Shape{llama, 1, 32, 8, 128, 0},
        Shape{partial, 5, 6, 2, 48, 8}, Shape{partial, 3, 24, 8, 48, 8},
        Shape{llama, 40, 32, 8, 128, 0}, Shape{partial, 21, 6, 2, 48, 8},
        Shape{partial, 17, 24, 8, 48, 2}, Shape{partial, 65600, 6, 2, 48, 8}}) {
    auto table = MakeRopeTable(sh.params);
    ASSERT_TRUE(table.ok()) << table.status();
    auto d_table = UploadRopeTable(*table);
    ASSERT_TRUE(d_table.ok()) << d_table.status();
    const int64_t q_dim = sh.heads * sh.head_dim, kv_dim = sh.kv_heads * sh.head_dim;
    const int64_t stride = q_dim + 2 * kv_dim + sh.pad;
    const int64_t num_slots = 2 * sh.tokens;
    const auto x = RandomBf16(static_cast<size_t>(sh.tokens * stride), rng, -2.0f, 2.0f);
    std::vector<int32_t> positions(static_cast<size_t>(sh.tokens));
    std::vector<int64_t> slots(static_cast<size_t>(sh.tokens));
    for (int64_t t = 0; t < sh.tokens; ++t) {
      positions[t] = static_cast<int32_t>((t * 977 + 13) % 8192);
      slots[t] = t == 1 ? -1 : (num_slots - 1 - 2 * t);  // scattered, one skipped
    }
    auto d_x = Upload(x);
    auto d_pos = Upload(positions);
    auto d_slots = Upload(slots);
    auto k_cache = cuda_test::NanBuffer(static_cast<size_t>(num_slots * kv_dim));
    auto v_cache = cuda_test::NanBuffer(static_cast<size_t>(num_slots * kv_dim));
    const absl::Status st = RopeQkWriteKvCuda(d_x.data(), sh.tokens, stride, sh.heads,
                                              sh.kv_heads, sh.head_dim, d_pos.data(), *d_table,
                                              d_slots.data(), k_cache.data(), v_cache.data(),
                                              nullptr);
    ASSERT_TRUE(st.ok()) << st;
    auto want = ToFloat(x);
    RopeCpu(want.data(), sh.tokens, sh.heads + sh.kv_heads, stride, sh.head_dim, 0,
            positions.data(), *table, false);
    const std::string name = absl::StrCat("rope+kv tokens=", sh.tokens, " heads=", sh.heads,
                                          " head_dim=", sh.head_dim, " pad=", sh.pad);
    const auto rotated = Download(d_x);
    ExpectClose(name + " qkv", rotated, want, 1.0 / 128, 1e-4);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> want_k(static_cast<size_t>(num_slots * kv_dim), nan);
    std::vector<float> want_v = want_k;
    for (int64_t t = 0; t < sh.tokens; ++t) {
      if (slots[t] < 0) continue;
      for (int64_t e = 0; e < kv_dim; ++e) {
        want_k[slots[t] * kv_dim + e] = want[t * stride + q_dim + e];
        want_v[slots[t] * kv_dim + e] = want[t * stride + q_dim + kv_dim + e];
      }
    }
    const auto got_k = Download(k_cache), got_v = Download(v_cache);
    for (size_t i = 0; i < want_k.size(); ++i) {
      if (std::isnan(want_k[i])) {
        ASSERT_TRUE(std::isnan(got_k[i]) && std::isnan(got_v[i])) << name << " cache elem " << i;
      }
    }
    // Cached k must be the bits of the rotated q/k row (compared above); exact equality here.
    std::vector<int64_t> token_of_slot(static_cast<size_t>(num_slots), -1);
    for (int64_t t = 0; t < sh.tokens; ++t) {
      if (slots[t] >= 0) token_of_slot[slots[t]] = t;
    }
    for (size_t i = 0; i < want_k.size(); ++i) {
      if (std::isnan(want_k[i])) continue;
      const int64_t slot = static_cast<int64_t>(i) / kv_dim, e = static_cast<int64_t>(i) % kv_dim;
      const int64_t t = token_of_slot[slot];
      ASSERT_EQ(got_k[i], rotated[t * stride + q_dim + e]) << name << " k slot " << slot;
      ASSERT_EQ(got_v[i], want_v[i]) << name << " v slot " << slot;
    }
  }
}

// RopeQkWriteKvCuda and RopeCuda as a chain of programmatic dependents
// (the launchers' `pdl`): each rotates the qkv rows the one before rotated, in place, and the
// RoPE + KV launches rewrite the same cache slots; the bits equal plain launches, eagerly and
// from a CUDA graph, for a decode step (1 token, the per-pair kernel) and a 20-token step
// (the 16-byte kernel).
TEST(RopeCudaTest, DecodePdlChainMatchesPlainLaunches) {
  SLUICE_SKIP_WITHOUT_CUDA();
  if (!PdlSupported()) GTEST_SKIP() << "programmatic dependent launch needs sm_90";
  auto rng = cuda_test::Rng();
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const cudaStream_t st = stream->get();
  auto table = MakeRopeTable(cuda_test::Llama3Rope());
  ASSERT_TRUE(table.ok()) << table.status();
  auto d_table = UploadRopeTable(*table);
  ASSERT_TRUE(d_table.ok()) << d_table.status();
  constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 128;
  constexpr int64_t kStride = (kHeads + 2 * kKvHeads) * kHeadDim, kKvDim = kKvHeads * kHeadDim;
  for (const int64_t tokens : {1, 20}) {
    const auto x = RandomBf16(static_cast<size_t>(tokens * kStride), rng, -2.0f, 2.0f);
    std::vector<int32_t> positions(static_cast<size_t>(tokens));
    std::vector<int64_t> slots(static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) {
      positions[t] = static_cast<int32_t>((t * 977 + 13) % 8192);
      slots[t] = tokens - 1 - t;
    }
    auto d_pos = Upload(positions);
    auto d_slots = Upload(slots);
    auto run = [&](bool pdl, bool graph) {
      auto d_x = Upload(x);
      auto k_cache = cuda_test::NanBuffer(static_cast<size_t>(tokens * kKvDim));
      auto v_cache = cuda_test::NanBuffer(static_cast<size_t>(tokens * kKvDim));
      cuda_test::RunOnStream(st, graph, [&]() -> absl::Status {
        absl::Status s;
        for (int i = 0; s.ok() && i < 3; ++i) {
          s = RopeQkWriteKvCuda(d_x.data(), tokens, kStride, kHeads, kKvHeads, kHeadDim,
                                d_pos.data(), *d_table, d_slots.data(), k_cache.data(),
                                v_cache.data(), st, pdl);
          if (s.ok()) {
            s = RopeCuda(d_x.data(), tokens, kHeads, kStride, kHeadDim, 0, d_pos.data(), *d_table,
                         false, st, pdl);
          }
        }
        return s;
      });
      std::vector<float> out = Download(d_x);
      for (const auto* c : {&k_cache, &v_cache}) {
        const std::vector<float> v = Download(*c);
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    };
    const std::vector<float> want = run(false, false);
    for (float v : want) ASSERT_TRUE(std::isfinite(v)) << "reference not finite";
    for (const bool graph : {false, true}) {
      EXPECT_EQ(cuda_test::FirstBitMismatch(run(true, graph), want), -1)
          << "tokens " << tokens << (graph ? " graph" : " eager");
    }
  }
}

TEST(RopeCudaTest, RejectsBadArguments) {
  SLUICE_SKIP_WITHOUT_CUDA();
  RopeTable big;
  big.inv_freq.assign(2048, 1.0f);
  EXPECT_EQ(UploadRopeTable(big).status().code(), absl::StatusCode::kInvalidArgument);
  DeviceRopeTable empty;
  EXPECT_EQ(RopeCuda(nullptr, 1, 1, 64, 64, 0, nullptr, empty, false, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeQkWriteKvCuda(nullptr, 1, 64, 1, 1, 64, nullptr, empty, nullptr, nullptr, nullptr,
                              nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
