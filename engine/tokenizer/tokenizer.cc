// Tokenizer::FromFile / FromJsonText: loads a HF tokenizer.json into a BPE tokenizer
// (BpeAddedVocab with the Normalizer -> BpePreTokenizer -> BpeModel -> post-processor
// templates, and the Decoder).
#include "engine/tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_added_vocab.h"
#include "engine/tokenizer/bpe_json_util.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/bpe_pretokenizer.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/normalizer.h"

namespace sluice {
namespace {

using nlohmann::json;

// One post-processor template (TemplateProcessing "single", or Bert/Roberta's fixed form):
// the ids to place around the encoded sequence.
struct PostTemplate {
  std::vector<int32_t> before;
  std::vector<int32_t> after;
};

class BpeTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens,
                              bool parse_special) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    const auto on_word = [&](std::string_view word) { model_->Tokenize(word, &ids); };
    added_->Split(
        text, parse_special,
        [&](std::string_view segment, bool at_start) { pre_->Split(segment, at_start, on_word); },
        [&](int32_t id) { ids.push_back(id); });
    if (add_special_tokens) {
      for (const PostTemplate& t : templates_) {
        ids.insert(ids.begin(), t.before.begin(), t.before.end());
        ids.insert(ids.end(), t.after.begin(), t.after.end());
      }
    }
    return ids;
  }

  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override {
    if (decoder_->byte_level_only()) {
      const std::string bytes = DecodeBytes(ids, skip_special_tokens);
      std::string text;
      text.reserve(bytes.size());
      byte_level::AppendUtf8Lossy(bytes, &text);
      return text;
    }
    std::vector<std::string_view> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size_ || !known_[id]) continue;  // HF drops unknown ids
      if (skip_special_tokens && special_[id]) continue;
      tokens.push_back(tokens_[id]);
    }
    return decoder_->Decode(tokens);
  }

  std::string DecodeBytes(absl::Span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string out;
    bool first = true;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size_ || !known_[id]) continue;  // HF drops unknown ids
      if (skip_special_tokens && special_[id]) continue;
      if (decoder_->joins_with_spaces()) {
        // No decoder: HF joins the token strings with spaces.
        if (!first) out.push_back(' ');
        out.append(tokens_[id]);
      } else {
        out.append(bytes_[id]);
      }
      first = false;
    }
    return out;
  }

  std::string IdToToken(int32_t id) const override {
    if (id < 0 || id >= vocab_size_) return "";
    return tokens_[id];
  }

  std::optional<int32_t> TokenToId(std::string_view token) const override {
    if (std::optional<int32_t> id = added_->FindByContent(token); id.has_value()) return id;
    return model_->TokenToId(token);
  }

  bool IsSpecial(int32_t id) const override { return id >= 0 && id < vocab_size_ && special_[id]; }

  int32_t vocab_size() const override { return vocab_size_; }

  // Build fills the per-id tables once the components exist.
  void Build() {
    vocab_size_ = std::max(model_->max_id(), added_->max_id()) + 1;
    tokens_.assign(vocab_size_, std::string());
    bytes_.assign(vocab_size_, std::string());
    known_.assign(vocab_size_, false);
    special_.assign(vocab_size_, false);
    for (int32_t id = 0; id < vocab_size_; ++id) {
      // Added tokens take precedence over the model vocabulary, as in HF's id_to_token.
      const AddedToken* added = added_->FindById(id);
      const std::string* token =
          added == nullptr                        ? model_->IdToToken(id)
          : added->normalized_content.empty() ? &added->content
                                                  : &added->normalized_content;
      if (token == nullptr) continue;
      known_[id] = true;
      special_[id] = added != nullptr && added->special;
      tokens_[id] = *token;
      bytes_[id] = decoder_->TokenBytes(*token);
    }
  }

  std::unique_ptr<Normalizer> normalizer_;  // null: none
  std::unique_ptr<BpeAddedVocab> added_;
  std::unique_ptr<BpePreTokenizer> pre_;
  std::unique_ptr<BpeModel> model_;
  std::vector<PostTemplate> templates_;
  std::unique_ptr<Decoder> decoder_;

 private:
  int32_t vocab_size_ = 0;
  std::vector<std::string> tokens_;
  std::vector<std::string> bytes_;
  std::vector<bool> known_;
  std::vector<bool> special_;
};

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const json& root) {
  std::vector<AddedToken> tokens;
  const json* list = bpe_json::Field(root, "added_tokens");
  if (list == nullptr || list->is_null()) return tokens;
  if (!list->is_array()) return absl::InvalidArgumentError("'added_tokens' is not a list");
  for (const json& item : *list) {
    AddedToken t;
    const json* id = bpe_json::Field(item, "id");
    if (id == nullptr || !id->is_number_integer()) {
      return absl::InvalidArgumentError("added token without an integer 'id'");
    }
    t.id = id->get<int32_t>();
    absl::StatusOr<std::string> content = bpe_json::String(item, "content", "added token");
    if (!content.ok()) return content.status();
    t.content = *std::move(content);
    t.single_word = bpe_json::Bool(item, "single_word", false);
    t.lstrip = bpe_json::Bool(item, "lstrip", false);
    t.rstrip = bpe_json::Bool(item, "rstrip", false);
    t.special = bpe_json::Bool(item, "special", false);
    t.normalized = bpe_json::Bool(item, "normalized", !t.special);
    tokens.push_back(std::move(t));
  }
  return tokens;
}

