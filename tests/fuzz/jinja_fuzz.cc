// The chat-template (Jinja) renderer with arbitrary templates and arbitrary messages.
//
// Input: template source, a NUL byte, then the render context as JSON. A context that is not a
// JSON object is replaced by a fixed conversation, so template-only inputs still render.
#include <cstdint>
#include <string>

#include "engine/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::Input in(data, size);
  const std::string source(in.Field('\0'));
  const std::string_view context_text = in.Rest();

  auto tmpl = sluice::ChatTemplate::Parse(source);
  if (!tmpl.ok()) return 0;
  nlohmann::ordered_json context =
      nlohmann::ordered_json::parse(context_text, nullptr, /*allow_exceptions=*/false);
  if (!context.is_object()) {
    context = nlohmann::ordered_json::parse(R"({
      "messages": [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Hi <|eot_id|> {{ x }}"},
                   {"role": "assistant", "content": "Hello", "tool_calls": [
                     {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
                   {"role": "tool", "content": [{"type": "text", "text": "42"}]}],
      "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})");
  }
  (void)(*tmpl)->RenderOrdered(context);
  const nlohmann::json unordered = context;
  (void)(*tmpl)->Render(unordered);
  return 0;
}
