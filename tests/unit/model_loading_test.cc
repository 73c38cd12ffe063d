// Checkpoint (safetensors), ModelConfig and LoadModel: happy paths and every error, on small
// files written by the test itself, plus the shared fixtures.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A tensor to write: dtype name, shape, raw little-endian bytes.
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

RawTensor F32(std::vector<int64_t> shape, const std::vector<float>& values) {
  RawTensor t{"F32", std::move(shape), std::string(values.size() * 4, '\0')};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

RawTensor U16(const std::string& dtype, std::vector<int64_t> shape,
              const std::vector<uint16_t>& bits) {
  RawTensor t{dtype, std::move(shape), std::string(bits.size() * 2, '\0')};
  std::memcpy(t.bytes.data(), bits.data(), t.bytes.size());
  return t;
}

RawTensor I64(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  RawTensor t{"I64", std::move(shape), std::string(values.size() * 8, '\0')};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

// Writes a safetensors file (format: 8-byte header length, JSON header, data).
void WriteSafetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string h = header.dump();
  const uint64_t n = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h << data;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class TempDir {
 public:
  TempDir() {
    path_ = (fs::temp_directory_path() /
             ("sluice_model_loading_" + std::to_string(::getpid()) + "_" + std::to_string(next_++)))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  static inline int next_ = 0;
  std::string path_;
};

// ------------------------------------------------------------------------------------------
// Safetensors / Checkpoint

TEST(SafetensorsTest, ReadsFloatDtypesExactly) {
  TempDir dir;
  // bf16 0x3FC0 = 1.5, 0xC000 = -2; fp16 0x3C00 = 1, 0x0001 = 2^-24 (subnormal), 0xFC00 = -inf.
  WriteSafetensors(dir.path() + "/model.safetensors",
                   {{"a.f32", F32({2, 2}, {1.0f, -0.25f, 3.5f, 1e-20f})},
                    {"b.bf16", U16("BF16", {2}, {0x3FC0, 0xC000})},
                    {"c.f16", U16("F16", {3}, {0x3C00, 0x0001, 0xFC00})},
                    {"d.i64", I64({3}, {7, -1, int64_t{1} << 40})}});
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->Names(), ::testing::ElementsAre("a.f32", "b.bf16", "c.f16", "d.i64"));
  auto a = (*ckpt)->ReadFloat32("a.f32", {2, 2});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (std::vector<float>{1.0f, -0.25f, 3.5f, 1e-20f}));
  auto b = LoadWeight(**ckpt, "b.bf16", {2});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<float>{1.5f, -2.0f}));
  auto c = (*ckpt)->ReadFloat32("c.f16", {3});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0], 1.0f);
  EXPECT_EQ((*c)[1], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf((*c)[2]) && (*c)[2] < 0);
  const TensorView* d = (*ckpt)->Find("d.i64");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->dtype, DType::kI64);
  auto di = ToInt64(*d);
  ASSERT_TRUE(di.ok());
  EXPECT_EQ(*di, (std::vector<int64_t>{7, -1, int64_t{1} << 40}));
}

TEST(SafetensorsTest, Float16ConversionsRoundTrip) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3F80);  // tie → even
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3F82);  // tie → even (up)
  EXPECT_EQ(Fp16ToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x8000), -0.0f);
  EXPECT_TRUE(std::isnan(Fp16ToFloat(0x7E00)));
}

TEST(CheckpointTest, MissingTensorWrongShapeWrongDtypeNameTheTensor) {
  TempDir dir;
  WriteSafetensors(dir.path() + "/model.safetensors",
                   {{"w", F32({2, 3}, {1, 2, 3, 4, 5, 6})}, {"ids", I64({2}, {1, 2})}});
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  auto missing = (*ckpt)->ReadFloat32("model.norm.weight", {3});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("missing tensor model.norm.weight"));
  auto shape = (*ckpt)->ReadFloat32("w", {3, 2});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shape.status().message(), "tensor w: shape [2, 3] expected [3, 2]");
  auto dtype = (*ckpt)->ReadFloat32("ids", {2});
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dtype.status().message(), "tensor ids: dtype I64 is not a float type");
}

