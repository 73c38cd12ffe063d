#include "engine/model/dummy_weights.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

void AddMatrix(std::vector<DummyTensorSpec>* out, std::string name, int64_t rows, int64_t cols) {
  out->push_back({std::move(name), {rows, cols}, DummyInit::kNormal});
}
void AddVector(std::vector<DummyTensorSpec>* out, std::string name, int64_t n, DummyInit init) {
  out->push_back({std::move(name), {n}, init});
}

// A SwiGLU MLP's three projections under `prefix` (e.g. "model.layers.0.mlp.").
void AddMlp(std::vector<DummyTensorSpec>* out, const std::string& prefix, int64_t hidden,
            int64_t inter, bool bias) {
  for (const char* name : {"gate_proj", "up_proj"}) {
    AddMatrix(out, prefix + name + ".weight", inter, hidden);
    if (bias) AddVector(out, prefix + name + ".bias", inter, DummyInit::kZeros);
  }
  AddMatrix(out, prefix + "down_proj.weight", hidden, inter);
  if (bias) AddVector(out, prefix + "down_proj.bias", hidden, DummyInit::kZeros);
}

void AddLlamaLayer(std::vector<DummyTensorSpec>* out, const ModelConfig& c, int64_t layer) {
  const std::string p = LayerPrefix(layer);
  const int64_t h = c.hidden_size, hd = c.head_dim;
  AddVector(out, p + "input_layernorm.weight", h, DummyInit::kOnes);
  AddVector(out, p + "post_attention_layernorm.weight", h, DummyInit::kOnes);
  const std::pair<const char*, int64_t> qkv[] = {{"q_proj", c.num_attention_heads * hd},
                                                 {"k_proj", c.num_key_value_heads * hd},
                                                 {"v_proj", c.num_key_value_heads * hd}};
  for (const auto& [name, rows] : qkv) {
    AddMatrix(out, p + "self_attn." + name + ".weight", rows, h);
    if (c.attention_bias) {
      AddVector(out, p + "self_attn." + name + ".bias", rows, DummyInit::kZeros);
    }
  }
  AddMatrix(out, p + "self_attn.o_proj.weight", h, c.num_attention_heads * hd);
  if (c.attention_bias) AddVector(out, p + "self_attn.o_proj.bias", h, DummyInit::kZeros);
  if (c.architecture == Architecture::kQwen3) {
    AddVector(out, p + "self_attn.q_norm.weight", hd, DummyInit::kOnes);
    AddVector(out, p + "self_attn.k_norm.weight", hd, DummyInit::kOnes);
  }
  AddMlp(out, p + "mlp.", h, c.intermediate_size, c.mlp_bias);
}

// DeepSeek-V3 layout, as deepseek_v3.cc loads it (MLA projections, dense MLP for the first
// first_k_dense_replace layers, then router + routed experts + shared experts).
void AddDeepseekLayer(std::vector<DummyTensorSpec>* out, const ModelConfig& c, int64_t layer) {
  const std::string p = LayerPrefix(layer);
  const std::string a = p + "self_attn.";
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t q_width = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim);
  AddVector(out, p + "input_layernorm.weight", h, DummyInit::kOnes);
  AddVector(out, p + "post_attention_layernorm.weight", h, DummyInit::kOnes);
  if (c.q_lora_rank > 0) {
    AddMatrix(out, a + "q_a_proj.weight", c.q_lora_rank, h);
    AddVector(out, a + "q_a_layernorm.weight", c.q_lora_rank, DummyInit::kOnes);
    AddMatrix(out, a + "q_b_proj.weight", q_width, c.q_lora_rank);
    if (c.attention_bias) AddVector(out, a + "q_a_proj.bias", c.q_lora_rank, DummyInit::kZeros);
  } else {
    AddMatrix(out, a + "q_proj.weight", q_width, h);
  }
  AddMatrix(out, a + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, h);
  AddVector(out, a + "kv_a_layernorm.weight", c.kv_lora_rank, DummyInit::kOnes);
  AddMatrix(out, a + "kv_b_proj.weight", heads * (c.qk_nope_head_dim + c.v_head_dim),
            c.kv_lora_rank);
  AddMatrix(out, a + "o_proj.weight", h, heads * c.v_head_dim);
  if (c.attention_bias) {
    AddVector(out, a + "kv_a_proj_with_mqa.bias", c.kv_lora_rank + c.qk_rope_head_dim,
              DummyInit::kZeros);
    AddVector(out, a + "o_proj.bias", h, DummyInit::kZeros);
  }
  if (layer < c.first_k_dense_replace) {
    AddMlp(out, p + "mlp.", h, c.intermediate_size, false);
    return;
  }
  AddMatrix(out, p + "mlp.gate.weight", c.n_routed_experts, h);
  if (c.has_score_correction_bias) {
    AddVector(out, p + "mlp.gate.e_score_correction_bias", c.n_routed_experts, DummyInit::kZeros);
  }
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    AddMlp(out, absl::StrCat(p, "mlp.experts.", e, "."), h, c.moe_intermediate_size, false);
  }
  if (c.n_shared_experts > 0) {
    AddMlp(out, p + "mlp.shared_experts.", h, c.moe_intermediate_size * c.n_shared_experts,
           false);
  }
}

}  // namespace

