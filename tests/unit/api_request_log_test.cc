// The request log line (request_log.h): its fields, the user JSON-quoted and cut so a client
// cannot forge lines, and the line the service writes for a refused request.
#include "services/api/request_log.h"

#include <string>

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(RequestLogTest, FinishedRequestLine) {
  RequestLogEntry e;
  e.path = "/v1/chat/completions";
  e.status = 200;
  e.id = "chatcmpl-1";
  e.user = "alice";
  e.prompt_tokens = 17;
  e.completion_tokens = 8;
  e.finish = "stop,length";
  e.e2e_seconds = 0.4123;
  EXPECT_EQ(RequestLogLine(e),
            "POST /v1/chat/completions 200 id=chatcmpl-1 user=\"alice\" prompt_tokens=17 "
            "completion_tokens=8 finish=stop,length e2e=0.412s");
}

TEST(RequestLogTest, RefusedRequestWithoutUser) {
  RequestLogEntry e;
  e.path = "/v1/responses";
  e.status = 400;
  e.error = "'tools' must be a list of tools";
  EXPECT_EQ(RequestLogLine(e),
            "POST /v1/responses 400 user=- error=\"'tools' must be a list of tools\"");
}

TEST(RequestLogTest, UserCannotForgeLines) {
  RequestLogEntry e;
  e.path = "/v1/completions";
  e.status = 200;
  e.user = "bob\nPOST /v1/completions 200 user=\"eve\"";
  const std::string line = RequestLogLine(e);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line, "POST /v1/completions 200 user=\"bob\\nPOST /v1/completions 200 user=\\\"eve\\\"\"");
  e.user = std::string(1000, 'x');
  EXPECT_EQ(RequestLogLine(e), "POST /v1/completions 200 user=\"" + std::string(256, 'x') + "\"");
}

TEST(RequestLogTest, RequestUser) {
  EXPECT_EQ(RequestUser({{"user", "u1"}}), "u1");
  EXPECT_EQ(RequestUser({{"user", 5}}), "");
  EXPECT_EQ(RequestUser(nlohmann::json::object()), "");
}

}  // namespace
}  // namespace sluice