TEST(CheckpointTest, ShardedIndex) {
  TempDir dir;
  WriteSafetensors(dir.path() + "/model-00001-of-00002.safetensors", {{"x", F32({1}, {1.0f})}});
  WriteSafetensors(dir.path() + "/model-00002-of-00002.safetensors",
                   {{"y", F32({2}, {2.0f, 3.0f})}});
  WriteText(dir.path() + "/model.safetensors.index.json",
            R"({"metadata": {"total_size": 12}, "weight_map": {
                 "x": "model-00001-of-00002.safetensors",
                 "y": "model-00002-of-00002.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->Names(), ::testing::ElementsAre("x", "y"));
  auto y = (*ckpt)->ReadFloat32("y", {2});
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (std::vector<float>{2.0f, 3.0f}));
}

TEST(CheckpointTest, ShardedIndexErrors) {
  TempDir dir;
  WriteSafetensors(dir.path() + "/a.safetensors", {{"x", F32({1}, {1.0f})}});
  // Tensor listed in a shard that lacks it.
  WriteText(dir.path() + "/model.safetensors.index.json",
            R"({"weight_map": {"x": "a.safetensors", "z": "a.safetensors"}})");
  auto bad = Checkpoint::Open(dir.path());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("tensor z"));
  // Missing shard file.
  WriteText(dir.path() + "/model.safetensors.index.json",
            R"({"weight_map": {"x": "a.safetensors", "q": "b.safetensors"}})");
  bad = Checkpoint::Open(dir.path());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("b.safetensors"));
  // Malformed index.
  WriteText(dir.path() + "/model.safetensors.index.json", "{not json");
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
  WriteText(dir.path() + "/model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointTest, NoSafetensorsIsNotFound) {
  TempDir dir;
  auto c = Checkpoint::Open(dir.path());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsFile::Open(dir.path() + "/nope.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, CorruptFilesAreInvalidArgument) {
  TempDir dir;
  const std::string p = dir.path() + "/model.safetensors";
  auto expect_invalid = [&](const std::string& bytes, const std::string& needle) {
    WriteText(p, bytes);
    auto f = SafetensorsFile::Open(p);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(needle));
  };
  auto with_header = [](const std::string& json, const std::string& data) {
    std::string s(8, '\0');
    const uint64_t n = json.size();
    std::memcpy(s.data(), &n, 8);
    return s + json + data;
  };
  expect_invalid("abc", "too small");
  std::string huge(8, '\0');
  huge[6] = 1;  // header length 2^48
  expect_invalid(huge + "{}", "header length");
  expect_invalid(with_header("[1,2]", ""), "not a JSON object");
  expect_invalid(with_header(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                             std::string(8, '\0')),
                 "tensor w");  // offsets beyond the file
  expect_invalid(with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                             std::string(8, '\0')),
                 "does not match shape");
  expect_invalid(with_header(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})",
                             std::string(1, '\0')),
                 "unknown dtype Q4");
  // Fuzz findings (tests/fuzz/corpus/safetensors_fuzz): a shape whose element count
  // overflows int64 (here (2^62 + 1) x 4 wraps to 4 elements, matching 16 bytes) and
  // dimensions past INT64_MAX.
  expect_invalid(with_header(R"({"w":{"dtype":"F32","shape":[4611686018427387905,4],)"
                             R"("data_offsets":[0,16]}})",
                             std::string(16, '\0')),
                 "more elements than int64 holds");
  expect_invalid(with_header(R"({"w":{"dtype":"U8","shape":[18446744073709551615],)"
                             R"("data_offsets":[0,1]}})",
                             std::string(1, '\0')),
                 "more elements than int64 holds");
  // 2^61 x 8 elements overflow int64; 2^61 F64 elements fit, but their bytes overflow uint64.
  expect_invalid(with_header(R"({"w":{"dtype":"F64","shape":[2305843009213693952,8],)"
                             R"("data_offsets":[0,0]}})", ""),
                 "more elements than int64 holds");
  expect_invalid(with_header(R"({"w":{"dtype":"F64","shape":[2305843009213693952],)"
                             R"("data_offsets":[0,0]}})", ""),
                 "does not match shape");
}

// ------------------------------------------------------------------------------------------
// ModelConfig