absl::StatusOr<std::vector<DummyTensorSpec>> DummyTensorSpecs(const ModelConfig& c) {
  if (c.vocab_size < 1 || c.hidden_size < 1 || c.num_hidden_layers < 1) {
    return absl::InvalidArgumentError("dummy weights: vocab_size, hidden_size and "
                                      "num_hidden_layers must be positive");
  }
  std::vector<DummyTensorSpec> out;
  AddMatrix(&out, "model.embed_tokens.weight", c.vocab_size, c.hidden_size);
  AddVector(&out, "model.norm.weight", c.hidden_size, DummyInit::kOnes);
  if (!c.tie_word_embeddings) AddMatrix(&out, "lm_head.weight", c.vocab_size, c.hidden_size);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    switch (c.architecture) {
      case Architecture::kLlama:
      case Architecture::kQwen3:
        AddLlamaLayer(&out, c, l);
        break;
      case Architecture::kDeepseekV3:
        AddDeepseekLayer(&out, c, l);
        break;
    }
  }
  return out;
}

void FillDummyTensor(const DummyTensorSpec& spec, uint64_t seed, float* out) {
  const int64_t n = spec.NumElements();
  switch (spec.init) {
    case DummyInit::kOnes:
      std::fill(out, out + n, 1.0f);
      return;
    case DummyInit::kZeros:
      std::fill(out, out + n, 0.0f);
      return;
    case DummyInit::kNormal: {
      const uint64_t ts = DummyTensorSeed(seed, spec.name);
      for (int64_t i = 0; i < n; ++i) out[i] = DummyNormal(ts, static_cast<uint64_t>(i));
      return;
    }
  }
}

absl::Status WriteDummyCheckpoint(const ModelConfig& config, uint64_t seed,
                                  const std::string& out_dir) {
  auto specs = DummyTensorSpecs(config);
  if (!specs.ok()) return specs.status();
  // safetensors header: {name: {dtype, shape, data_offsets}}, padded with spaces to 8 bytes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}, {"sluice", "dummy"}};
  uint64_t offset = 0;
  for (const DummyTensorSpec& s : *specs) {
    const uint64_t bytes = static_cast<uint64_t>(s.NumElements()) * 2;
    header[s.name] = {{"dtype", "BF16"}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string path = out_dir + "/model.safetensors";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::InternalError(absl::StrCat("cannot create ", path));
  const uint64_t header_len = text.size();
  f.write(reinterpret_cast<const char*>(&header_len), 8);  // little-endian host (x86-64)
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<float> values;
  std::vector<uint16_t> bits;
  for (const DummyTensorSpec& s : *specs) {
    values.resize(static_cast<size_t>(s.NumElements()));
    bits.resize(values.size());
    FillDummyTensor(s, seed, values.data());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = FloatToBf16(values[i]);
    f.write(reinterpret_cast<const char*>(bits.data()),
            static_cast<std::streamsize>(bits.size() * 2));
  }
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("write failed: ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> LoadDummyModel(const std::string& dir, uint64_t seed) {
  auto config = ModelConfig::Load(dir);
  if (!config.ok()) return config.status();
  const char* tmp_env = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(tmp_env != nullptr && *tmp_env ? tmp_env : "/tmp",
                                  "/sluice-dummy-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp failed for ", tmpl));
  }
  const std::string tmp = tmpl;
  absl::StatusOr<std::unique_ptr<Model>> model = [&]() -> absl::StatusOr<std::unique_ptr<Model>> {
    std::error_code ec;
    for (const char* name : {"config.json", "generation_config.json"}) {
      const std::filesystem::path src = std::filesystem::path(dir) / name;
      if (!std::filesystem::exists(src)) continue;
      std::filesystem::copy_file(src, std::filesystem::path(tmp) / name, ec);
      if (ec) return absl::InternalError(absl::StrCat("copy ", src.string(), ": ", ec.message()));
    }
    if (absl::Status s = WriteDummyCheckpoint(*config, seed, tmp); !s.ok()) return s;
    return LoadModel(tmp);
  }();
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);  // weights are float copies now; the file is not needed
  return model;
}

}  // namespace sluice