absl::StatusOr<std::unique_ptr<BpeModel>> ParseModel(const json& root, bool byte_level) {
  const json* model = bpe_json::Field(root, "model");
  if (model == nullptr || !model->is_object()) {
    return absl::InvalidArgumentError("tokenizer.json has no 'model' object");
  }
  std::string type = bpe_json::Type(*model);
  if (type.empty() && bpe_json::Field(*model, "merges") != nullptr) type = "BPE";
  if (type != "BPE") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported model type '", type, "'"));
  }
  const json* dropout = bpe_json::Field(*model, "dropout");
  if (dropout != nullptr && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return absl::InvalidArgumentError("unsupported BPE option: dropout");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = bpe_json::Field(*model, key);
    if (v != nullptr && !v->is_null() && !(v->is_string() && v->get<std::string>().empty())) {
      return absl::InvalidArgumentError(absl::StrCat("unsupported BPE option: ", key));
    }
  }
  BpeModelOptions options;
  options.byte_level = byte_level;
  options.ignore_merges = bpe_json::Bool(*model, "ignore_merges", false);
  options.fuse_unk = bpe_json::Bool(*model, "fuse_unk", false);
  options.byte_fallback = bpe_json::Bool(*model, "byte_fallback", false);
  if (const json* unk = bpe_json::Field(*model, "unk_token"); unk != nullptr && unk->is_string()) {
    options.unk_token = unk->get<std::string>();
  }

  const json* vocab_json = bpe_json::Field(*model, "vocab");
  if (vocab_json == nullptr || !vocab_json->is_object()) {
    return absl::InvalidArgumentError("BPE model has no 'vocab' object");
  }
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_json->size());
  for (const auto& [token, id] : vocab_json->items()) {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab id of '", token, "' is not an integer"));
    }
    vocab.emplace_back(token, id.get<int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  if (const json* list = bpe_json::Field(*model, "merges"); list != nullptr && !list->is_null()) {
    if (!list->is_array()) return absl::InvalidArgumentError("BPE 'merges' is not a list");
    merges.reserve(list->size());
    for (const json& m : *list) {
      if (m.is_string()) {
        // "a b": tokenizers splits on the single space (tokens never contain one).
        const std::string& s = m.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return absl::InvalidArgumentError(absl::StrCat("malformed BPE merge '", s, "'"));
        }
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return absl::InvalidArgumentError("malformed BPE merge (want \"a b\" or [a, b])");
      }
    }
  }
  return BpeModel::Create(vocab, merges, std::move(options));
}

// SpecialIds resolves a token string of a Bert/Roberta processor ("sep": ["</s>", 2]).
absl::StatusOr<int32_t> PairId(const json& config, std::string_view key) {
  const json* v = bpe_json::Field(config, key);
  if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("post-processor field '", std::string(key), "' malformed"));
  }
  return (*v)[1].get<int32_t>();
}