TEST(ModelConfigTest, Transformers5RopeParametersAndLayerTypes) {
  auto c = ModelConfig::FromJsonText(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 100,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "use_sliding_window": true, "sliding_window": 16, "eos_token_id": [1, 5],
    "tie_word_embeddings": true})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_EQ(c->rope.rope_theta, 1e6);
  EXPECT_EQ(c->rope.rope_type, "default");
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->layer_is_sliding, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{1, 5}));
  EXPECT_TRUE(c->tie_word_embeddings);
}

TEST(ModelConfigTest, SlidingWindowFollowsQwen3Semantics) {
  const std::string base = R"("architectures": ["Qwen3ForCausalLM"], "vocab_size": 10,
      "hidden_size": 8, "num_hidden_layers": 4, "num_attention_heads": 2, "sliding_window": 8)";
  // use_sliding_window false: no sliding layers even though layer_types names some.
  auto off = ModelConfig::FromJsonText("{" + base +
                                       R"(, "use_sliding_window": false, "layer_types":
      ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]})");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->layer_is_sliding, (std::vector<bool>(4, false)));
  EXPECT_EQ(off->sliding_window, 0);
  // No layer_types: layers from max_window_layers on slide.
  auto mw = ModelConfig::FromJsonText("{" + base +
                                      R"(, "use_sliding_window": true, "max_window_layers": 2})");
  ASSERT_TRUE(mw.ok()) << mw.status();
  EXPECT_EQ(mw->layer_is_sliding, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(mw->sliding_window, 8);
  // transformers' defaults: sliding_window 4096 from max_window_layers 28 on.
  auto defaults = ModelConfig::FromJsonText(
      R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
          "num_hidden_layers": 30, "num_attention_heads": 2, "use_sliding_window": true})");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->sliding_window, 4096);
  EXPECT_EQ(std::count(defaults->layer_is_sliding.begin(), defaults->layer_is_sliding.end(), true),
            2);
  EXPECT_TRUE(defaults->layer_is_sliding[28] && defaults->layer_is_sliding[29]);
  // Wrong number of layer types.
  auto bad = ModelConfig::FromJsonText("{" + base +
                                       R"(, "use_sliding_window": true, "layer_types": ["full_attention"]})");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, Transformers4RopeThetaAndScaling) {
  auto c = ModelConfig::FromJsonText(R"({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 4, "rope_theta": 500000.0,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "eos_token_id": 2, "bos_token_id": 1})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->rope.rope_theta, 500000.0);
  EXPECT_EQ(c->rope.rope_type, "yarn");
  EXPECT_EQ(c->rope.factor, 40.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(c->rope.mscale_all_dim, 1.0);
  EXPECT_EQ(c->head_dim, 16);                 // hidden / heads
  EXPECT_EQ(c->num_key_value_heads, 4);       // defaults to heads
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_TRUE(c->layer_is_sliding == std::vector<bool>(1, false));
}

TEST(ModelConfigTest, DeepseekFieldsAndNullQLoraRank) {
  auto c = ModelConfig::FromJsonText(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 10, "hidden_size": 64,
    "num_hidden_layers": 3, "num_attention_heads": 4, "q_lora_rank": null, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_group": 2,
    "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
    "first_k_dense_replace": 1, "rope_interleave": true, "scoring_func": "sigmoid"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kDeepseekV3);
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_EQ(c->kv_lora_rank, 32);
  EXPECT_EQ(c->qk_nope_head_dim, 16);
  EXPECT_EQ(c->qk_rope_head_dim, 8);
  EXPECT_EQ(c->v_head_dim, 16);
  EXPECT_EQ(c->n_routed_experts, 8);
  EXPECT_EQ(c->n_group, 2);
  EXPECT_EQ(c->topk_group, 1);
  EXPECT_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_EQ(c->first_k_dense_replace, 1);
  EXPECT_TRUE(c->rope_interleave);
}

// DeepseekV2ForCausalLM runs as kDeepseekV3 with DeepSeek-V2's defaults (softmax scores, no
// correction bias, no renormalization, interleaved RoPE): greedy top-k over all experts, or
// group_limited_greedy (groups ranked by their best expert); other topk_methods are refused.
TEST(ModelConfigTest, DeepseekV2ConfigsAndTheirTopkMethods) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1)";
  auto v2 = ModelConfig::FromJsonText(R"({"architectures": ["DeepseekV2ForCausalLM"], )" + base +
                                      R"(, "n_group": null, "topk_group": null,
      "routed_scaling_factor": 2.0, "topk_method": "greedy"})");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->architecture, Architecture::kDeepseekV3);
  EXPECT_TRUE(v2->deepseek_v2);
  EXPECT_FALSE(v2->has_score_correction_bias);
  EXPECT_EQ(v2->scoring_func, "softmax");
  EXPECT_FALSE(v2->norm_topk_prob);
  EXPECT_TRUE(v2->rope_interleave);
  EXPECT_EQ(v2->n_group, 1);
  EXPECT_EQ(v2->topk_group, 1);
  EXPECT_EQ(v2->routed_scaling_factor, 2.0);
  // model_type alone, and DeepSeek-V2-Lite's form: greedy with n_group 1 written out.
  auto by_type = ModelConfig::FromJsonText(R"({"model_type": "deepseek_v2", )" + base +
                                           R"(, "n_group": 1, "topk_group": 1})");
  ASSERT_TRUE(by_type.ok()) << by_type.status();
  EXPECT_TRUE(by_type->deepseek_v2);
  // greedy ignores the group fields; one-group group_limited_greedy is greedy too.
  auto greedy_groups = ModelConfig::FromJsonText(R"({"model_type": "deepseek_v2", )" + base +
                                                 R"(, "n_group": 8, "topk_group": 3})");
  ASSERT_TRUE(greedy_groups.ok()) << greedy_groups.status();
  EXPECT_EQ(greedy_groups->n_group, 1);
  auto one_group = ModelConfig::FromJsonText(
      R"({"model_type": "deepseek_v2", )" + base +
      R"(, "n_group": 1, "topk_group": 1, "topk_method": "group_limited_greedy"})");
  ASSERT_TRUE(one_group.ok()) << one_group.status();
  EXPECT_EQ(one_group->n_group, 1);  // one group: the rule cannot matter
  // DeepSeek-V2 (236B): groups ranked by their best expert.
  auto grouped = ModelConfig::FromJsonText(
      R"({"architectures": ["DeepseekV2ForCausalLM"], )" + base +
      R"(, "n_group": 4, "topk_group": 2, "topk_method": "group_limited_greedy"})");
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_TRUE(grouped->moe_group_score_max);
  EXPECT_EQ(grouped->n_group, 4);
  EXPECT_EQ(grouped->topk_group, 2);
  auto freq = ModelConfig::FromJsonText(R"({"model_type": "deepseek_v2", )" + base +
                                        R"(, "moe_layer_freq": 2})");
  EXPECT_EQ(freq.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(freq.status().message().find("moe_layer_freq 2"), std::string::npos);
  EXPECT_TRUE(ModelConfig::FromJsonText(R"({"model_type": "deepseek_v2", )" + base +
                                        R"(, "moe_layer_freq": 1})")
                  .ok());
  auto unknown = ModelConfig::FromJsonText(R"({"model_type": "deepseek_v2", )" + base +
                                           R"(, "topk_method": "noaux_tc"})");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("topk_method noaux_tc"), std::string::npos);
  // DeepSeek-V3 keeps its own defaults.
  auto v3 = ModelConfig::FromJsonText(R"({"model_type": "deepseek_v3", )" + base + "}");
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_FALSE(v3->deepseek_v2);
  EXPECT_TRUE(v3->has_score_correction_bias);
  EXPECT_EQ(v3->scoring_func, "sigmoid");
}

