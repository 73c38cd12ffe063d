// DeepSeek-V3 configurations that no shared checkpoint covers — q_lora_rank = 0 (q_proj),
// YaRN RoPE scaling with mscale / mscale_all_dim, tied embeddings, attention biases, softmax
// scoring, n_group = 1, no shared expert, several shared experts, non-interleaved RoPE — checked
// against a naive float64 implementation of transformers' DeepseekV3ForCausalLM (expanded,
// non-absorbed attention; a full causal recompute without any cache) on random weights written
// to a temporary Hugging Face folder. The model under test runs chunked prefill and decode
// through the paged latent cache (tests/util/golden_runner.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/model/model.h"
#include "nlohmann/json.hpp"
#include "tests/util/golden_runner.h"

namespace sluice {
namespace {

using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;
using nlohmann::json;

// Variant is one synthetic configuration.
struct Variant {
  std::string name;
  int64_t q_lora_rank;
  bool yarn;
  bool tie;
  bool attention_bias;
  bool interleave;
  std::string scoring;
  int64_t n_group, topk_group, n_shared, first_dense;
  bool norm_topk_prob;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

constexpr int64_t kHidden = 48, kLayers = 3, kHeads = 3, kRank = 24, kNope = 8, kRope = 8,
                  kV = 12, kInter = 64, kExperts = 8, kTopK = 2, kMoeInter = 16, kVocab = 96;
constexpr double kEps = 1e-6, kTheta = 10000.0;
// YaRN: factor 4 over an original window of 32 (transformers' `_compute_yarn_parameters`).
constexpr double kFactor = 4.0, kMscale = 0.707, kMscaleAllDim = 1.0;
constexpr int64_t kOrigMax = 32, kMaxPos = 128;

json MakeConfig(const Variant& v) {
  json c = {{"architectures", {"DeepseekV3ForCausalLM"}},
            {"model_type", "deepseek_v3"},
            {"vocab_size", kVocab},
            {"hidden_size", kHidden},
            {"intermediate_size", kInter},
            {"num_hidden_layers", kLayers},
            {"num_attention_heads", kHeads},
            {"num_key_value_heads", kHeads},
            {"kv_lora_rank", kRank},
            {"qk_nope_head_dim", kNope},
            {"qk_rope_head_dim", kRope},
            {"v_head_dim", kV},
            {"head_dim", kRope},
            {"n_routed_experts", kExperts},
            {"num_experts_per_tok", kTopK},
            {"moe_intermediate_size", kMoeInter},
            {"n_shared_experts", v.n_shared},
            {"n_group", v.n_group},
            {"topk_group", v.topk_group},
            {"routed_scaling_factor", 1.5},
            {"norm_topk_prob", v.norm_topk_prob},
            {"first_k_dense_replace", v.first_dense},
            {"scoring_func", v.scoring},
            {"rms_norm_eps", kEps},
            {"max_position_embeddings", kMaxPos},
            {"tie_word_embeddings", v.tie},
            {"attention_bias", v.attention_bias},
            {"rope_interleave", v.interleave},
            {"hidden_act", "silu"},
            {"bos_token_id", 0},
            {"eos_token_id", 1}};
  c["q_lora_rank"] = v.q_lora_rank > 0 ? json(v.q_lora_rank) : json(nullptr);
  if (v.yarn) {
    c["rope_scaling"] = {{"rope_type", "yarn"},        {"rope_theta", kTheta},
                         {"factor", kFactor},          {"original_max_position_embeddings", kOrigMax},
                         {"beta_fast", 32.0},          {"beta_slow", 1.0},
                         {"mscale", kMscale},          {"mscale_all_dim", kMscaleAllDim}};
  } else {
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", kTheta}};
  }
  return c;
}

Tensors MakeWeights(const Variant& v, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  Tensors t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, bool norm) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> data(n);
    for (float& x : data) x = norm ? unit(rng) : scale * normal(rng);
    t[name] = {shape, data};
  };
  const float s = 0.15f;
  add("model.embed_tokens.weight", {kVocab, kHidden}, 1.0f, false);
  add("model.norm.weight", {kHidden}, 0, true);
  if (!v.tie) add("lm_head.weight", {kVocab, kHidden}, s, false);
  const int64_t qk = kNope + kRope;
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden}, 0, true);
    add(p + "post_attention_layernorm.weight", {kHidden}, 0, true);
    if (v.q_lora_rank > 0) {
      add(p + "self_attn.q_a_proj.weight", {v.q_lora_rank, kHidden}, s, false);
      add(p + "self_attn.q_a_layernorm.weight", {v.q_lora_rank}, 0, true);
      add(p + "self_attn.q_b_proj.weight", {kHeads * qk, v.q_lora_rank}, s, false);
      if (v.attention_bias) add(p + "self_attn.q_a_proj.bias", {v.q_lora_rank}, 0.05f, false);
    } else {
      add(p + "self_attn.q_proj.weight", {kHeads * qk, kHidden}, s, false);
    }
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {kRank + kRope, kHidden}, s, false);
    add(p + "self_attn.kv_a_layernorm.weight", {kRank}, 0, true);
    add(p + "self_attn.kv_b_proj.weight", {kHeads * (kNope + kV), kRank}, s, false);
    add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kV}, s, false);
    if (v.attention_bias) {
      add(p + "self_attn.kv_a_proj_with_mqa.bias", {kRank + kRope}, 0.05f, false);
      add(p + "self_attn.o_proj.bias", {kHidden}, 0.05f, false);
    }
    if (l < v.first_dense) {
      add(p + "mlp.gate_proj.weight", {kInter, kHidden}, s, false);
      add(p + "mlp.up_proj.weight", {kInter, kHidden}, s, false);
      add(p + "mlp.down_proj.weight", {kHidden, kInter}, s, false);
      continue;
    }
    add(p + "mlp.gate.weight", {kExperts, kHidden}, 0.3f, false);
    add(p + "mlp.gate.e_score_correction_bias", {kExperts}, 0.1f, false);
    for (int64_t e = 0; e < kExperts; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      add(ep + "gate_proj.weight", {kMoeInter, kHidden}, s, false);
      add(ep + "up_proj.weight", {kMoeInter, kHidden}, s, false);
      add(ep + "down_proj.weight", {kHidden, kMoeInter}, s, false);
    }
    if (v.n_shared > 0) {
      const int64_t si = kMoeInter * v.n_shared;
      add(p + "mlp.shared_experts.gate_proj.weight", {si, kHidden}, s, false);
      add(p + "mlp.shared_experts.up_proj.weight", {si, kHidden}, s, false);
      add(p + "mlp.shared_experts.down_proj.weight", {kHidden, si}, s, false);
    }
  }
  return t;
}

