// API keys and quotas: SHA-256, the keys file, the token buckets, tenant cache salts, and the
// OpenAiService gate (401 / 429 + Retry-After, /health open, tenant → cache_salt).
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/api/auth/api_auth.h"
#include "services/api/auth/request_admission.h"
#include "services/api/auth/sha256.h"
#include "services/api/openai_service.h"
#include "tests/unit/api_test_fakes.h"

namespace sluice {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::ByteTokenizer;
using testing::FakeBackend;
using testing::ManualExecutor;
using testing::RecordingSink;

TEST(Sha256Test, KnownDigests) {
  // FIPS 180-4 examples.
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
}

TEST(ApiKeysFileTest, ParsesKeysAndLimits) {
  const std::string digest = Sha256Hex("sk-a");
  auto keys = ParseApiKeysJson(json{{"keys",
                                     {{{"sha256", digest},
                                       {"name", "alice"},
                                       {"tenant", "acme"},
                                       {"requests_per_second", 2.5},
                                       {"tokens_per_minute", 600},
                                       {"max_concurrent_requests", 3}},
                                      {{"sha256", Sha256Hex("sk-b")}}}}}
                                   .dump());
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].sha256, digest);
  EXPECT_EQ((*keys)[0].name, "alice");
  EXPECT_EQ((*keys)[0].tenant, "acme");
  EXPECT_DOUBLE_EQ((*keys)[0].limits.requests_per_second, 2.5);
  EXPECT_EQ((*keys)[0].limits.tokens_per_minute, 600);
  EXPECT_EQ((*keys)[0].limits.max_concurrent_requests, 3);
  EXPECT_EQ((*keys)[1].name, Sha256Hex("sk-b").substr(0, 8));
  EXPECT_EQ((*keys)[1].tenant, "");
  EXPECT_EQ((*keys)[1].limits.tokens_per_minute, 0);
}

TEST(ApiKeysFileTest, RejectsBadFiles) {
  const std::string d = Sha256Hex("k");
  struct Case {
    std::string text;
    std::string error;
  } cases[] = {
      {"not json", "not valid JSON"},
      {R"({"key": []})", "expected an object"},
      {R"({"keys": [], "extra": 1})", "unknown field 'extra'"},
      {R"({"keys": [{"sha256": "abc"}]})", "keys[0].sha256 must be 64 hex digits"},
      {json{{"keys", {{{"sha256", d}, {"tokens_per_min", 5}}}}}.dump(),
       "keys[0].tokens_per_min is not a known field"},
      {json{{"keys", {{{"sha256", d}}, {{"sha256", d}}}}}.dump(), "keys[1].sha256 is listed twice"},
      {json{{"keys", {{{"sha256", d}, {"requests_per_second", -1}}}}}.dump(),
       "requests_per_second must be a number >= 0"},
      {json{{"keys", {{{"sha256", d}, {"tokens_per_minute", 1.5}}}}}.dump(),
       "tokens_per_minute must be an integer"},
      {json{{"keys", {{{"sha256", d}, {"tenant", 7}}}}}.dump(), "keys[0].tenant must be a string"},
  };
  for (const Case& c : cases) {
    auto keys = ParseApiKeysJson(c.text);
    ASSERT_FALSE(keys.ok()) << c.text;
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(keys.status().message()), HasSubstr(c.error)) << c.text;
  }
}