TEST(ModelConfigTest, Errors) {
  auto unknown = ModelConfig::FromJsonText(
      R"({"architectures": ["MambaForCausalLM"], "vocab_size": 1, "hidden_size": 1,
          "num_hidden_layers": 1, "num_attention_heads": 1})");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unsupported architecture MambaForCausalLM"));
  EXPECT_EQ(ModelConfig::FromJsonText("{oops").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto missing = ModelConfig::FromJsonText(R"({"architectures": ["LlamaForCausalLM"]})");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("vocab_size"));
  auto wrong_type = ModelConfig::FromJsonText(
      R"({"architectures": ["LlamaForCausalLM"], "vocab_size": "many", "hidden_size": 1,
          "num_hidden_layers": 1, "num_attention_heads": 1})");
  EXPECT_EQ(wrong_type.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_rope = ModelConfig::FromJsonText(
      R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 1, "hidden_size": 4,
          "num_hidden_layers": 1, "num_attention_heads": 1,
          "rope_parameters": {"rope_type": "dynamic-made-up", "rope_theta": 1.0}})");
  EXPECT_EQ(bad_rope.status().code(), absl::StatusCode::kInvalidArgument);
  // Fuzz findings (tests/fuzz/corpus/model_config_fuzz): a float field outside int64 (the
  // cast was undefined) and a layer count whose per-layer table could not be allocated.
  auto huge_float = ModelConfig::FromJsonText(
      R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 1e300, "hidden_size": 4,
          "num_hidden_layers": 1, "num_attention_heads": 1})");
  EXPECT_EQ(huge_float.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge_float.status().message()),
              HasSubstr("config field vocab_size must be an integer"));
  auto integral_float = ModelConfig::FromJsonText(
      R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 32.0, "hidden_size": 4,
          "num_hidden_layers": 1, "num_attention_heads": 1})");
  ASSERT_TRUE(integral_float.ok()) << integral_float.status();
  EXPECT_EQ(integral_float->vocab_size, 32);
  auto many_layers = ModelConfig::FromJsonText(
      R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 1, "hidden_size": 4,
          "num_hidden_layers": 1000000000000000, "num_attention_heads": 1})");
  EXPECT_EQ(many_layers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(many_layers.status().message()),
              HasSubstr("num_hidden_layers 1000000000000000 exceeds 16384"));
  TempDir dir;
  EXPECT_EQ(ModelConfig::Load(dir.path()).status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelConfigTest, GenerationConfigAddsEosIds) {
  TempDir dir;
  WriteText(dir.path() + "/config.json",
            R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8,
                "num_hidden_layers": 1, "num_attention_heads": 2, "eos_token_id": 1})");
  WriteText(dir.path() + "/generation_config.json", R"({"eos_token_id": [1, 9, 4]})");
  auto c = ModelConfig::Load(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{1, 9, 4}));
}

