// ChatTemplate: renders a Hugging Face Jinja `chat_template` (the subset HF templates use).
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (-), `for` (with `loop.index`,
// `loop.index0`, `loop.first`, `loop.last`, `loop.length`, `loop.revindex`, else-branch,
// filtering `if`), `if/elif/else`, `set` (also `namespace()` attributes), `macro`, literals,
// lists, dicts, slicing, `in`, `is defined/none/string/...` tests, filters (`trim`, `length`,
// `tojson`, `upper`, `lower`, `default`, `join`, `first`, `last`, `replace`, `items`, ...),
// string methods (`strip`, `lstrip`, `rstrip`, `startswith`, `endswith`, `split`, `upper`,
// `lower`, `replace`, `title`), dict `.get/.items/.keys/.values`, `raise_exception(msg)`.
#ifndef SLUICE_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
#define SLUICE_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/jinja/budget.h"
#include "nlohmann/json.hpp"

namespace sluice {

class ChatTemplate {
 public:
  // Parse compiles `source`. Errors: InvalidArgument with line/column of a syntax error.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(const std::string& source);
  // FromTokenizerConfig reads `chat_template` from tokenizer_config.json (string or list of
  // {name, template}, picking "default") or chat_template.jinja in `model_dir`, and the
  // bos/eos token strings. Errors: NotFound when the model has no chat template.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromModelDir(const std::string& model_dir);
  virtual ~ChatTemplate() = default;

  // Render evaluates the template with `context` as the global variables (a JSON object,
  // e.g. {"messages": [...], "add_generation_prompt": true, "bos_token": "...", ...}).
  // `limits` bound the render's work (jinja/budget.h); a template from a client must get limits
  // that fit the server.
  // Errors: InvalidArgument for `raise_exception(msg)` (message = msg), a runtime type error or
  // a limit exceeded (the message names it); Cancelled / DeadlineExceeded (see RenderLimits).
  virtual absl::StatusOr<std::string> Render(
      const nlohmann::json& context, const jinja::RenderLimits& limits = {}) const = 0;
  // RenderOrdered is Render for an ordered_json context: object keys keep their insertion order
  // (what HF's `tojson` prints, e.g. for tool schemas), whereas nlohmann::json sorts keys.
  virtual absl::StatusOr<std::string> RenderOrdered(
      const nlohmann::ordered_json& context, const jinja::RenderLimits& limits = {}) const = 0;

  // RenderMessages is Render with messages, add_generation_prompt, and the bos/eos tokens read
  // by FromModelDir (empty when built with Parse) merged with `extra` (e.g. tools).
  absl::StatusOr<std::string> RenderMessages(const nlohmann::json& messages,
                                             bool add_generation_prompt,
                                             const nlohmann::json& extra = nlohmann::json::object(),
                                             const jinja::RenderLimits& limits = {}) const;
  // RenderMessagesOrdered is RenderMessages keeping object key order (see RenderOrdered).
  // HF passes `tools` and `documents` (None unless given in `extra`) to every template; so do
  // both functions. Keys of `extra` override bos_token/eos_token.
  absl::StatusOr<std::string> RenderMessagesOrdered(
      const nlohmann::ordered_json& messages, bool add_generation_prompt,
      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
      const jinja::RenderLimits& limits = {}) const;

  // The bos/eos token strings read by FromModelDir (empty when built with Parse).
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // The Jinja source (e.g. to detect whether it iterates over content parts, or to find the
  // model's tool-call syntax).
  const std::string& source() const { return source_; }

 protected:
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
