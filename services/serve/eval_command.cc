#include "services/serve/eval_command.h"

#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

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
  return ppl;
}

int RunEvalPerplexity(const EvalOptions& options) {
  absl::StatusOr<Url> url = ParseUrl(options.url);
  absl::StatusOr<std::vector<std::string>> texts =
      url.ok() ? ReadTexts(options.file) : absl::StatusOr<std::vector<std::string>>(url.status());
  if (!texts.ok()) {
    std::cerr << "sluice eval ppl: " << texts.status().message() << "\n";
    return 1;
  }
  std::string model = options.model;
  if (model.empty()) {
    absl::StatusOr<json> models = Request(*url, http::verb::get, "/v1/models", "");
    if (!models.ok() || !(*models)["data"].is_array() || (*models)["data"].empty()) {
      std::cerr << "sluice eval ppl: cannot list models: "
                << (models.ok() ? "no model" : std::string(models.status().message())) << "\n";
      return 1;
    }
    model = (*models)["data"][0]["id"].get<std::string>();
  }
  double total_nll = 0.0;
  int64_t total_tokens = 0;
  json per_text = json::array();
  for (const std::string& text : *texts) {
    const json body{{"model", model},   {"prompt", text},        {"max_tokens", 1},
                    {"echo", true},     {"logprobs", 0},         {"temperature", 0},
                    {"add_special_tokens", options.add_special_tokens}};
    absl::StatusOr<json> reply = Request(*url, http::verb::post, "/v1/completions", body.dump());
    if (!reply.ok()) {
      std::cerr << "sluice eval ppl: " << reply.status().message() << "\n";
      return 1;
    }
    const json& logprobs = (*reply)["choices"][0]["logprobs"]["token_logprobs"];
    const int64_t num_prompt = (*reply)["usage"]["prompt_tokens"].get<int64_t>();
    // The first num_prompt entries are the prompt's (the first is null); the last is the
    // generated token's, not part of the text.
    double nll = 0.0;
    int64_t n = 0;
    for (int64_t i = 1; i < num_prompt && i < static_cast<int64_t>(logprobs.size()); ++i) {
      nll -= logprobs[i].get<double>();
      ++n;
    }
    total_nll += nll;
    total_tokens += n;
    per_text.push_back({{"num_tokens", n},
                        {"nll", nll},
                        {"ppl", n > 0 ? std::exp(nll / static_cast<double>(n)) : 0.0}});
  }
  const json result{{"model", model},
                    {"num_texts", texts->size()},
                    {"num_tokens", total_tokens},
                    {"nll", total_nll},
                    {"ppl", total_tokens > 0
                                ? std::exp(total_nll / static_cast<double>(total_tokens))
                                : 0.0},
                    {"texts", std::move(per_text)}};
  std::cout << result.dump() << std::endl;
  return 0;
}

}  // namespace sluice
