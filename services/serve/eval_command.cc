#include "services/serve/eval_command.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/serve/ppl_windows.h"

namespace sluice {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;
using nlohmann::json;

struct Url {
  std::string host;
  std::string port;
};

absl::StatusOr<Url> ParseUrl(std::string url) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--url must start with http://, got ", url));
  }
  url = url.substr(kScheme.size());
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.find('/') != std::string::npos) url = url.substr(0, url.find('/'));
  const size_t colon = url.rfind(':');
  if (colon == std::string::npos) return Url{url, "80"};
  return Url{url.substr(0, colon), url.substr(colon + 1)};
}

// Request sends one HTTP request and returns the parsed JSON reply (errors: transport, a
// non-200 status with the server's message, or a body that is not JSON).
absl::StatusOr<json> Request(const Url& url, http::verb verb, const std::string& target,
                             const std::string& body) {
  try {
    boost::asio::io_context io;
    tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.connect(resolver.resolve(url.host, url.port));
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, url.host);
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(1ull << 30);  // echo + logprobs replies of long texts are large
    http::read(stream, buffer, parser);
    const http::response<http::string_body>& res = parser.get();
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    json parsed = json::parse(res.body(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      return absl::InternalError(absl::StrCat(target, ": the reply is not JSON"));
    }
    if (res.result_int() != 200) {
      return absl::InternalError(absl::StrCat(target, ": HTTP ", res.result_int(), ": ",
                                              parsed.dump()));
    }
    return parsed;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(target, ": ", e.what()));
  }
}

absl::StatusOr<std::vector<std::string>> ReadTexts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<std::string> texts;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // Texts travel as JSON strings: invalid UTF-8 would only fail later, inside dump().
    try {
      (void)json(line).dump();
    } catch (const json::type_error&) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": not valid UTF-8"));
    }
    if (line[0] == '{') {
      json parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded() && parsed.contains("text") && parsed["text"].is_string()) {
        texts.push_back(parsed["text"].get<std::string>());
        continue;
      }
    }
    texts.push_back(line);
  }
  if (texts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no text to score"));
  return texts;
}

// One request: `prompt` (a text or token ids); its echoed logprobs at prompt positions
// [first, first + count) are summed (count < 0: every prompt position after the first).
struct ScoreJob {
  size_t text = 0;
  json prompt;
  int64_t first = 1;
  int64_t count = -1;
};

struct ScoreResult {
  double nll = 0.0;
  int64_t num_tokens = 0;
};

absl::StatusOr<ScoreResult> Score(const Url& url, const std::string& model,
                                  const EvalOptions& options, const ScoreJob& job) {
  json body{{"model", model},  {"prompt", job.prompt}, {"max_tokens", 1},
            {"echo", true},    {"logprobs", 0},        {"temperature", 0}};
  if (job.prompt.is_string()) body["add_special_tokens"] = options.add_special_tokens;
  absl::StatusOr<json> reply = Request(url, http::verb::post, "/v1/completions", body.dump());
  if (!reply.ok()) return reply.status();
  const json* logprobs = nullptr;
  int64_t num_prompt = 0;
  try {
    logprobs = &reply->at("choices").at(0).at("logprobs").at("token_logprobs");
    num_prompt = reply->at("usage").at("prompt_tokens").get<int64_t>();
  } catch (const json::exception&) {
    return absl::InternalError("the reply has no echoed prompt logprobs (choices[0].logprobs."
                               "token_logprobs, usage.prompt_tokens)");
  }
  // The first num_prompt entries are the prompt's (the first is null); the last is the
  // generated token's, not part of the text.
  const int64_t end = job.count < 0 ? num_prompt : job.first + job.count;
  if (end > num_prompt || end > static_cast<int64_t>(logprobs->size())) {
    return absl::InternalError(absl::StrCat("the reply echoes ", num_prompt,
                                            " prompt tokens, fewer than the ", end, " sent"));
  }
  ScoreResult result;
  for (int64_t i = job.first; i < end; ++i) {
    if (!(*logprobs)[i].is_number()) {
      return absl::InternalError(absl::StrCat("prompt token ", i, " has no logprob"));
    }
    result.nll -= (*logprobs)[i].get<double>();
    ++result.num_tokens;
  }
  return result;
}

