#include "kernels/linear/gemm_tuning_table.h"

#include <fstream>
#include <sstream>
#include <string>

#include "build_paths.h"
#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

GemmTuningDevice H200() { return {"NVIDIA H200", 90, 132, 130000}; }

GemmTuningKey Key(int64_t m, int64_t n, int64_t k, bool glu = false) {
  GemmTuningKey key;
  key.m = m;
  key.n = n;
  key.k = k;
  key.glu = glu;
  return key;
}

TEST(GemmTuningTableTest, RoundTripsEveryKind) {
  GemmTuningTable table(H200());
  GemmTuningChoice lt;
  lt.kind = GemmTuningChoice::Kind::kCublasLt;
  lt.algo = {0x1, 0xffffffffffffffffull, 0x0123456789abcdefull, 0, 7, 8, 9, 10};
  lt.us = 24.5f;
  lt.search_mask = 3;
  lt.describe = "algo 66 tile 128x256";
  GemmTuningChoice gemv;
  gemv.kind = GemmTuningChoice::Kind::kGemv;
  gemv.gemv_unroll = 8;
  gemv.gemv_split = 4;
  GemmTuningChoice split;
  split.kind = GemmTuningChoice::Kind::kSplit;
  split.split_n1 = 12672;
  split.split_two_streams = true;
  split.split_algos = {CublasLtAlgoWords{1, 2, 3, 4, 5, 6, 7, 8}, CublasLtAlgoWords{9, 10, 11, 12, 13, 14, 15, 16}};
  split.search_mask = 7;
  GemmTuningChoice skinny;
  skinny.kind = GemmTuningChoice::Kind::kSkinny;
  skinny.skinny_split = 8;
  skinny.skinny_stages = 3;
  skinny.search_mask = 8;
  GemmTuningKey biased = Key(1, 4096, 4096);
  biased.bias = true;
  biased.align_bias = 2;
  table.Insert(Key(256, 6144, 4096), lt);
  table.Insert(biased, gemv);
  table.Insert(Key(256, 28672, 4096, /*glu=*/true), split);
  table.Insert(Key(64, 4096, 14336), skinny);

  absl::StatusOr<GemmTuningTable> back = GemmTuningTable::Parse(table.Serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->device().name, "NVIDIA H200");
  EXPECT_EQ(back->device().cublaslt_version, 130000);
  EXPECT_EQ(back->size(), 4u);
  const GemmTuningChoice* a = back->Find(Key(256, 6144, 4096), 0);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->kind, GemmTuningChoice::Kind::kCublasLt);
  EXPECT_EQ(a->algo, lt.algo);
  EXPECT_FLOAT_EQ(a->us, 24.5f);
  EXPECT_EQ(a->describe, "algo 66 tile 128x256");
  const GemmTuningChoice* b = back->Find(biased, 0);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->kind, GemmTuningChoice::Kind::kGemv);
  EXPECT_EQ(b->gemv_unroll, 8);
  EXPECT_EQ(b->gemv_split, 4);
  const GemmTuningChoice* c = back->Find(Key(256, 28672, 4096, true), 0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->kind, GemmTuningChoice::Kind::kSplit);
  EXPECT_EQ(c->split_n1, 12672);
  EXPECT_TRUE(c->split_two_streams);
  EXPECT_EQ(c->split_algos[1], split.split_algos[1]);
  const GemmTuningChoice* d = back->Find(Key(64, 4096, 14336), 8);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kind, GemmTuningChoice::Kind::kSkinny);
  EXPECT_EQ(d->skinny_split, 8);
  EXPECT_EQ(d->skinny_stages, 3);
  EXPECT_EQ(d->search_mask, 8);
  // Serializing again gives the same text (sorted entries).
  EXPECT_EQ(back->Serialize(), table.Serialize());
}

