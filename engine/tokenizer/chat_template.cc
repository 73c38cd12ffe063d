#include "engine/tokenizer/chat_template.h"

#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/parser.h"
#include "engine/tokenizer/jinja/value.h"

namespace sluice {
namespace {

class JinjaChatTemplate final : public ChatTemplate {
 public:
  explicit JinjaChatTemplate(std::unique_ptr<jinja::Template> tmpl) : template_(std::move(tmpl)) {}

  void SetSpecialTokens(std::string bos, std::string eos) {
    bos_token_ = std::move(bos);
    eos_token_ = std::move(eos);
  }
  void SetSource(std::string source) { source_ = std::move(source); }

  absl::StatusOr<std::string> Render(const nlohmann::json& context) const override {
    return RenderJson(context);
  }
  absl::StatusOr<std::string> RenderOrdered(const nlohmann::ordered_json& context) const override {
    return RenderJson(context);
  }

 private:
  template <typename Json>
  absl::StatusOr<std::string> RenderJson(const Json& context) const {
    // The interpreter reports errors as statuses; this guard only converts a stray exception
    // (e.g. std::bad_alloc) so that nothing escapes the serving path.
    try {
      if (!context.is_object()) {
        return absl::InvalidArgumentError("chat template context must be a JSON object");
      }
      if (jinja::Value::JsonDepth(context, jinja::kMaxValueDepth) > jinja::kMaxValueDepth) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chat template context is nested deeper than ", jinja::kMaxValueDepth, " levels"));
      }
      jinja::Interpreter interpreter(*template_);
      return interpreter.Render(jinja::Value::FromJson(context));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("chat template rendering failed: ", e.what()));
    }
  }

  std::unique_ptr<jinja::Template> template_;
};

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return buffer.str();
}

// TokenString reads a special token stored as a string or as an AddedToken object {content}.
std::string TokenString(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return "";
}

// TemplateFromConfigValue picks the template from `chat_template`: a string, or a list of
// {name, template} where "default" wins (a single unnamed entry is used as is).
absl::StatusOr<std::string> TemplateFromConfigValue(const nlohmann::json& value,
                                                    const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    const nlohmann::json* only = nullptr;
    for (const auto& entry : value) {
      if (!entry.is_object()) continue;
      auto name = entry.find("name");
      auto tmpl = entry.find("template");
      if (tmpl == entry.end() || !tmpl->is_string()) continue;
      if (name != entry.end() && name->is_string() && name->get<std::string>() == "default") {
        return tmpl->get<std::string>();
      }
      only = value.size() == 1 ? &*tmpl : nullptr;
    }
    if (only != nullptr) return only->get<std::string>();
    return absl::NotFoundError(absl::StrCat(where, ": chat_template list has no 'default' entry"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": chat_template must be a string or a list of {name, template}"));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadFromModelDir(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  nlohmann::json config = nlohmann::json::object();
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    auto text = ReadFile(config_path);
    if (!text.ok()) return text.status();
    config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": invalid JSON"));
    }
  }
  // A standalone chat_template.jinja takes precedence over tokenizer_config.json (transformers
  // saves templates there since v4.50).
  std::string source;
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path, ec)) {
    auto text = ReadFile(jinja_path);
    if (!text.ok()) return text.status();
    source = *std::move(text);
  } else if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    auto tmpl = TemplateFromConfigValue(*it, config_path.string());
    if (!tmpl.ok()) return tmpl.status();
    source = *std::move(tmpl);
  } else {
    return absl::NotFoundError(absl::StrCat("no chat template in ", model_dir,
                                            " (tokenizer_config.json chat_template or "
                                            "chat_template.jinja)"));
  }
  auto parsed = jinja::ParseTemplate(source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template of ", model_dir, ": ", parsed.status().message()));
  }
  auto tmpl = std::make_unique<JinjaChatTemplate>(*std::move(parsed));
  tmpl->SetSpecialTokens(TokenString(config, "bos_token"), TokenString(config, "eos_token"));
  tmpl->SetSource(std::move(source));
  return tmpl;
}

template <typename Json>
Json BuildContext(const Json& messages, bool add_generation_prompt, const Json& extra,
                  const std::string& bos, const std::string& eos) {
  Json context = Json::object();
  if (!bos.empty()) context["bos_token"] = bos;
  if (!eos.empty()) context["eos_token"] = eos;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  }
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  return context;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(const std::string& source) {
  try {
    auto parsed = jinja::ParseTemplate(source);
    if (!parsed.ok()) return parsed.status();
    auto tmpl = std::make_unique<JinjaChatTemplate>(*std::move(parsed));
    tmpl->SetSource(source);
    return std::unique_ptr<ChatTemplate>(std::move(tmpl));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("chat template parsing failed: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromModelDir(
    const std::string& model_dir) {
  try {
    return LoadFromModelDir(model_dir);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading the chat template failed: ", e.what()));
  }
}

absl::StatusOr<std::string> ChatTemplate::RenderMessages(const nlohmann::json& messages,
                                                         bool add_generation_prompt,
                                                         const nlohmann::json& extra) const {
  try {
    return Render(BuildContext(messages, add_generation_prompt, extra, bos_token_, eos_token_));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("chat template rendering failed: ", e.what()));
  }
}

absl::StatusOr<std::string> ChatTemplate::RenderMessagesOrdered(
    const nlohmann::ordered_json& messages, bool add_generation_prompt,
    const nlohmann::ordered_json& extra) const {
  try {
    return RenderOrdered(
        BuildContext(messages, add_generation_prompt, extra, bos_token_, eos_token_));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("chat template rendering failed: ", e.what()));
  }
}

}  // namespace sluice