absl::Status ParsePostProcessor(const json& config, std::vector<PostTemplate>* templates) {
  if (config.is_null()) return absl::OkStatus();
  const std::string type = bpe_json::Type(config);
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    const json* list = bpe_json::Field(config, "processors");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("Sequence post-processor without 'processors'");
    }
    for (const json& item : *list) {
      absl::Status status = ParsePostProcessor(item, templates);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    absl::StatusOr<int32_t> cls = PairId(config, "cls");
    absl::StatusOr<int32_t> sep = PairId(config, "sep");
    if (!cls.ok()) return cls.status();
    if (!sep.ok()) return sep.status();
    templates->push_back(PostTemplate{{*cls}, {*sep}});
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported post-processor type '", type, "'"));
  }
  const json* single = bpe_json::Field(config, "single");
  const json* specials = bpe_json::Field(config, "special_tokens");
  if (single == nullptr || !single->is_array()) {
    return absl::InvalidArgumentError("TemplateProcessing without a 'single' template");
  }
  PostTemplate t;
  bool seen_sequence = false;
  for (const json& piece : *single) {
    if (bpe_json::Field(piece, "Sequence") != nullptr) {
      seen_sequence = true;
      continue;
    }
    const json* special = bpe_json::Field(piece, "SpecialToken");
    const json* name = special != nullptr ? bpe_json::Field(*special, "id") : nullptr;
    if (name == nullptr || !name->is_string()) {
      return absl::InvalidArgumentError("TemplateProcessing piece is not Sequence/SpecialToken");
    }
    const json* entry =
        specials != nullptr ? bpe_json::Field(*specials, name->get<std::string>()) : nullptr;
    const json* ids = entry != nullptr ? bpe_json::Field(*entry, "ids") : nullptr;
    if (ids == nullptr || !ids->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("TemplateProcessing special token '",
                                                     name->get<std::string>(), "' has no ids"));
    }
    for (const json& id : *ids) {
      if (!id.is_number_integer()) {
        return absl::InvalidArgumentError("TemplateProcessing special token id not an integer");
      }
      (seen_sequence ? t.after : t.before).push_back(id.get<int32_t>());
    }
  }
  templates->push_back(std::move(t));
  return absl::OkStatus();
}

// "truncation" and "padding" are not read: transformers overrides both on every call
// (no truncation or padding unless the request asks), and so does vLLM through it.
absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(const json& root) {
  if (!root.is_object()) return absl::InvalidArgumentError("tokenizer.json is not an object");
  auto tokenizer = std::make_unique<BpeTokenizer>();

  if (const json* config = bpe_json::Field(root, "normalizer"); config != nullptr) {
    absl::StatusOr<std::unique_ptr<Normalizer>> normalizer = Normalizer::FromJson(*config);
    if (!normalizer.ok()) return normalizer.status();
    tokenizer->normalizer_ = *std::move(normalizer);
  }
  const json* pre_config = bpe_json::Field(root, "pre_tokenizer");
  absl::StatusOr<std::unique_ptr<BpePreTokenizer>> pre =
      BpePreTokenizer::FromJson(pre_config != nullptr ? *pre_config : json());
  if (!pre.ok()) return pre.status();
  tokenizer->pre_ = *std::move(pre);

  absl::StatusOr<std::unique_ptr<BpeModel>> model = ParseModel(root, tokenizer->pre_->byte_level());
  if (!model.ok()) return model.status();
  tokenizer->model_ = *std::move(model);

  absl::StatusOr<std::vector<AddedToken>> added_tokens = ParseAddedTokens(root);
  if (!added_tokens.ok()) return added_tokens.status();
  absl::StatusOr<std::unique_ptr<BpeAddedVocab>> added =
      BpeAddedVocab::Create(*std::move(added_tokens), tokenizer->normalizer_.get());
  if (!added.ok()) return added.status();
  tokenizer->added_ = *std::move(added);

  if (const json* post = bpe_json::Field(root, "post_processor"); post != nullptr) {
    absl::Status status = ParsePostProcessor(*post, &tokenizer->templates_);
    if (!status.ok()) return status;
  }
  const json* decoder_config = bpe_json::Field(root, "decoder");
  absl::StatusOr<std::unique_ptr<Decoder>> decoder =
      Decoder::FromJson(decoder_config != nullptr ? *decoder_config : json());
  if (!decoder.ok()) return decoder.status();
  tokenizer->decoder_ = *std::move(decoder);

  tokenizer->Build();
  return tokenizer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = FromJsonText(buffer.str());
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonText(const std::string& json_text) {
  const json root = json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("tokenizer.json is malformed JSON");
  // The accessors above never throw; this guards against any nlohmann exception regardless.
  try {
    return FromJson(root);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
}

}  // namespace sluice
