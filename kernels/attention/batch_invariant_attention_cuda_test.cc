// PagedAttentionCuda with PagedAttentionOptions::batch_invariant (paged_attention_invariant.h):
// values against a double-precision reference, and a probe sequence's output rows bit for bit
// the same whether they are computed in one whole-prompt launch, in prefill chunks after a
// cached prefix (chunk boundaries on and off the 256-key split points), as a decode row alone,
// or inside batches of 7, 64 and 256 random other sequences (decode and mixed prefill/decode
// steps), with graph-style loose bounds and padding rows, and replayed from a CUDA graph.
// Needs a GPU: part of kernels_cuda_test, skipped without one.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/attention/paged_attention_invariant.h"
#include "kernels/cuda/cuda_test_util.h"

namespace sluice::kernels {
namespace {

using cuda_test::ExpectClose;
using cuda_test::FirstBitMismatch;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

constexpr int64_t kBlock = 16;
constexpr int64_t kCacheBlocks = 1024;

struct Seq {
  int32_t context = 0, query = 0;
  std::vector<int32_t> table;  // physical blocks of positions [0, context + query)
  std::vector<bf16> q;         // [query, heads, head_dim]
};

class InvariantAttention {
 public:
  InvariantAttention(const PagedAttentionParams& p, std::mt19937& rng) : p_(p), rng_(rng) {
    const int64_t k_elems = kCacheBlocks * kBlock * p.num_kv_heads * p.head_dim;
    const int64_t v_elems = kCacheBlocks * kBlock * p.num_kv_heads * p.v_head_dim;
    k_host_ = RandomBf16(static_cast<size_t>(k_elems), rng, -1.0f, 1.0f);
    v_host_ = RandomBf16(static_cast<size_t>(v_elems), rng, -1.0f, 1.0f);
    k_ = Upload(k_host_);
    v_ = Upload(v_host_);
  }

  // A sequence of `len` positions on random blocks (sequences may share blocks: attention only
  // reads the cache) and random q rows for its last `query`.
  Seq NewSeq(int32_t len, int32_t query) {
    Seq s;
    s.context = len - query;
    s.query = query;
    const int64_t nb = (len + kBlock - 1) / kBlock;
    std::uniform_int_distribution<int32_t> block(0, kCacheBlocks - 1);
    for (int64_t b = 0; b < nb; ++b) s.table.push_back(block(rng_));
    s.q = RandomBf16(static_cast<size_t>(query * p_.num_heads * p_.head_dim), rng_, -2.0f, 2.0f);
    return s;
  }
  // The same sequence's positions [from, to) as this step's query rows (q rows kept from the
  // whole-prompt sequence `whole`).
  static Seq Slice(const Seq& whole, int32_t from, int32_t to, int64_t q_row) {
    Seq s;
    s.context = from;
    s.query = to - from;
    s.table = whole.table;
    const int64_t first = (from - whole.context) * q_row;
    s.q.assign(whole.q.begin() + first, whole.q.begin() + first + s.query * q_row);
    return s;
  }
  int64_t QRow() const { return p_.num_heads * p_.head_dim; }

  // One launch over `seqs` (plus `pad_tokens` rows past the last sequence and `extra_len` on
  // max_seq_len, as a graph bucket's bounds are loose); returns out [tokens, heads, v_head_dim].
  std::vector<float> Run(const std::vector<Seq>& seqs, int64_t pad_tokens = 0,
                         int64_t extra_len = 0, bool graph = false) {
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
    const int64_t tokens = start.back() + pad_tokens;
    q.resize(static_cast<size_t>(tokens * QRow()), FloatToBf16(1.0f));
    std::vector<int32_t> tables(seqs.size() * max_blocks, -1);
    for (size_t i = 0; i < seqs.size(); ++i) {
      std::copy(seqs[i].table.begin(), seqs[i].table.end(), tables.begin() + i * max_blocks);
    }
    auto d_start = Upload(start);
    auto d_ctx = Upload(contexts);
    auto d_tables = Upload(tables);
    auto d_q = Upload(q);
    PagedAttentionCudaBatch batch;
    batch.query_start_loc = d_start.data();
    batch.context_lens = d_ctx.data();
    batch.block_tables = d_tables.data();
    batch.max_blocks_per_seq = max_blocks;
    batch.num_sequences = static_cast<int64_t>(seqs.size());
    batch.num_tokens = tokens;
    batch.max_query_len = max_q + (pad_tokens > 0 ? pad_tokens : 0);
    batch.max_seq_len = max_len + extra_len + batch.max_query_len - max_q;
    PagedAttentionOptions options;
    options.batch_invariant = true;
    auto info = DescribePagedAttentionPlan(batch, p_, options);
    EXPECT_TRUE(info.ok()) << info.status();
    if (info.ok()) {
      EXPECT_EQ(info->kernel, PagedAttentionKernel::kBatchInvariant);
    }
    const size_t ws_bytes = PagedAttentionCudaWorkspaceBytes(batch, p_, options);
    EXPECT_GT(ws_bytes, 0u);
    auto ws = DeviceBuffer<uint8_t>::Create(ws_bytes);
    EXPECT_TRUE(ws.ok());
    auto out = cuda_test::NanBuffer(static_cast<size_t>(tokens * p_.num_heads * p_.v_head_dim));
    auto stream = CudaStream::Create();
    EXPECT_TRUE(stream.ok());
    if (!stream.ok() || !ws.ok()) return {};
    cuda_test::RunOnStream(stream->get(), graph, [&] {
      return PagedAttentionCuda(d_q.data(), QRow(), k_.data(), v_.data(), batch, p_, ws->data(),
                                out.data(), stream->get(), options);
    });
    return cuda_test::Download(out);
  }