std::string WriteTempFile(const std::string& text) {
  char path[] = "/tmp/sluice-keys-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(ApiAuthTest, AuthenticatesBearerKeysAndReloads) {
  const std::string file = WriteTempFile(
      json{{"keys", {{{"sha256", Sha256Hex("sk-file")}, {"tenant", "t1"}}}}}.dump());
  ApiAuthOptions options;
  options.api_key = "sk-plain";
  options.api_keys_file = file;
  auto auth = ApiAuth::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->num_keys(), 2u);

  auto key = (*auth)->Authenticate("Bearer sk-file");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ((*key)->tenant, "t1");
  key = (*auth)->Authenticate("bearer   sk-plain ");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ((*key)->name, "--api-key");
  EXPECT_TRUE((*auth)->Authenticate("sk-plain").ok());  // a bare key

  for (const char* bad : {"", "Bearer ", "Bearer sk-wrong", "Basic c2stZmlsZQ==", "sk-file2"}) {
    auto denied = (*auth)->Authenticate(bad);
    ASSERT_FALSE(denied.ok()) << bad;
    EXPECT_EQ(denied.status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
  EXPECT_THAT(std::string((*auth)->Authenticate("").status().message()),
              HasSubstr("didn't provide an API key"));

  // Reload: the file's key is replaced; a broken file keeps the previous keys.
  std::ofstream(file) << json{{"keys", {{{"sha256", Sha256Hex("sk-new")}}}}}.dump();
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_FALSE((*auth)->Authenticate("Bearer sk-file").ok());
  EXPECT_TRUE((*auth)->Authenticate("Bearer sk-new").ok());
  EXPECT_TRUE((*auth)->Authenticate("Bearer sk-plain").ok());
  std::ofstream(file) << "{broken";
  EXPECT_FALSE((*auth)->Reload().ok());
  EXPECT_TRUE((*auth)->Authenticate("Bearer sk-new").ok());
  std::remove(file.c_str());
}

ApiKey KeyWith(ApiKeyLimits limits) {
  ApiKey key;
  key.sha256 = Sha256Hex("limited");
  key.name = "limited";
  key.limits = limits;
  return key;
}

TEST(QuotaLimiterTest, RequestsPerSecondBucket) {
  QuotaLimiter limiter;
  const ApiKey key = KeyWith({/*requests_per_second=*/2, 0, 0});
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(limiter.Admit(key, 1, t0).ok());
  EXPECT_TRUE(limiter.Admit(key, 1, t0).ok());  // a burst of max(1, rate) = 2
  auto refused = limiter.Admit(key, 1, t0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("2 requests per second"));
  EXPECT_EQ(RetryAfterSeconds(refused.status()), 1);  // 0.5 s, rounded up
  EXPECT_TRUE(limiter.Admit(key, 1, t0 + absl::Milliseconds(500)).ok());
  EXPECT_FALSE(limiter.Admit(key, 1, t0 + absl::Milliseconds(600)).ok());
}

TEST(QuotaLimiterTest, TokensPerMinuteBucket) {
  QuotaLimiter limiter;
  const ApiKey key = KeyWith({0, /*tokens_per_minute=*/600, 0});  // refills 10 tokens/s
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(limiter.Admit(key, 400, t0).ok());
  auto refused = limiter.Admit(key, 300, t0);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("600 tokens per minute"));
  EXPECT_EQ(RetryAfterSeconds(refused.status()), 10);  // 100 tokens missing at 10/s
  EXPECT_FALSE(limiter.Admit(key, 300, t0 + absl::Seconds(9)).ok());
  EXPECT_TRUE(limiter.Admit(key, 300, t0 + absl::Seconds(10)).ok());
  // More than a whole minute's budget can never be admitted: no Retry-After.
  auto too_large = limiter.Admit(key, 601, t0 + absl::Hours(1));
  ASSERT_FALSE(too_large.ok());
  EXPECT_THAT(std::string(too_large.status().message()), HasSubstr("Request too large"));
  EXPECT_FALSE(RetryAfterSeconds(too_large.status()).has_value());
}

