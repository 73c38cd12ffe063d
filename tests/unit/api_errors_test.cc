// OpenAI error bodies: HTTP status and `type` per absl status code, and the named param.
#include <gtest/gtest.h>

#include "services/api/openai_errors.h"

namespace sluice {
namespace {

TEST(OpenAiErrorsTest, StatusCodesAndTypes) {
  struct Case {
    absl::Status status;
    int http;
    const char* type;
  };
  const Case cases[] = {
      {absl::InvalidArgumentError("bad"), 400, "invalid_request_error"},
      {absl::NotFoundError("The model 'x' does not exist"), 404, "invalid_request_error"},
      {absl::ResourceExhaustedError("full"), 429, "rate_limit_error"},
      {absl::UnavailableError("overloaded"), 503, "server_error"},
      {absl::DeadlineExceededError("slow"), 504, "server_error"},
      {absl::InternalError("bug"), 500, "server_error"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(HttpStatusFor(c.status), c.http) << c.status;
    const nlohmann::json body = OpenAiErrorJson(c.status);
    EXPECT_EQ(body["error"]["type"], c.type) << c.status;
    EXPECT_EQ(body["error"]["code"], c.http);
    EXPECT_EQ(body["error"]["message"], std::string(c.status.message()));
    EXPECT_TRUE(body["error"]["param"].is_null());
  }
}

TEST(OpenAiErrorsTest, ParamFromPayload) {
  const nlohmann::json body = OpenAiErrorJson(InvalidParam("top_p", "top_p must be in (0, 1]"));
  EXPECT_EQ(body["error"]["param"], "top_p");
  EXPECT_EQ(body["error"]["message"], "top_p must be in (0, 1]");
}

}  // namespace
}  // namespace sluice