  // Double-precision reference rows of one sequence's query rows.
  std::vector<float> Reference(const Seq& s) const {
    const int64_t hd = p_.head_dim, dv = p_.v_head_dim, group = p_.num_heads / p_.num_kv_heads;
    std::vector<float> out(static_cast<size_t>(s.query * p_.num_heads * dv));
    for (int64_t i = 0; i < s.query; ++i) {
      const int64_t pos = s.context + i;
      const int64_t lo = p_.sliding_window > 0 ? std::max<int64_t>(0, pos - p_.sliding_window + 1) : 0;
      for (int64_t h = 0; h < p_.num_heads; ++h) {
        const int64_t kvh = h / group;
        std::vector<double> score;
        double mx = -1e300;
        for (int64_t j = lo; j <= pos; ++j) {
          const int64_t slot = int64_t{s.table[j / kBlock]} * kBlock + j % kBlock;
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c) {
            dot += double{Bf16ToFloat(s.q[(i * p_.num_heads + h) * hd + c])} *
                   Bf16ToFloat(k_host_[(slot * p_.num_kv_heads + kvh) * hd + c]);
          }
          score.push_back(dot * p_.scale);
          mx = std::max(mx, score.back());
        }
        double sum = 0;
        std::vector<double> acc(static_cast<size_t>(dv), 0.0);
        for (int64_t j = lo; j <= pos; ++j) {
          const int64_t slot = int64_t{s.table[j / kBlock]} * kBlock + j % kBlock;
          const double w = std::exp(score[j - lo] - mx);
          sum += w;
          for (int64_t c = 0; c < dv; ++c) {
            acc[c] += w * Bf16ToFloat(v_host_[(slot * p_.num_kv_heads + kvh) * dv + c]);
          }
        }
        for (int64_t c = 0; c < dv; ++c) {
          out[(i * p_.num_heads + h) * dv + c] = static_cast<float>(acc[c] / sum);
        }
      }
    }
    return out;
  }

  int64_t OutRow() const { return p_.num_heads * p_.v_head_dim; }