TEST(QuotaLimiterTest, ConcurrencyAndRefusalsCostNothing) {
  QuotaLimiter limiter;
  const ApiKey key = KeyWith({/*requests_per_second=*/1, /*tokens_per_minute=*/60,
                              /*max_concurrent_requests=*/1});
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto first = limiter.Admit(key, 10, t0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(limiter.InFlight(key.sha256), 1);
  // Refused for concurrency (a second later, the rate bucket has refilled).
  auto second = limiter.Admit(key, 10, t0 + absl::Seconds(1));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("concurrent"));
  EXPECT_EQ(RetryAfterSeconds(second.status()), 1);
  first->reset();
  EXPECT_EQ(limiter.InFlight(key.sha256), 0);
  // The refusal charged neither bucket: 50 tokens + 1 request are left (refill 1 token/s).
  auto third = limiter.Admit(key, 51, t0 + absl::Seconds(1));
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST(RequestAdmissionTest, TenantSaltAndCost) {
  ApiKey tenant_key;
  tenant_key.tenant = "acme";
  ApiKey plain_key;
  EXPECT_EQ(TenantCacheSalt(tenant_key, ""), "t4:acme");
  EXPECT_EQ(TenantCacheSalt(tenant_key, "anything"), "t4:acme");
  EXPECT_EQ(TenantCacheSalt(plain_key, ""), "");
  // A request salt can never spell a tenant's namespace.
  EXPECT_EQ(TenantCacheSalt(plain_key, "t4:acme"), "r:t4:acme");

  GenerationRequest request;
  request.prompts = {{1, 2, 3}, {4, 5}};
  request.n = 2;
  request.sampling.max_tokens = 10;
  request.max_tokens_given = true;
  EXPECT_EQ(RequestCostTokens(request, 64), 3 + 2 * 10 + 2 + 2 * 10);
  request.max_tokens_given = false;  // the context left per prompt
  EXPECT_EQ(RequestCostTokens(request, 64), 3 + 2 * 61 + 2 + 2 * 62);
}

using HeaderSink = RecordingSink;  // records response headers too

class ServiceAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string file = WriteTempFile(
        json{{"keys",
              {{{"sha256", Sha256Hex("sk-acme")}, {"tenant", "acme"},
                {"max_concurrent_requests", 1}},
               {{"sha256", Sha256Hex("sk-slow")}, {"requests_per_second", 1}}}}}
            .dump());
    ApiAuthOptions auth_options;
    auth_options.api_keys_file = file;
    auto auth = ApiAuth::Create(auth_options);
    ASSERT_TRUE(auth.ok()) << auth.status();
    std::remove(file.c_str());
    auth_ = *std::move(auth);
    OpenAiServiceOptions options;
    options.served_model_name = "mini";
    options.auth = auth_.get();
    service_ = std::make_unique<OpenAiService>(&backend_, &tokenizer_, nullptr, options);
  }

  std::shared_ptr<HeaderSink> Send(const std::string& method, const std::string& target,
                                   const std::string& key, const json& body = nullptr) {
    auto sink = std::make_shared<HeaderSink>();
    HttpRequestInfo request{method, target, body.is_null() ? "" : body.dump(),
                            key.empty() ? "" : "Bearer " + key};
    handles_.push_back(service_->Handle(request, sink, executor_.poster()));
    executor_.Drain();
    return sink;
  }
  json Completion(const std::string& salt = "") {
    json body = {{"model", "mini"}, {"prompt", "ab"}, {"max_tokens", 2}};
    if (!salt.empty()) body["cache_salt"] = salt;
    return body;
  }

  ByteTokenizer tokenizer_;
  FakeBackend backend_;
  std::unique_ptr<ApiAuth> auth_;
  std::unique_ptr<OpenAiService> service_;
  ManualExecutor executor_;
  std::vector<std::shared_ptr<RequestHandle>> handles_;
};

TEST_F(ServiceAuthTest, MissingOrWrongKeyIs401AndNeverReachesTheBackend) {
  for (const std::string key : {"", "sk-wrong"}) {
    auto sink = Send("POST", "/v1/completions", key, Completion());
    EXPECT_EQ(sink->status, 401) << key;
    json error = sink->json()["error"];
    EXPECT_EQ(error["type"], "invalid_request_error");
    EXPECT_EQ(error["code"], "invalid_api_key");
    EXPECT_EQ(sink->headers["WWW-Authenticate"], "Bearer");
    EXPECT_EQ(Send("GET", "/v1/models", key)->status, 401);
  }
  EXPECT_TRUE(backend_.order().empty());
  // /health and (without --protect-metrics) /metrics stay open.
  EXPECT_EQ(Send("GET", "/health", "")->status, 200);
  EXPECT_EQ(Send("GET", "/metrics", "")->status, 200);
  EXPECT_EQ(Send("GET", "/v1/models", "sk-acme")->status, 200);
}

TEST_F(ServiceAuthTest, TenantBecomesCacheSaltAndConcurrencyIsLimited) {
  auto first = Send("POST", "/v1/completions", "sk-acme", Completion("other-salt"));
  ASSERT_EQ(backend_.order().size(), 1u);
  const std::string id = backend_.order()[0];
  EXPECT_EQ(backend_.request(id).cache_salt, "t4:acme");
  // The key allows one request in flight.
  auto second = Send("POST", "/v1/completions", "sk-acme", Completion());
  EXPECT_EQ(second->status, 429);
  EXPECT_EQ(second->json()["error"]["type"], "rate_limit_error");
  EXPECT_EQ(second->json()["error"]["code"], "rate_limit_exceeded");
  EXPECT_EQ(second->headers["Retry-After"], "1");
  EXPECT_EQ(backend_.order().size(), 1u);
  backend_.EmitText(id, "xy", FinishReason::kLength);
  executor_.Drain();
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(service_->num_in_flight(), 0);
  auto third = Send("POST", "/v1/completions", "sk-acme", Completion());
  EXPECT_EQ(backend_.order().size(), 2u);
  // A key without a tenant keeps its own salt, in the request namespace.
  Send("POST", "/v1/completions", "sk-slow", Completion("mine"));
  ASSERT_EQ(backend_.order().size(), 3u);
  EXPECT_EQ(backend_.request(backend_.order()[2]).cache_salt, "r:mine");
  auto limited = Send("POST", "/v1/completions", "sk-slow", Completion());
  EXPECT_EQ(limited->status, 429);
  EXPECT_EQ(limited->headers["Retry-After"], "1");
}

}  // namespace
}  // namespace sluice
