// The batch-invariant MLA pieces (mla_invariant_cuda.h) composed as the DeepSeek runner runs
// them in batch-invariant mode — HeadGemmInvariantCuda (q_nope · W_UK), the cached latent
// attention MlaLatentAttentionInvariantCuda, HeadGemmInvariantCuda (· W_UV) — against
// MlaAttentionCpu (float32), and a probe sequence's output rows bit for bit the same from a
// whole-prompt launch, a prefill chunk after a cached prefix, a decode row alone, and decode
// rows inside steps of 7, 64 and 256 sequences (with graph-style padding rows).
// Needs a GPU: part of kernels_cuda_test, skipped without one.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention/paged_attention_invariant.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/mla_attention/mla_invariant_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::FirstBitMismatch;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

constexpr int64_t kBlock = 16;
constexpr int64_t kCacheBlocks = 256;

struct Seq {
  int32_t context = 0, query = 0;
  std::vector<int32_t> table;
  std::vector<bf16> q;  // [query, heads, dn + dr]
};

class InvariantMla {
 public:
  InvariantMla(const MlaDims& d, std::mt19937& rng) : d_(d), rng_(rng) {
    w_ = RandomBf16(static_cast<size_t>(d.num_heads * (d.qk_nope_head_dim + d.v_head_dim) *
                                        d.kv_lora_rank),
                    rng, -0.05f, 0.05f);
    cache_ = RandomBf16(static_cast<size_t>(kCacheBlocks * kBlock * d.LatentWidth()), rng, -1.0f,
                        1.0f);
    d_w_ = Upload(w_);
    d_cache_ = Upload(cache_);
  }
  int64_t QRow() const { return d_.num_heads * (d_.qk_nope_head_dim + d_.qk_rope_head_dim); }
  int64_t OutRow() const { return d_.num_heads * d_.v_head_dim; }

  Seq NewSeq(int32_t len, int32_t query) {
    Seq s;
    s.context = len - query;
    s.query = query;
    std::uniform_int_distribution<int32_t> block(0, kCacheBlocks - 1);
    for (int64_t b = 0; b < (len + kBlock - 1) / kBlock; ++b) s.table.push_back(block(rng_));
    s.q = RandomBf16(static_cast<size_t>(query * QRow()), rng_, -1.0f, 1.0f);
    return s;
  }
  Seq Slice(const Seq& whole, int32_t from) const {
    Seq s;
    s.context = from;
    s.query = whole.context + whole.query - from;
    s.table = whole.table;
    s.q.assign(whole.q.begin() + (from - whole.context) * QRow(), whole.q.end());
    return s;
  }

  // The runner's batch-invariant MLA over `seqs` (+ pad_tokens padding rows): out [tokens,
  // heads · dv] as floats.
  std::vector<float> Run(const std::vector<Seq>& seqs, int64_t pad_tokens = 0) {
    const int64_t H = d_.num_heads, R = d_.kv_lora_rank, dn = d_.qk_nope_head_dim,
                  dr = d_.qk_rope_head_dim, dv = d_.v_head_dim, W = d_.LatentWidth();
    std::vector<int32_t> start{0}, contexts;
    std::vector<bf16> q;
    int64_t max_q = 1, max_len = 1, max_blocks = 1;
    for (const Seq& s : seqs) {
      start.push_back(start.back() + s.query);
      contexts.push_back(s.context);
      q.insert(q.end(), s.q.begin(), s.q.end());
      max_q = std::max<int64_t>(max_q, s.query);
      max_len = std::max<int64_t>(max_len, s.context + s.query);
      max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(s.table.size()));
    }
    const int64_t T = start.back() + pad_tokens;
    q.resize(static_cast<size_t>(T * QRow()), FloatToBf16(0.5f));
    // q_lat rows: [R] absorbed (written below), then the rope channels copied from q.
    std::vector<bf16> q_lat(static_cast<size_t>(T * H * W), FloatToBf16(0.0f));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t c = 0; c < dr; ++c) {
          q_lat[(t * H + h) * W + R + c] = q[t * QRow() + h * (dn + dr) + dn + c];
        }
      }
    }
    std::vector<int32_t> tables(seqs.size() * max_blocks, 0);
    for (size_t i = 0; i < seqs.size(); ++i) {
      std::copy(seqs[i].table.begin(), seqs[i].table.end(), tables.begin() + i * max_blocks);
    }
    auto d_start = Upload(start);
    auto d_ctx = Upload(contexts);
    auto d_tables = Upload(tables);
    auto d_q = Upload(q);
    auto d_q_lat = Upload(q_lat);
    auto out_lat = cuda_test::NanBuffer(static_cast<size_t>(T * H * R));
    auto out = cuda_test::NanBuffer(static_cast<size_t>(T * H * dv));
    PagedAttentionCudaBatch batch;
    batch.query_start_loc = d_start.data();
    batch.context_lens = d_ctx.data();
    batch.block_tables = d_tables.data();
    batch.max_blocks_per_seq = max_blocks;
    batch.num_sequences = static_cast<int64_t>(seqs.size());
    batch.num_tokens = T;
    batch.max_query_len = max_q + pad_tokens;
    batch.max_seq_len = max_len + pad_tokens;
    auto ws = DeviceBuffer<uint8_t>::Create(MlaLatentAttentionInvariantWorkspaceBytes(batch, d_));
    EXPECT_TRUE(ws.ok());
    if (!ws.ok()) return {};
    EXPECT_TRUE(HeadGemmInvariantCuda(d_q.data(), QRow(), dn + dr, d_w_.data(), (dn + dv) * R, 1,
                                      R, d_q_lat.data(), H * W, W, T, H, R, dn, nullptr)
                    .ok());
    EXPECT_TRUE(MlaLatentAttentionInvariantCuda(d_q_lat.data(), H * W, d_cache_.data(), kBlock,
                                                batch, d_, ws->data(), out_lat.data(), nullptr)
                    .ok());
    EXPECT_TRUE(HeadGemmInvariantCuda(out_lat.data(), H * R, R, d_w_.data() + dn * R,
                                      (dn + dv) * R, R, 1, out.data(), H * dv, dv, T, H, dv, R,
                                      nullptr)
                    .ok());
    return Download(out);
  }

  std::vector<float> Reference(const Seq& s) const {
    std::vector<float> cache = ToFloat(cache_), w = ToFloat(w_), q = ToFloat(s.q);
    MlaSequence seq;
    seq.query_start = 0;
    seq.num_query_tokens = s.query;
    seq.num_context_tokens = s.context;
    seq.block_table = absl::MakeConstSpan(s.table);
    MlaPagedCache pc{cache.data(), kCacheBlocks, kBlock};
    std::vector<float> out(static_cast<size_t>(s.query * OutRow()));
    const absl::Status st = MlaAttentionCpu(q.data(), QRow(), w.data(), {&seq, 1}, d_, pc,
                                            out.data());
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

 private:
  MlaDims d_;
  std::mt19937& rng_;
  std::vector<bf16> w_, cache_;
  DeviceBuffer<bf16> d_w_, d_cache_;
};