// ServerModel returns the served model's name (options.model, or the only one listed) and its
// max_model_len (0 when /v1/models does not say).
absl::StatusOr<std::pair<std::string, int64_t>> ServerModel(const Url& url,
                                                            const std::string& wanted) {
  absl::StatusOr<json> models = Request(url, http::verb::get, "/v1/models", "");
  if (!models.ok()) return models.status();
  const json& data = (*models)["data"];
  if (!data.is_array() || data.empty()) return absl::NotFoundError("the server lists no model");
  for (const json& entry : data) {
    const std::string id = entry.value("id", "");
    if (!wanted.empty() && id != wanted) continue;
    const json max_len = entry.value("max_model_len", json());
    return std::make_pair(id, max_len.is_number_integer() ? max_len.get<int64_t>() : 0);
  }
  return absl::NotFoundError(absl::StrCat("the server does not list model '", wanted, "'"));
}

// PlanJobs turns the texts into requests: whole texts, or with a tokenizer, token-id windows.
std::vector<ScoreJob> PlanJobs(const std::vector<std::string>& texts, const Tokenizer* tokenizer,
                               int64_t max_length, int64_t stride, bool add_special_tokens) {
  std::vector<ScoreJob> jobs;
  for (size_t t = 0; t < texts.size(); ++t) {
    if (tokenizer == nullptr) {
      jobs.push_back(ScoreJob{t, texts[t], 1, -1});
      continue;
    }
    const std::vector<int32_t> ids = tokenizer->Encode(texts[t], add_special_tokens);
    for (const PplWindow& w :
         PlanPplWindows(static_cast<int64_t>(ids.size()), max_length, stride)) {
      jobs.push_back(ScoreJob{t, json(std::vector<int32_t>(ids.begin() + w.begin,
                                                           ids.begin() + w.end)),
                              w.first_scored - w.begin, w.end - w.first_scored});
    }
  }
  return jobs;
}

}  // namespace

CLI::App* AddEvalCommand(CLI::App& app, EvalOptions& options) {
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a served model through its API");
  eval->require_subcommand(1);
  CLI::App* ppl = eval->add_subcommand(
      "ppl", "Perplexity of a text file (one text per line, or JSON lines with \"text\")");
  ppl->add_option("file", options.file, "Texts to score")->required();
  ppl->add_option("--url", options.url, "Server base URL (sluice serve or the router)");
  ppl->add_option("--model", options.model, "Model name (default: the server's model)");
  ppl->add_flag("!--no-special-tokens", options.add_special_tokens,
                "Do not prepend BOS to each text");
  ppl->add_option("--tokenizer", options.tokenizer_dir,
                  "Model directory whose tokenizer.json the server uses: tokenize here and "
                  "score texts longer than --max-length in strided windows");
  ppl->add_option("--max-length", options.max_length,
                  "With --tokenizer: tokens per window (default: max_model_len - 1)");
  ppl->add_option("--stride", options.stride,
                  "With --tokenizer: tokens each later window scores (default: max-length / 2)");
  ppl->add_option("--concurrency", options.concurrency, "Requests in flight")
      ->check(CLI::Range(1, 256));
  return ppl;
}

