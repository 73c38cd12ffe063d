#include "services/api/tool_calls/tool_call_output.h"

#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"

namespace sluice::tools {
namespace {

using nlohmann::json;

// Content without trailing whitespace: the space before a call is not content, and while
// streaming the whitespace is held until text follows it.
absl::string_view TrimEnd(absl::string_view s) { return absl::StripTrailingAsciiWhitespace(s); }

}  // namespace

std::string NewToolCallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::string id = "call_";
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
  return id;
}

ToolCallMessage ParseToolCallMessage(const ToolCallSyntax& syntax, absl::string_view text) {
  ToolCallMessage message;
  ToolCallParse parse = syntax.Parse(text, /*final=*/true);
  bool valid = !parse.calls.empty();
  for (const ToolCallDraft& call : parse.calls) {
    const json arguments = json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    if (!call.done || !call.name_done || call.name.empty() || !arguments.is_object()) {
      valid = false;
      break;
    }
  }
  if (!valid) {
    message.content = text.empty() ? json() : json(std::string(text));
    return message;
  }
  const absl::string_view content = TrimEnd(parse.content);
  message.content = content.empty() ? json() : json(std::string(content));
  for (ToolCallDraft& call : parse.calls) {
    message.tool_calls.push_back({{"id", NewToolCallId()},
                                  {"type", "function"},
                                  {"function", {{"name", std::move(call.name)},
                                                {"arguments", std::move(call.arguments)}}}});
  }
  return message;
}

ToolCallStream::ToolCallStream(std::shared_ptr<const ToolCallSyntax> syntax)
    : syntax_(std::move(syntax)) {}

ToolCallStream::Delta ToolCallStream::Update(absl::string_view text, bool final) {
  Delta delta;
  ToolCallParse parse = syntax_->Parse(text, final);
  // Once a call has streamed, later content (text between calls) is not sent.
  const absl::string_view content =
      final && parse.calls.empty() ? absl::string_view(parse.content) : TrimEnd(parse.content);
  if (calls_.empty() && content.size() > content_sent_) {
    delta.content = std::string(content.substr(content_sent_));
    content_sent_ = content.size();
  }
  for (size_t i = 0; i < parse.calls.size(); ++i) {
    const ToolCallDraft& call = parse.calls[i];
    if (!call.name_done) break;  // the name goes first
    if (i == calls_.size()) {
      calls_.push_back(SentCall{NewToolCallId(), 0});
      delta.tool_calls.push_back({{"index", i},
                                  {"id", calls_[i].id},
                                  {"type", "function"},
                                  {"function", {{"name", call.name}, {"arguments", ""}}}});
    }
    SentCall& sent = calls_[i];
    if (call.arguments.size() > sent.arguments_sent) {
      delta.tool_calls.push_back(
          {{"index", i},
           {"function", {{"arguments", call.arguments.substr(sent.arguments_sent)}}}});
      sent.arguments_sent = call.arguments.size();
    }
  }
  return delta;
}

}  // namespace sluice::tools