TEST(ModelConfigTest, SharedFixtures) {
  auto llama = ModelConfig::Load(sluice::testing::FixtureDir("llama-tiny"));
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->hidden_size, 64);
  EXPECT_EQ(llama->num_key_value_heads, 2);
  EXPECT_EQ(llama->rms_norm_eps, 1e-5);
  EXPECT_EQ(llama->eos_token_ids, (std::vector<int32_t>{1}));
  auto swa = ModelConfig::Load(sluice::testing::SharedModelDir("sluice-mini-swa"));
  ASSERT_TRUE(swa.ok()) << swa.status();
  EXPECT_EQ(swa->layer_is_sliding,
            (std::vector<bool>{true, true, true, false, true, true, true, false}));
  EXPECT_EQ(swa->sliding_window, 64);
}

// ------------------------------------------------------------------------------------------
// LoadModel on a tiny Llama written by the test.

class TinyLlamaDir {
 public:
  static constexpr int64_t kVocab = 11, kHidden = 8, kHeads = 2, kKvHeads = 1, kHeadDim = 4,
                           kInter = 12;

  TinyLlamaDir() {
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0, 0.3f);
    auto rnd = [&](std::vector<int64_t> shape) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = dist(rng);
      return F32(shape, v);
    };
    auto ones = [](int64_t n) { return F32({n}, std::vector<float>(static_cast<size_t>(n), 1.0f)); };
    tensors_["model.embed_tokens.weight"] = rnd({kVocab, kHidden});
    tensors_["model.norm.weight"] = ones(kHidden);
    tensors_["lm_head.weight"] = rnd({kVocab, kHidden});
    const std::string p = "model.layers.0.";
    tensors_[p + "input_layernorm.weight"] = ones(kHidden);
    tensors_[p + "post_attention_layernorm.weight"] = ones(kHidden);
    tensors_[p + "self_attn.q_proj.weight"] = rnd({kHeads * kHeadDim, kHidden});
    tensors_[p + "self_attn.k_proj.weight"] = rnd({kKvHeads * kHeadDim, kHidden});
    tensors_[p + "self_attn.v_proj.weight"] = rnd({kKvHeads * kHeadDim, kHidden});
    tensors_[p + "self_attn.o_proj.weight"] = rnd({kHidden, kHeads * kHeadDim});
    tensors_[p + "mlp.gate_proj.weight"] = rnd({kInter, kHidden});
    tensors_[p + "mlp.up_proj.weight"] = rnd({kInter, kHidden});
    tensors_[p + "mlp.down_proj.weight"] = rnd({kHidden, kInter});
    config_ = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 11, "hidden_size": 8,
      "intermediate_size": 12, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 4, "rms_norm_eps": 1e-5, "eos_token_id": 1,
      "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})";
  }
  std::map<std::string, RawTensor>& tensors() { return tensors_; }
  std::string& config() { return config_; }
  // Writes config.json + model.safetensors into a fresh temp dir and loads it.
  absl::StatusOr<std::unique_ptr<Model>> Load() {
    WriteText(dir_.path() + "/config.json", config_);
    WriteSafetensors(dir_.path() + "/model.safetensors", tensors_);
    return LoadModel(dir_.path());
  }

 private:
  TempDir dir_;
  std::map<std::string, RawTensor> tensors_;
  std::string config_;
};