TEST(GemmTuningTableTest, FindHonoursKeyAndSearchMask) {
  GemmTuningTable table(H200());
  GemmTuningChoice c;
  c.search_mask = 1;
  table.Insert(Key(256, 4096, 4096), c);
  EXPECT_NE(table.Find(Key(256, 4096, 4096), 0), nullptr);
  EXPECT_NE(table.Find(Key(256, 4096, 4096), 1), nullptr);
  // Tuned without the split search: a process asking for it tunes again.
  EXPECT_EQ(table.Find(Key(256, 4096, 4096), 3), nullptr);
  EXPECT_EQ(table.Find(Key(256, 4096, 4096, /*glu=*/true), 0), nullptr);
  EXPECT_EQ(table.Find(Key(128, 4096, 4096), 0), nullptr);
  GemmTuningKey aligned8 = Key(256, 4096, 4096);
  aligned8.align_x = 8;
  EXPECT_EQ(table.Find(aligned8, 0), nullptr);
}

TEST(GemmTuningTableTest, AppliesOnlyToTheSameDeviceAndLibrary) {
  GemmTuningTable table(H200());
  EXPECT_TRUE(table.Applies(H200()));
  EXPECT_TRUE(table.CublasLtApplies(H200()));
  GemmTuningDevice newer = H200();
  newer.cublaslt_version = 130100;
  EXPECT_TRUE(table.Applies(newer));
  EXPECT_FALSE(table.CublasLtApplies(newer));
  GemmTuningDevice fewer = H200();
  fewer.sms = 114;
  EXPECT_FALSE(table.Applies(fewer));
  EXPECT_FALSE(table.Applies({"NVIDIA H100 80GB HBM3", 90, 132, 130000}));
}

TEST(GemmTuningTableTest, FileNameReplacesUnsafeCharacters) {
  EXPECT_EQ(GemmTuningFileName("NVIDIA H200"), "NVIDIA_H200.json");
  EXPECT_EQ(GemmTuningFileName("NVIDIA H100 80GB HBM3"), "NVIDIA_H100_80GB_HBM3.json");
  EXPECT_EQ(GemmTuningFileName("a/b\\c:d"), "a_b_c_d.json");
}

TEST(GemmTuningTableTest, AlgoWords) {
  const CublasLtAlgoWords w = {0, 1, 0xabcdef, 0xffffffffffffffffull, 5, 6, 7, 8};
  const std::string text = FormatAlgoWords(w);
  EXPECT_EQ(text.substr(0, 34), "0000000000000000 0000000000000001 ");
  absl::StatusOr<CublasLtAlgoWords> back = ParseAlgoWords(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, w);
  EXPECT_FALSE(ParseAlgoWords("1 2 3").ok());
  EXPECT_FALSE(ParseAlgoWords("1 2 3 4 5 6 7 xyz").ok());
  EXPECT_FALSE(ParseAlgoWords("1 2 3 4 5 6 7 11112222333344445").ok());  // 17 digits
}