// Writes config.json and model.safetensors (F32) into a fresh temp folder.
std::string WriteModel(const Variant& v, const Tensors& tensors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("dsv3_variant_" + v.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << MakeConfig(v).dump(2);
  json header = json::object();
  std::string data;
  for (const auto& [name, entry] : tensors) {
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(entry.second.data()), entry.second.size() * 4);
    header[name] = {{"dtype", "F32"}, {"shape", entry.first}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string text = header.dump();
  const uint64_t len = text.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return dir.string();
}

// ---- Naive float64 reference (transformers' DeepseekV3ForCausalLM, eager, no cache). ----

using Mat = std::vector<double>;  // row-major

const std::vector<float>& W(const Tensors& t, const std::string& name) {
  return t.at(name).second;
}

// y[n] = Σ_k w[n, k] x[k] (+ b[n])
Mat Linear(const std::vector<float>& w, const Mat& x, int64_t n, int64_t k,
           const std::vector<float>* b = nullptr) {
  Mat y(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double s = b ? (*b)[i] : 0.0;
    for (int64_t j = 0; j < k; ++j) s += double{w[i * k + j]} * x[j];
    y[i] = s;
  }
  return y;
}

Mat RmsNorm(const Mat& x, const std::vector<float>& w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + kEps);
  Mat y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

Mat SwiGlu(const Tensors& t, const std::string& p, const Mat& x, int64_t inter) {
  Mat g = Linear(W(t, p + "gate_proj.weight"), x, inter, kHidden);
  Mat u = Linear(W(t, p + "up_proj.weight"), x, inter, kHidden);
  for (int64_t i = 0; i < inter; ++i) g[i] = Silu(g[i]) * u[i];
  return Linear(W(t, p + "down_proj.weight"), g, kHidden, inter);
}

double YarnMscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// cos/sin per position for the rotate-half layout (inv_freq from transformers' rope init).
void RopeAngles(const Variant& v, int64_t pos, std::vector<double>& cos_v,
                std::vector<double>& sin_v) {
  const int64_t half = kRope / 2;
  double attention = 1.0;
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(kTheta, 2.0 * i / kRope);
  if (v.yarn) {
    auto corr = [](double rot) {
      return (kRope * std::log(kOrigMax / (rot * 2 * M_PI))) / (2 * std::log(kTheta));
    };
    double low = std::max(std::floor(corr(32.0)), 0.0);
    double high = std::min(std::ceil(corr(1.0)), double{kRope - 1});
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extra = 1.0 - ramp;
      inv[i] = inv[i] / kFactor * (1.0 - extra) + inv[i] * extra;
    }
    attention = YarnMscale(kFactor, kMscale) / YarnMscale(kFactor, kMscaleAllDim);
  }
  cos_v.assign(kRope, 0.0);
  sin_v.assign(kRope, 0.0);
  for (int64_t i = 0; i < kRope; ++i) {
    const double a = static_cast<double>(static_cast<float>(pos * inv[i % half]));
    cos_v[i] = std::cos(a) * attention;
    sin_v[i] = std::sin(a) * attention;
  }
}

// Applies RoPE to x[0..kRope) (DeepSeek interleave: pairs → halves first).
void Rope(const Variant& v, int64_t pos, double* x) {
  std::vector<double> c, s;
  RopeAngles(v, pos, c, s);
  std::vector<double> y(x, x + kRope);
  if (v.interleave) {
    for (int64_t i = 0; i < kRope / 2; ++i) {
      y[i] = x[2 * i];
      y[kRope / 2 + i] = x[2 * i + 1];
    }
  }
  const int64_t h = kRope / 2;
  for (int64_t i = 0; i < kRope; ++i) {
    const double rot = i < h ? -y[i + h] : y[i - h];
    x[i] = y[i] * c[i] + rot * s[i];
  }
}

Mat Moe(const Variant& v, const Tensors& t, const std::string& p, const Mat& x) {
  Mat logits = Linear(W(t, p + "mlp.gate.weight"), x, kExperts, kHidden);
  std::vector<double> s(kExperts);
  if (v.scoring == "sigmoid") {
    for (int64_t e = 0; e < kExperts; ++e) s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
  } else {
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int64_t e = 0; e < kExperts; ++e) sum += s[e] = std::exp(logits[e] - mx);
    for (double& e : s) e /= sum;
  }
  const auto& bias = W(t, p + "mlp.gate.e_score_correction_bias");
  std::vector<double> choice(kExperts);
  for (int64_t e = 0; e < kExperts; ++e) choice[e] = s[e] + bias[e];
  const int64_t per = kExperts / v.n_group;
  std::vector<std::pair<double, int64_t>> groups;
  for (int64_t g = 0; g < v.n_group; ++g) {
    std::vector<double> m(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    std::sort(m.rbegin(), m.rend());
    groups.push_back({m[0] + m[1], g});
  }
  std::stable_sort(groups.begin(), groups.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (int64_t i = v.topk_group; i < v.n_group; ++i) {
    for (int64_t e = 0; e < per; ++e) choice[groups[i].second * per + e] = 0.0;
  }
  std::vector<int64_t> order(kExperts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return choice[a] > choice[b]; });
  double denom = 1e-20;
  for (int64_t k = 0; k < kTopK; ++k) denom += s[order[k]];
  Mat out(kHidden, 0.0);
  for (int64_t k = 0; k < kTopK; ++k) {
    const int64_t e = order[k];
    const double w = (v.norm_topk_prob ? s[e] / denom : s[e]) * 1.5;
    Mat y = SwiGlu(t, p + "mlp.experts." + std::to_string(e) + ".", x, kMoeInter);
    for (int64_t i = 0; i < kHidden; ++i) out[i] += w * y[i];
  }
  if (v.n_shared > 0) {
    Mat y = SwiGlu(t, p + "mlp.shared_experts.", x, kMoeInter * v.n_shared);
    for (int64_t i = 0; i < kHidden; ++i) out[i] += y[i];
  }
  return out;
}

// Logits [T, vocab] of the whole sequence.
std::vector<double> ReferenceLogits(const Variant& v, const Tensors& t,
                                    const std::vector<int32_t>& ids) {
  const int64_t T = static_cast<int64_t>(ids.size());
  const int64_t qk = kNope + kRope;
  double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (v.yarn) scale *= YarnMscale(kFactor, kMscaleAllDim) * YarnMscale(kFactor, kMscaleAllDim);
  std::vector<Mat> h(T);
  for (int64_t i = 0; i < T; ++i) {
    const auto& e = W(t, "model.embed_tokens.weight");
    h[i].assign(e.begin() + ids[i] * kHidden, e.begin() + (ids[i] + 1) * kHidden);
  }
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    std::vector<Mat> q(T), k(T), val(T);
    for (int64_t i = 0; i < T; ++i) {
      Mat x = RmsNorm(h[i], W(t, p + "input_layernorm.weight"));
      if (v.q_lora_rank > 0) {
        const std::vector<float>* qb = v.attention_bias ? &W(t, a + "q_a_proj.bias") : nullptr;
        Mat qa = RmsNorm(Linear(W(t, a + "q_a_proj.weight"), x, v.q_lora_rank, kHidden, qb),
                         W(t, a + "q_a_layernorm.weight"));
        q[i] = Linear(W(t, a + "q_b_proj.weight"), qa, kHeads * qk, v.q_lora_rank);
      } else {
        q[i] = Linear(W(t, a + "q_proj.weight"), x, kHeads * qk, kHidden);
      }
      const std::vector<float>* kvb =
          v.attention_bias ? &W(t, a + "kv_a_proj_with_mqa.bias") : nullptr;
      Mat kv = Linear(W(t, a + "kv_a_proj_with_mqa.weight"), x, kRank + kRope, kHidden, kvb);
      Mat c = RmsNorm(Mat(kv.begin(), kv.begin() + kRank), W(t, a + "kv_a_layernorm.weight"));
      Mat kpe(kv.begin() + kRank, kv.end());
      Rope(v, i, kpe.data());
      Mat up = Linear(W(t, a + "kv_b_proj.weight"), c, kHeads * (kNope + kV), kRank);
      k[i].resize(kHeads * qk);
      val[i].resize(kHeads * kV);
      for (int64_t hd = 0; hd < kHeads; ++hd) {
        Rope(v, i, q[i].data() + hd * qk + kNope);
        for (int64_t d = 0; d < kNope; ++d) k[i][hd * qk + d] = up[hd * (kNope + kV) + d];
        for (int64_t d = 0; d < kRope; ++d) k[i][hd * qk + kNope + d] = kpe[d];
        for (int64_t d = 0; d < kV; ++d) val[i][hd * kV + d] = up[hd * (kNope + kV) + kNope + d];
      }
    }
    for (int64_t i = 0; i < T; ++i) {
      Mat attn(kHeads * kV, 0.0);
      for (int64_t hd = 0; hd < kHeads; ++hd) {
        std::vector<double> sc(i + 1);
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < qk; ++c) d += q[i][hd * qk + c] * k[j][hd * qk + c];
          sc[j] = d * scale;
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double& x : sc) sum += x = std::exp(x - mx);
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < kV; ++d) attn[hd * kV + d] += sc[j] / sum * val[j][hd * kV + d];
        }
      }
      const std::vector<float>* ob = v.attention_bias ? &W(t, a + "o_proj.bias") : nullptr;
      Mat o = Linear(W(t, a + "o_proj.weight"), attn, kHidden, kHeads * kV, ob);
      for (int64_t c = 0; c < kHidden; ++c) h[i][c] += o[c];
    }
    for (int64_t i = 0; i < T; ++i) {
      Mat x = RmsNorm(h[i], W(t, p + "post_attention_layernorm.weight"));
      Mat y = l < v.first_dense ? SwiGlu(t, p + "mlp.", x, kInter) : Moe(v, t, p, x);
      for (int64_t c = 0; c < kHidden; ++c) h[i][c] += y[c];
    }
  }
  std::vector<double> logits(T * kVocab);
  const auto& head = W(t, v.tie ? "model.embed_tokens.weight" : "lm_head.weight");
  for (int64_t i = 0; i < T; ++i) {
    Mat y = Linear(head, RmsNorm(h[i], W(t, "model.norm.weight")), kVocab, kHidden);
    std::copy(y.begin(), y.end(), logits.begin() + i * kVocab);
  }
  return logits;
}