int RunEvalPerplexity(const EvalOptions& options) {
  auto fail = [](absl::string_view message) {
    std::cerr << "sluice eval ppl: " << message << "\n";
    return 1;
  };
  if (options.tokenizer_dir.empty() && (options.max_length != 0 || options.stride != 0)) {
    return fail("--max-length and --stride need --tokenizer (windows are cut from token ids)");
  }
  absl::StatusOr<Url> url = ParseUrl(options.url);
  if (!url.ok()) return fail(url.status().message());
  absl::StatusOr<std::vector<std::string>> texts = ReadTexts(options.file);
  if (!texts.ok()) return fail(texts.status().message());
  std::unique_ptr<Tokenizer> tokenizer;
  if (!options.tokenizer_dir.empty()) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded =
        Tokenizer::FromFile(options.tokenizer_dir + "/tokenizer.json");
    if (!loaded.ok()) return fail(loaded.status().message());
    tokenizer = *std::move(loaded);
  }
  absl::StatusOr<std::pair<std::string, int64_t>> served = ServerModel(*url, options.model);
  if (!served.ok()) return fail(absl::StrCat("cannot list models: ", served.status().message()));
  const std::string& model = served->first;
  int64_t max_length = options.max_length;
  int64_t stride = options.stride;
  if (tokenizer != nullptr) {
    // A window plus the one generated token must fit the context.
    if (max_length == 0) max_length = served->second - 1;
    if (max_length < 2) {
      return fail(served->second == 0 && options.max_length == 0
                      ? "the server does not report max_model_len: give --max-length"
                      : absl::StrCat("--max-length must be at least 2, got ", max_length));
    }
    if (stride == 0) stride = max_length / 2;
    if (stride < 1 || stride >= max_length) {
      return fail(absl::StrCat("--stride must be in [1, max-length - 1 = ", max_length - 1,
                               "], got ", stride));
    }
  }
  const std::vector<ScoreJob> jobs =
      PlanJobs(*texts, tokenizer.get(), max_length, stride, options.add_special_tokens);

  // Requests in flight on `concurrency` threads; the first error stops the rest.
  std::vector<absl::StatusOr<ScoreResult>> results(jobs.size(),
                                                   absl::CancelledError("not scored"));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (size_t j = next++; j < jobs.size() && !failed.load(); j = next++) {
      results[j] = Score(*url, model, options, jobs[j]);
      if (!results[j].ok()) failed = true;
    }
  };
  std::vector<std::thread> threads;
  const size_t num_threads =
      std::min<size_t>(static_cast<size_t>(std::max(1, options.concurrency)), jobs.size());
  for (size_t i = 0; i < num_threads; ++i) threads.emplace_back(work);
  for (std::thread& thread : threads) thread.join();
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (results[j].ok() || absl::IsCancelled(results[j].status())) continue;
    std::string message(results[j].status().message());
    if (tokenizer == nullptr && message.find("maximum context length") != std::string::npos) {
      absl::StrAppend(&message, " (--tokenizer MODEL_DIR scores long texts in windows)");
    }
    return fail(absl::StrCat("text ", jobs[j].text + 1, ": ", message));
  }

  std::vector<ScoreResult> per_text(texts->size());
  std::vector<int64_t> windows(texts->size(), 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    per_text[jobs[j].text].nll += results[j]->nll;
    per_text[jobs[j].text].num_tokens += results[j]->num_tokens;
    ++windows[jobs[j].text];
  }
  auto ppl = [](double nll, int64_t n) {
    return n > 0 ? std::exp(nll / static_cast<double>(n)) : 0.0;
  };
  double total_nll = 0.0;
  int64_t total_tokens = 0;
  json texts_json = json::array();
  for (size_t t = 0; t < per_text.size(); ++t) {
    total_nll += per_text[t].nll;
    total_tokens += per_text[t].num_tokens;
    texts_json.push_back({{"num_tokens", per_text[t].num_tokens},
                          {"nll", per_text[t].nll},
                          {"ppl", ppl(per_text[t].nll, per_text[t].num_tokens)},
                          {"num_windows", windows[t]}});
  }
  json result{{"model", model},
              {"num_texts", texts->size()},
              {"num_tokens", total_tokens},
              {"nll", total_nll},
              {"ppl", ppl(total_nll, total_tokens)},
              {"num_windows", jobs.size()},
              {"texts", std::move(texts_json)}};
  if (tokenizer != nullptr) {
    result["max_length"] = max_length;
    result["stride"] = stride;
  }
  std::cout << result.dump() << std::endl;
  return 0;
}

}  // namespace sluice