// Every malformed table is an InvalidArgument that names what is wrong.
TEST(GemmTuningTableTest, RejectsBadTables) {
  const std::string head =
      R"({"format": "sluice-gemm-tuning-v1", "device": "NVIDIA H200", "compute_capability": 90,
          "sms": 132, "cublaslt_version": 130000, "entries": [)";
  const std::string good_entry =
      R"({"m": 256, "n": 4096, "k": 4096, "bias": false, "glu": false, "align": [256, 256, 256, 256],
          "search": 0, "us": 1.5, "kind": "gemv", "gemv_unroll": 4, "gemv_split": 1})";
  ASSERT_TRUE(GemmTuningTable::Parse(head + good_entry + "]}").ok());
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"not json", "not a JSON object"},
      {R"({"format": "other"})", "format"},
      {R"({"format": "sluice-gemm-tuning-v1"})", "missing \"device\""},
      {head + "]", "not a JSON object"},
      {head + R"(1]})", "entry 0 is not an object"},
      {head + R"({"m": 256}]})", "missing \"n\""},
      {head + R"({"m": "256", "n": 1, "k": 1, "bias": false, "glu": false}]})", "\"m\" is not an integer"},
      {head + R"({"m": 0, "n": 1, "k": 1, "bias": false, "glu": false}]})", "non-positive shape"},
      {head + R"({"m": 1, "n": 1, "k": 1, "bias": false, "glu": false, "align": [256, 3, 256, 256]}]})",
       "alignment 3"},
      {head + R"({"m": 1, "n": 1, "k": 1, "bias": false, "glu": false, "align": [256, 256]}]})",
       "\"align\""},
      {head + R"({"m": 1, "n": 1, "k": 1, "bias": 0, "glu": false}]})", "\"bias\" is not a boolean"},
      {head + R"({"m": 1, "n": 1, "k": 1, "bias": false, "glu": false, "align": [1, 1, 1, 1],
                 "search": 0, "us": 1, "kind": "tensorrt"}]})",
       "unknown kind"},
      {head + R"({"m": 1, "n": 8, "k": 1, "bias": false, "glu": false, "align": [1, 1, 1, 1],
                 "search": 0, "us": 1, "kind": "cublaslt", "algo": "1 2"}]})",
       "8 hex words"},
      {head + R"({"m": 1, "n": 8, "k": 1, "bias": false, "glu": false, "align": [1, 1, 1, 1],
                 "search": 0, "us": 1, "kind": "split", "n1": 8, "two_streams": false,
                 "algo_parts": ["1 2 3 4 5 6 7 8", "1 2 3 4 5 6 7 8"]}]})",
       "split n1 8 outside (0, 8)"},
      {head + R"({"m": 1, "n": 16, "k": 1, "bias": false, "glu": false, "align": [1, 1, 1, 1],
                 "search": 0, "us": 1, "kind": "split", "n1": 8, "two_streams": false,
                 "algo_parts": ["1 2 3 4 5 6 7 8"]}]})",
       "\"algo_parts\""},
      {head + R"({"m": 1, "n": 16, "k": 1, "bias": false, "glu": false, "align": [1, 1, 1, 1],
                 "search": 0, "us": 1, "kind": "gemv", "gemv_unroll": 0, "gemv_split": 1}]})",
       "bad GEMV shape"},
      {head + R"({"m": 1, "n": 16, "k": 8, "bias": false, "glu": false, "align": [1, 1, 1, 1],
                 "search": 8, "us": 1, "kind": "skinny", "skinny_split": 2}]})",
       "\"skinny_stages\""},
      {head + R"({"m": 1, "n": 16, "k": 8, "bias": false, "glu": false, "align": [1, 1, 1, 1],
                 "search": 8, "us": 1, "kind": "skinny", "skinny_split": 0, "skinny_stages": 2}]})",
       "bad skinny GEMM shape"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<GemmTuningTable> t = GemmTuningTable::Parse(c.text);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(t.status().message().find(c.message), std::string::npos)
        << c.text << " → " << t.status().message();
  }
}

// The table runners load by default (configs/gemm_tuning, CudaRunnerOptions::gemm_tuning
// "auto") parses, and its skinny-GEMM choices sit where LinearCuda times that kernel (2..8
// rows, kSkinnyTuneMinRows..kSkinnyTuneMaxRows in linear_cuda.h) with its search bit (8), so a
// GPU process applies them instead of timing again.
TEST(GemmTuningTableTest, RepositoryTableParses) {
  std::ifstream in(std::string(SLUICE_SOURCE_DIR) + "/configs/gemm_tuning/NVIDIA_H200.json");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<GemmTuningTable> table = GemmTuningTable::Parse(text.str());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->device().name, "NVIDIA H200");
  EXPECT_EQ(table->device().sms, 132);
  EXPECT_GT(table->size(), 50u);
  int skinny = 0;
  for (const auto& [key, choice] : table->entries()) {
    if (choice.kind != GemmTuningChoice::Kind::kSkinny) continue;
    ++skinny;
    EXPECT_GE(key.m, 2);
    EXPECT_LE(key.m, 8);
    EXPECT_EQ(choice.search_mask & 8, 8) << key.m << " " << key.n << " " << key.k;
  }
  EXPECT_GT(skinny, 0);
}

}  // namespace
}  // namespace sluice::kernels