class DeepseekV3VariantTest : public ::testing::TestWithParam<Variant> {};

TEST_P(DeepseekV3VariantTest, MatchesNaiveReference) {
  const Variant& v = GetParam();
  std::mt19937 rng(1234);
  const Tensors tensors = MakeWeights(v, rng);
  const std::string dir = WriteModel(v, tensors);
  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->kv_cache_spec().k_floats_per_token, kRank + kRope);

  std::vector<int32_t> prompt(40);
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  for (int32_t& x : prompt) x = tok(rng);
  sluice::testing::GoldenRunOptions opt;
  opt.block_size = 4;
  opt.prefill_chunk = 9;
  opt.num_new_tokens = 24;  // positions up to 62: past the YaRN original window of 32
  auto run = sluice::testing::RunGreedy(**model, prompt, opt);
  ASSERT_TRUE(run.ok()) << run.status();

  // The reference recomputes the whole sequence: prompt + the greedy tokens fed back.
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), run->greedy.begin(), run->greedy.end() - 1);
  const std::vector<double> ref = ReferenceLogits(v, tensors, full);
  ASSERT_EQ(run->logits.size(), ref.size());
  double max_diff = 0, max_ref = 0;
  int64_t argmax_mismatch = 0;
  for (size_t row = 0; row < full.size(); ++row) {
    int64_t best_ref = 0;
    for (int64_t c = 0; c < kVocab; ++c) {
      const size_t i = row * kVocab + c;
      max_diff = std::max(max_diff, std::abs(run->logits[i] - ref[i]));
      max_ref = std::max(max_ref, std::abs(ref[i]));
      if (ref[i] > ref[row * kVocab + best_ref]) best_ref = c;
    }
    argmax_mismatch += sluice::testing::ArgMax(run->logits.data() + row * kVocab, kVocab) != best_ref;
  }
  std::cout << "[variant] " << v.name << " max|dlogit|=" << max_diff << " max|logit|=" << max_ref
            << "\n";
  EXPECT_GT(max_ref, 0.5);  // non-trivial logits
  EXPECT_LT(max_diff, 1e-4) << v.name << " max |ref| " << max_ref;
  EXPECT_EQ(argmax_mismatch, 0) << v.name;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, DeepseekV3VariantTest,
    ::testing::Values(
        // q_proj directly, YaRN, tied embeddings, one group, two shared experts, all layers MoE.
        Variant{"qproj_yarn_tied", 0, true, true, false, true, "sigmoid", 1, 1, 2, 0, true},
        // q LoRA, attention biases, softmax scoring, groups, no shared expert, no interleave.
        Variant{"qlora_bias_softmax", 16, false, false, true, false, "softmax", 2, 1, 0, 2, false},
        // q LoRA + YaRN, group-limited sigmoid routing like DeepSeek-V3.
        Variant{"qlora_yarn_groups", 16, true, false, false, true, "sigmoid", 4, 2, 1, 1, true}),
    [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace
}  // namespace sluice