std::vector<float> Rows(const std::vector<float>& v, int64_t first, int64_t count, int64_t row) {
  return std::vector<float>(v.begin() + first * row, v.begin() + (first + count) * row);
}

TEST(MlaInvariantCudaTest, BatchInvariantMlaMatchesCpuAndIsBitwiseBatchInvariant) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  MlaDims d;  // DeepSeek-V2-Lite's attention dims
  d.num_heads = 16;
  d.kv_lora_rank = 512;
  d.qk_nope_head_dim = 128;
  d.qk_rope_head_dim = 64;
  d.v_head_dim = 128;
  d.softmax_scale = 1.0f / std::sqrt(192.0f);
  InvariantMla mla(d, rng);
  const int64_t row = mla.OutRow();
  constexpr int32_t kLen = 300;  // two 256-key splits
  const Seq whole = mla.NewSeq(kLen, kLen);
  const std::vector<float> ref = mla.Run({whole});
  // bf16 roundings of the absorbed query, the latent output and the output.
  ExpectClose("MLA vs MlaAttentionCpu", ref, mla.Reference(whole), 1.0 / 32, 1.0 / 64);
  for (int32_t cut : {100, 256, 299}) {
    EXPECT_EQ(FirstBitMismatch(mla.Run({mla.Slice(whole, cut)}), Rows(ref, cut, kLen - cut, row)),
              -1)
        << "chunk from " << cut;
  }
  const Seq last = mla.Slice(whole, kLen - 1);
  const std::vector<float> want = Rows(ref, kLen - 1, 1, row);
  std::uniform_int_distribution<int32_t> len(1, 600);
  for (int others : {6, 63, 255}) {
    std::vector<Seq> batch;
    for (int i = 0; i < others; ++i) batch.push_back(mla.NewSeq(len(rng), 1));
    const size_t at = static_cast<size_t>(others / 2);
    batch.insert(batch.begin() + at, last);
    for (int64_t pad : {0, 5}) {
      EXPECT_EQ(FirstBitMismatch(Rows(mla.Run(batch, pad), static_cast<int64_t>(at), 1, row),
                                 want),
                -1)
          << others << " others, " << pad << " padding rows";
    }
  }
}

TEST(MlaInvariantCudaTest, HeadGemmRejectsBadSizes) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto b = cuda_test::NanBuffer(64);
  EXPECT_EQ(HeadGemmInvariantCuda(b.data(), 8, 8, b.data(), 8, 1, 8, b.data(), 8, 8, 1, 1, 0, 8,
                                  nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HeadGemmInvariantCuda(b.data(), 8, 8, nullptr, 8, 1, 8, b.data(), 8, 8, 1, 1, 8, 8,
                                  nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