TEST(LoadModelTest, TinyLlamaLoadsAndRuns) {
  TinyLlamaDir d;
  auto model = d.Load();
  ASSERT_TRUE(model.ok()) << model.status();
  const KvCacheSpec spec = (*model)->kv_cache_spec();
  EXPECT_EQ(spec.num_layers, 1);
  EXPECT_EQ(spec.k_floats_per_token, 4);
  EXPECT_EQ(spec.v_floats_per_token, 4);
  // embed row + layer (2 norms, q/k/v/o, gate/up/down) + final norm + lm_head, float32.
  const int64_t floats = 8 + (8 + 8 + 64 + 32 + 32 + 64 + 3 * 96) + 8 + 88;
  EXPECT_EQ((*model)->WeightBytesPerToken(), floats * 4);
  KvCache cache(spec, 2, 4);
  EXPECT_EQ(cache.BlockBytes(), 4 * (4 + 4) * 4);
  const int32_t table[] = {1, 0};
  ForwardInput in;
  in.token_ids = {3, 5, 7};
  in.positions = {0, 1, 2};
  in.slot_mapping = {4, 5, 6};
  in.sequences = {SequenceSlice{0, 3, 0, absl::MakeConstSpan(table)}};
  in.logits_indices = {2, 0};
  std::vector<float> logits(2 * 11);
  ASSERT_TRUE((*model)->Forward(in, cache, absl::MakeSpan(logits)).ok());
  // Position 0 attends only to itself: its logits must not depend on later tokens.
  ForwardInput first;
  first.token_ids = {3};
  first.positions = {0};
  first.slot_mapping = {0};
  const int32_t table2[] = {0};
  first.sequences = {SequenceSlice{0, 1, 0, absl::MakeConstSpan(table2)}};
  first.logits_indices = {0};
  std::vector<float> logits0(11);
  KvCache cache2(spec, 1, 4);
  ASSERT_TRUE((*model)->Forward(first, cache2, absl::MakeSpan(logits0)).ok());
  for (int v = 0; v < 11; ++v) EXPECT_EQ(logits[11 + v], logits0[v]);
  // K/V of the three tokens landed in block 1 (slots 4..6); slot 7 untouched.
  for (int s = 4; s < 7; ++s) EXPECT_NE(cache.k(0)[s * 4], 0.0f);
  EXPECT_EQ(cache.k(0)[7 * 4], 0.0f);
}

