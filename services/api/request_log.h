// The request log: one line per generation request in the server log when it ends (on by
// default; `--disable-log-requests` turns it off), e.g.
//   POST /v1/chat/completions 200 id=chatcmpl-3f… user="alice" prompt_tokens=17
//   completion_tokens=8 finish=stop e2e=0.412s
// and for a request refused before it ran: POST /v1/responses 400 user="alice" error="…".
// `user` is the request's OpenAI `user` field (metadata: kept for logs, no effect on the
// output); it and the error are JSON-quoted, so a client cannot forge log lines, and the user
// is cut to 256 bytes. A request without a user shows user=-.
#ifndef SLUICE_SERVICES_API_REQUEST_LOG_H_
#define SLUICE_SERVICES_API_REQUEST_LOG_H_

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace sluice {

struct RequestLogEntry {
  std::string path;    // e.g. "/v1/chat/completions"
  int status = 0;      // the HTTP status sent (499: the client went away first)
  std::string id;      // the response id; empty when refused before it ran
  std::string user;    // the request's `user`; empty when absent
  int64_t prompt_tokens = -1;      // -1: not logged (refused)
  int64_t completion_tokens = -1;
  std::string finish;  // the choices' finish reasons, comma-separated
  double e2e_seconds = -1;
  std::string error;   // the error message, if it failed
};

// RequestLogLine formats an entry as above (fields that are unset are left out).
std::string RequestLogLine(const RequestLogEntry& entry);

// RequestUser is the body's `user` when it is a string, else "".
std::string RequestUser(const nlohmann::json& body);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_REQUEST_LOG_H_
