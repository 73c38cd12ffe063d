#include "services/api/request_log.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/api/openai_responses.h"

namespace sluice {
namespace {

constexpr size_t kMaxUserBytes = 256;

// Quoted escapes control characters (newlines included) and quotes; invalid UTF-8 becomes
// U+FFFD (DumpJson).
std::string Quoted(const std::string& s) { return DumpJson(nlohmann::json(s)); }

}  // namespace

std::string RequestLogLine(const RequestLogEntry& e) {
  std::string line = absl::StrCat("POST ", e.path, " ", e.status);
  if (!e.id.empty()) absl::StrAppend(&line, " id=", e.id);
  absl::StrAppend(&line, " user=",
                  e.user.empty() ? std::string("-") : Quoted(e.user.substr(0, kMaxUserBytes)));
  if (e.prompt_tokens >= 0) absl::StrAppend(&line, " prompt_tokens=", e.prompt_tokens);
  if (e.completion_tokens >= 0) {
    absl::StrAppend(&line, " completion_tokens=", e.completion_tokens);
  }
  if (!e.finish.empty()) absl::StrAppend(&line, " finish=", e.finish);
  if (e.e2e_seconds >= 0) absl::StrAppend(&line, absl::StrFormat(" e2e=%.3fs", e.e2e_seconds));
  if (!e.error.empty()) absl::StrAppend(&line, " error=", Quoted(e.error));
  return line;
}

std::string RequestUser(const nlohmann::json& body) {
  auto it = body.find("user");
  return it != body.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace sluice