TEST(LoadModelTest, ForwardRejectsBadInput) {
  TinyLlamaDir d;
  auto model = d.Load();
  ASSERT_TRUE(model.ok()) << model.status();
  KvCache cache((*model)->kv_cache_spec(), 2, 4);
  const int32_t table[] = {0, 1};
  auto make = [&]() {
    ForwardInput in;
    in.token_ids = {3, 5};
    in.positions = {0, 1};
    in.slot_mapping = {0, 1};
    in.sequences = {SequenceSlice{0, 2, 0, absl::MakeConstSpan(table)}};
    in.logits_indices = {1};
    return in;
  };
  std::vector<float> logits(11);
  ASSERT_TRUE((*model)->Forward(make(), cache, absl::MakeSpan(logits)).ok());
  auto expect_invalid = [&](ForwardInput in, const std::string& needle, size_t n_logits = 11) {
    std::vector<float> out(n_logits);
    absl::Status s = (*model)->Forward(in, cache, absl::MakeSpan(out));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
  };
  ForwardInput in = make();
  in.token_ids[1] = 11;
  expect_invalid(in, "token id 11");
  in = make();
  in.token_ids[0] = -3;
  expect_invalid(in, "token id -3");
  in = make();
  in.positions[1] = 5;
  expect_invalid(in, "position 5");
  in = make();
  in.slot_mapping[1] = 6;
  expect_invalid(in, "slot 6");
  in = make();
  in.logits_indices = {2};
  expect_invalid(in, "logits index 2");
  in = make();
  expect_invalid(in, "logits span", 10);
  in = make();
  in.sequences[0].num_query_tokens = 1;
  expect_invalid(in, "belongs to no sequence");
  in = make();
  in.sequences[0].num_context_tokens = 7;  // needs 9 tokens of blocks, table covers 8
  expect_invalid(in, "does not cover");
  KvCache wrong(KvCacheSpec{1, 8, 8}, 2, 4);
  std::vector<float> out(11);
  EXPECT_EQ((*model)->Forward(make(), wrong, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoadModelTest, MissingTensorIsNotFoundNamingIt) {
  TinyLlamaDir d;
  d.tensors().erase("model.layers.0.mlp.up_proj.weight");
  auto model = d.Load();
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("missing tensor model.layers.0.mlp.up_proj.weight"));
}

TEST(LoadModelTest, WrongShapeNamesTheTensor) {
  TinyLlamaDir d;
  d.tensors()["model.layers.0.self_attn.k_proj.weight"] =
      F32({8, 8}, std::vector<float>(64, 0.0f));
  auto model = d.Load();
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(),
            "tensor model.layers.0.self_attn.k_proj.weight: shape [8, 8] expected [4, 8]");
}

TEST(LoadModelTest, WrongDtypeNamesTheTensor) {
  TinyLlamaDir d;
  d.tensors()["model.norm.weight"] = I64({8}, std::vector<int64_t>(8, 1));
  auto model = d.Load();
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(), "tensor model.norm.weight: dtype I64 is not a float type");
}

TEST(LoadModelTest, UnknownArchitectureAndMissingFiles) {
  TinyLlamaDir d;
  d.config() = R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                   "vocab_size": 11, "hidden_size": 8, "num_hidden_layers": 1,
                   "num_attention_heads": 2})";
  auto model = d.Load();
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("unsupported architecture GPT2LMHeadModel"));
  TempDir empty;
  EXPECT_EQ(LoadModel(empty.path()).status().code(), absl::StatusCode::kNotFound);
  WriteText(empty.path() + "/config.json",
            R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 11, "hidden_size": 8,
                "num_hidden_layers": 1, "num_attention_heads": 2})");
  auto no_weights = LoadModel(empty.path());
  EXPECT_EQ(no_weights.status().code(), absl::StatusCode::kNotFound);
}

TEST(LoadModelTest, UnsupportedActivation) {
  TinyLlamaDir d;
  d.config().replace(d.config().find("\"eos_token_id\""), 0, "\"hidden_act\": \"gelu\", ");
  auto model = d.Load();
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("hidden_act gelu"));
}

TEST(LoadModelTest, SharedFixturesLoad) {
  auto llama = LoadModel(sluice::testing::FixtureDir("llama-tiny"));
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ((*llama)->kv_cache_spec().k_floats_per_token, 2 * 16);
  // 1,134,912 parameters minus 8191 unused embedding rows of 64, float32.
  EXPECT_EQ((*llama)->WeightBytesPerToken(), (1134912 - 8191 * 64) * 4);
  auto qwen = LoadModel(sluice::testing::FixtureDir("qwen3-hybrid-tiny"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ((*qwen)->config().architecture, Architecture::kQwen3);
}

}  // namespace
}  // namespace sluice
