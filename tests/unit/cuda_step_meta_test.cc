// The CUDA runners' step metadata on the host (engine/cuda/step_meta.h): how a plan is packed
// for a decode graph bucket (plain and multi-token, with padding) and which bucket a step picks.
#include "engine/cuda/step_meta.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace sluice::cuda_runner {
namespace {

constexpr int64_t kBlockSize = 4;
constexpr int64_t kMaxBlocks = 8;  // max_model_len 32
constexpr PackGeometry kGeometry{kBlockSize, kMaxBlocks};

// A plan of sequences with these contexts and query counts; block b of sequence s is
// 10 · (s + 1) + b; a logits row for every token.
struct TestPlan {
  std::vector<std::vector<int32_t>> tables;
  ForwardInput in;
};

TestPlan MakePlan(const std::vector<int32_t>& contexts, const std::vector<int32_t>& queries) {
  TestPlan p;
  p.tables.resize(contexts.size());
  for (size_t s = 0; s < contexts.size(); ++s) {
    const int32_t total = contexts[s] + queries[s];
    for (int32_t b = 0; b * kBlockSize < total; ++b) {
      p.tables[s].push_back(static_cast<int32_t>(10 * (s + 1) + b));
    }
  }
  for (size_t s = 0; s < contexts.size(); ++s) {
    SequenceSlice slice;
    slice.query_start = static_cast<int32_t>(p.in.token_ids.size());
    slice.num_query_tokens = queries[s];
    slice.num_context_tokens = contexts[s];
    slice.block_table = absl::MakeConstSpan(p.tables[s]);
    for (int32_t i = 0; i < queries[s]; ++i) {
      const int32_t pos = contexts[s] + i;
      p.in.logits_indices.push_back(static_cast<int32_t>(p.in.token_ids.size()));
      p.in.token_ids.push_back(static_cast<int32_t>(100 * (s + 1) + i));
      p.in.positions.push_back(pos);
      p.in.slot_mapping.push_back(int64_t{p.tables[s][pos / kBlockSize]} * kBlockSize +
                                  pos % kBlockSize);
    }
    p.in.sequences.push_back(slice);
  }
  return p;
}

TEST(CudaStepMetaTest, DecodeBucketPadsWithInertSequences) {
  TestPlan p = MakePlan({5, 9}, {1, 1});
  const MetaLayout l = MakeLayout(4, 4, 4, kMaxBlocks);
  std::vector<int64_t> buf(l.bytes / 8 + 1, 0x5a5a5a5a5a5a5a5a);
  char* dst = reinterpret_cast<char*>(buf.data());
  PackStep(p.in, l, 4, kGeometry, dst);
  const HostMeta h = HostMetaPointers(dst, l);
  EXPECT_EQ(std::vector<int64_t>(h.slots, h.slots + 4),
            (std::vector<int64_t>{11 * 4 + 1, 22 * 4 + 1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(h.ids, h.ids + 4), (std::vector<int32_t>{100, 200, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(h.positions, h.positions + 4), (std::vector<int32_t>{5, 9, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(h.query_start, h.query_start + 5),
            (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(h.context_lens, h.context_lens + 4),
            (std::vector<int32_t>{5, 9, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(h.logits_rows, h.logits_rows + 4),
            (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(h.block_tables[0 * kMaxBlocks + 1], 11);
  EXPECT_EQ(h.block_tables[1 * kMaxBlocks + 2], 22);
  EXPECT_EQ(h.block_tables[2 * kMaxBlocks], 0);
  EXPECT_EQ(h.block_tables[3 * kMaxBlocks], 0);
}

// Ragged verify rows (1, 3 and 2 query tokens) in a bucket of 4 sequences × 3 tokens.
TEST(CudaStepMetaTest, MultiTokenBucketPadsEverySequenceToItsQueryLength) {
  TestPlan p = MakePlan({5, 17, 0}, {1, 3, 2});
  // Logits rows in another order than the tokens': the padded rows follow the plan's order.
  p.in.logits_indices = {5, 1, 0, 3};
  const MetaLayout l = MakeLayout(12, 4, 12, kMaxBlocks);
  std::vector<int64_t> buf(l.bytes / 8 + 1, 0x5a5a5a5a5a5a5a5a);
  char* dst = reinterpret_cast<char*>(buf.data());
  PackPaddedStep(p.in, l, 4, 3, kGeometry, dst);
  const HostMeta h = HostMetaPointers(dst, l);
  // Sequence 0: position 5 (block 11), then padding at positions 6, 7.
  // Sequence 1: positions 17..19 (blocks 24 for 17..19).
  // Sequence 2: positions 0, 1 (block 30), padding at 2.
  // Sequence 3 (padded): positions 0..2, no context.
  EXPECT_EQ(std::vector<int64_t>(h.slots, h.slots + 12),
            (std::vector<int64_t>{45, -1, -1, 24 * 4 + 1, 24 * 4 + 2, 24 * 4 + 3, 120, 121, -1,
                                  -1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(h.ids, h.ids + 12),
            (std::vector<int32_t>{100, 0, 0, 200, 201, 202, 300, 301, 0, 0, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(h.positions, h.positions + 12),
            (std::vector<int32_t>{5, 6, 7, 17, 18, 19, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(std::vector<int32_t>(h.query_start, h.query_start + 5),
            (std::vector<int32_t>{0, 3, 6, 9, 12}));
  EXPECT_EQ(std::vector<int32_t>(h.context_lens, h.context_lens + 4),
            (std::vector<int32_t>{5, 17, 0, 0}));
  // Plan rows 5, 1, 0, 3 are tokens (seq 2, 1), (seq 1, 0), (seq 0, 0), (seq 1, 2); the bucket's
  // remaining rows name themselves.
  EXPECT_EQ(std::vector<int32_t>(h.logits_rows, h.logits_rows + 12),
            (std::vector<int32_t>{7, 3, 0, 5, 4, 5, 6, 7, 8, 9, 10, 11}));
  // Block tables: the real blocks, then block 0 for the padding rows' positions.
  EXPECT_EQ(h.block_tables[0 * kMaxBlocks + 0], 10);
  EXPECT_EQ(h.block_tables[0 * kMaxBlocks + 1], 11);  // positions 4..7: the real block
  EXPECT_EQ(h.block_tables[1 * kMaxBlocks + 4], 24);
  EXPECT_EQ(h.block_tables[2 * kMaxBlocks + 0], 30);
  EXPECT_EQ(h.block_tables[3 * kMaxBlocks + 0], 0);
  // Sequence 0 with context 7: padding positions 8, 9 reach block index 2, filled with 0.
  TestPlan q = MakePlan({7}, {1});
  PackPaddedStep(q.in, l, 4, 3, kGeometry, dst);
  const HostMeta h2 = HostMetaPointers(dst, l);
  EXPECT_EQ(h2.block_tables[0 * kMaxBlocks + 1], 11);
  EXPECT_EQ(h2.block_tables[0 * kMaxBlocks + 2], 0);
  EXPECT_EQ(std::vector<int32_t>(h2.positions, h2.positions + 3), (std::vector<int32_t>{7, 8, 9}));
}

TEST(CudaStepMetaTest, FindGraphBucketPicksTheFewestTokensThatHoldTheStep) {
  const std::vector<GraphBucket> buckets = {{1, 1}, {2, 1}, {4, 1}, {1, 3},
                                            {2, 3}, {4, 3}, {1, 6}, {2, 6}};
  const auto find = [&](const std::vector<int32_t>& contexts, const std::vector<int32_t>& queries,
                        bool bounded = false, bool bounded_captured = false) {
    TestPlan p = MakePlan(contexts, queries);
    return FindGraphBucket(p.in, buckets, 32, bounded, bounded_captured);
  };
  EXPECT_EQ(find({3, 4, 5}, {1, 1, 1}), 2);        // decode of 3: bucket 4 × 1
  EXPECT_EQ(find({3}, {1}), 0);                    // decode of 1
  EXPECT_EQ(find({3}, {3}), 3);                    // 1 × 3
  EXPECT_EQ(find({3, 4}, {2, 1}), 4);              // 2 × 3 (6 tokens) before 2 × 6 and 4 × 3
  EXPECT_EQ(find({3, 4}, {5, 1}), 7);              // 2 × 6
  EXPECT_EQ(find({3, 4, 5}, {5, 1, 1}), -1);       // no 4 × 6 bucket: eager
  EXPECT_EQ(find({3}, {7}), -1);                   // longer than every bucket's rows
  EXPECT_EQ(find({27}, {2}), 3);                   // 27 + 3 ≤ 32
  EXPECT_EQ(find({30}, {2}), -1);                  // 30 + 3 > 32: padding would pass the table
  EXPECT_EQ(find({3}, {1}, true, false), -1);      // bounded sliding, no bounded graphs
  EXPECT_EQ(find({3}, {1}, true, true), 0);
  EXPECT_EQ(find({3}, {3}, true, true), -1);       // multi-token buckets are never bounded
  EXPECT_EQ(FindGraphBucket(MakePlan({3}, {3}).in, {}, 32, false, false), -1);
}

}  // namespace
}  // namespace sluice::cuda_runner