 private:
  PagedAttentionParams p_;
  std::mt19937& rng_;
  std::vector<bf16> k_host_, v_host_;
  DeviceBuffer<bf16> k_, v_;
};

PagedAttentionParams Params(int64_t heads, int64_t kv_heads, int64_t d, int64_t window) {
  PagedAttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = d;
  p.v_head_dim = d;
  p.block_size = kBlock;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.sliding_window = window;
  return p;
}

std::vector<float> Rows(const std::vector<float>& out, int64_t first, int64_t count,
                        int64_t row) {
  return std::vector<float>(out.begin() + first * row, out.begin() + (first + count) * row);
}

class BatchInvariantAttentionTest : public ::testing::TestWithParam<PagedAttentionParams> {};

TEST_P(BatchInvariantAttentionTest, RowsIndependentOfBatchChunkingAndGraphs) {
  SLUICE_SKIP_WITHOUT_CUDA();
  const PagedAttentionParams p = GetParam();
  SCOPED_TRACE(absl::StrCat("heads ", p.num_heads, "/", p.num_kv_heads, " d ", p.head_dim,
                            " window ", p.sliding_window));
  std::mt19937 rng = cuda_test::Rng();
  InvariantAttention att(p, rng);
  const int64_t row = att.OutRow();
  constexpr int32_t kLen = 700;  // three 256-key splits
  const Seq whole = att.NewSeq(kLen, kLen);
  const std::vector<float> ref_out = att.Run({whole});
  ExpectClose("whole prefill vs reference", ref_out, att.Reference(whole), 1.0 / 64, 1.0 / 128);

  // Chunked prefill: the rows after a cached prefix, cut on and off the split points.
  for (int32_t cut : {1, 255, 256, 300, 512, 699}) {
    SCOPED_TRACE(absl::StrCat("chunk from ", cut));
    const Seq tail = InvariantAttention::Slice(whole, cut, kLen, att.QRow());
    EXPECT_EQ(FirstBitMismatch(att.Run({tail}), Rows(ref_out, cut, kLen - cut, row)), -1);
  }
  const Seq last = InvariantAttention::Slice(whole, kLen - 1, kLen, att.QRow());
  const std::vector<float> want_last = Rows(ref_out, kLen - 1, 1, row);
  EXPECT_EQ(FirstBitMismatch(att.Run({last}), want_last), -1) << "decode alone";
  for (int others : {6, 63, 255}) {
    for (bool mixed : {false, true}) {
      std::vector<Seq> batch;
      std::uniform_int_distribution<int32_t> len(1, 1200);
      for (int i = 0; i < others; ++i) {
        const int32_t l = len(rng);
        // Mixed steps hold some prefill chunks (prefill kernels in the default mode).
        const int32_t q = mixed && i % 5 == 0 ? std::min<int32_t>(l, 1 + len(rng) % 64) : 1;
        batch.push_back(att.NewSeq(l, q));
      }
      const size_t at = static_cast<size_t>(others / 2);
      batch.insert(batch.begin() + at, last);
      int64_t first = 0;
      for (size_t i = 0; i < at; ++i) first += batch[i].query;
      SCOPED_TRACE(absl::StrCat(others, " others", mixed ? ", mixed" : ""));
      const std::vector<float> out = att.Run(batch);
      EXPECT_EQ(FirstBitMismatch(Rows(out, first, 1, row), want_last), -1);
      if (others == 63 && !mixed) {
        // Graph-style bounds: padding rows and a looser max_seq_len, eagerly and replayed.
        for (bool graph : {false, true}) {
          const std::vector<float> padded = att.Run(batch, /*pad_tokens=*/9, /*extra_len=*/900,
                                                    graph);
          EXPECT_EQ(FirstBitMismatch(Rows(padded, first, 1, row), want_last), -1)
              << (graph ? "graph" : "eager") << " with loose bounds";
          for (int64_t t = others + 1; t < others + 1 + 9; ++t) {
            for (int64_t c = 0; c < row; ++c) ASSERT_EQ(padded[t * row + c], 0.0f) << t;
          }
        }
      }
      // Mixed: one other sequence also checked against the reference.
      if (mixed && others == 6) {
        ExpectClose("mixed batch first sequence", Rows(out, 0, batch[0].query, row),
                    att.Reference(batch[0]), 1.0 / 64, 1.0 / 128);
      }
    }
  }
  // The probe's whole prompt between other sequences' prefill and decode rows.
  std::vector<Seq> mixed{att.NewSeq(300, 300), whole, att.NewSeq(900, 5)};
  const std::vector<float> out = att.Run(mixed);
  EXPECT_EQ(FirstBitMismatch(Rows(out, 300, kLen, row), ref_out), -1) << "prompt among others";
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchInvariantAttentionTest,
                         ::testing::Values(Params(32, 8, 128, 0),    // Llama-3-8B
                                           Params(8, 8, 64, 0),      // MHA, smaller head
                                           Params(16, 2, 128, 300),  // sliding window
                                           Params(4, 1, 256, 0)),    // head dim 256, group 4
                         [](const ::testing::TestParamInfo<PagedAttentionParams>& info) {
                           return absl::StrCat("h", info.param.num_heads, "_kv",
                                               info.param.num_kv_heads, "_d", info.param.head_dim,
                                               "_w", info.param.sliding_window);
                         });

TEST(BatchInvariantAttentionTest, NoRopeFusionInTheMode) {
  PagedAttentionCudaBatch batch;
  int32_t dummy = 0;
  batch.query_start_loc = &dummy;
  batch.context_lens = &dummy;
  batch.block_tables = &dummy;
  batch.max_blocks_per_seq = 4;
  batch.num_sequences = 64;
  batch.num_tokens = 64;
  batch.max_query_len = 1;
  batch.max_seq_len = 64;
  PagedAttentionOptions options;
  options.batch_invariant = true;
  const PagedAttentionParams p = Params(32, 8, 128, 0);
  EXPECT_FALSE(PagedAttentionDecodeFusionPays(batch, p, options));
  EXPECT_FALSE(PagedAttentionDecodeFusionApplies(batch, p, 128, options));
}

}  // namespace
}  // namespace sluice::kernels
