#include "services/serve/generate_command.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "absl/strings/str_cat.h"
#include "common/json_parse.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_protocol.h"
#include "services/api/openai_responses.h"
#include "services/api/openai_service.h"
#include "services/serve/log.h"

namespace sluice {
namespace {

using nlohmann::json;
namespace net = boost::asio;

// LineJob is one input line and, once answered, its output line.
struct LineJob {
  size_t line_number = 0;  // 1-based, in the input file
  std::optional<json> custom_id;
  Endpoint endpoint = Endpoint::kCompletions;
  json body;
  // The body's tools in the line's key order (for the chat template); null: none.
  std::shared_ptr<const nlohmann::ordered_json> ordered_tools;
  // The body in the line's key order when a JSON Schema's property order counts; null: none.
  std::shared_ptr<const nlohmann::ordered_json> ordered_body;
  absl::Status parse_error;  // non-OK: answered without running
  std::optional<std::string> output;
  int64_t completion_tokens = 0;
};

// BuildJob interprets one input line.
LineJob BuildJob(const std::string& line, size_t line_number, const std::string& model_name) {
  LineJob job;
  job.line_number = line_number;
  absl::StatusOr<json> parsed = ParseJsonBody(line);
  if (!parsed.ok()) {
    job.parse_error = absl::InvalidArgumentError(
        absl::StrCat("line ", line_number, ": ", parsed.status().message()));
    return job;
  }
  json& obj = *parsed;
  if (obj.contains("custom_id")) {
    job.custom_id = obj["custom_id"];
  } else if (obj.contains("id")) {
    job.custom_id = obj["id"];
  }
  std::string url;
  if (obj.contains("body") && obj["body"].is_object()) {
    url = obj.value("url", "");
    job.body = obj["body"];
  } else {
    job.body = obj;
    job.body.erase("custom_id");
    job.body.erase("id");
  }
  if (url == "/v1/chat/completions" || (url.empty() && job.body.contains("messages"))) {
    job.endpoint = Endpoint::kChatCompletions;
  } else if (url == "/v1/completions" || (url.empty() && job.body.contains("prompt"))) {
    job.endpoint = Endpoint::kCompletions;
  } else {
    job.parse_error = InvalidParam(
        "messages", absl::StrCat("line ", line_number,
                                 ": needs 'messages' (chat) or 'prompt' (completion)"));
    return job;
  }
  const bool has_tools = job.body.contains("tools") && job.body["tools"].is_array();
  if (has_tools || NeedsKeyOrder(job.body)) {
    absl::StatusOr<nlohmann::ordered_json> ordered =
        ParseJsonLimited<nlohmann::ordered_json>(line);
    if (ordered.ok() && ordered->is_object()) {
      auto inner = ordered->find("body");
      const nlohmann::ordered_json& source =
          inner != ordered->end() && inner->is_object() ? *inner : *ordered;
      if (auto t = source.find("tools"); has_tools && t != source.end() && t->is_array()) {
        job.ordered_tools = std::make_shared<const nlohmann::ordered_json>(*t);
      }
      if (NeedsKeyOrder(job.body)) {
        job.ordered_body = std::make_shared<const nlohmann::ordered_json>(source);
      }
    }
  }
  if (!job.body.contains("model")) job.body["model"] = model_name;
  job.body["stream"] = false;
  job.body.erase("stream_options");
  return job;
}

std::string ErrorLine(const LineJob& job, const absl::Status& status) {
  json out = OpenAiErrorJson(status);
  if (job.custom_id.has_value()) out["custom_id"] = *job.custom_id;
  return DumpJson(out);
}

// CollectSink keeps the one response of a non-streamed request and reports it.
class CollectSink : public ResponseSink {
 public:
  using Done = std::function<void(int status, std::string body)>;
  explicit CollectSink(Done done) : done_(std::move(done)) {}
  void SendResponse(int status, const std::string&, std::string body) override {
    done_(status, std::move(body));
  }
  void StartEventStream() override {}
  void SendEvent(std::string) override {}
  void EndEventStream() override {}

 private:
  Done done_;
};

}  // namespace

int RunGenerate(const GenerateOptions& options) {
  std::ifstream input(options.input_path);
  if (!input) {
    spdlog::error("cannot open input {}", options.input_path);
    return 1;
  }
  std::ofstream output(options.output_path, std::ios::trunc);
  if (!output) {
    spdlog::error("cannot open output {}", options.output_path);
    return 1;
  }
  absl::StatusOr<ModelRuntime> runtime = LoadModelRuntime(options.runtime);
  if (!runtime.ok()) {
    spdlog::error("cannot load the model: {}", std::string(runtime.status().ToString()));
    return 1;
  }
  std::vector<LineJob> jobs;
  std::string line;
  size_t line_number = 0;
  while (std::getline(input, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    jobs.push_back(BuildJob(line, line_number, runtime->served_model_name));
  }
  const size_t total = jobs.size();
  spdlog::info("{} requests from {}", total, options.input_path);

  absl::StatusOr<std::unique_ptr<MultimodalRuntime>> multimodal =
      LoadMultimodal(options.runtime.model_dir, options.multimodal, *runtime->tokenizer,
                     runtime->chat_template.get(),
                     ResolveVisionPlacement(options.multimodal, options.runtime.device,
                                            options.runtime.load_format));
  if (!multimodal.ok()) {
    spdlog::error("cannot load the image encoder: {}", multimodal.status().ToString());
    return 1;
  }
  OpenAiServiceOptions service_options;
  service_options.served_model_name = runtime->served_model_name;
  service_options.max_concurrent_requests = std::max<int64_t>(options.max_in_flight, 1);
  service_options.log_requests = false;  // offline: the results file is the record
  if (*multimodal != nullptr) service_options.multimodal = &(*multimodal)->context;
  service_options.render_limits = options.render.limits;
  OpenAiService service(runtime->backend.get(), runtime->tokenizer.get(),
                        runtime->chat_template.get(), service_options);

  // One io thread serializes every session and this runner's bookkeeping.
  net::io_context ioc(1);
  auto work = net::make_work_guard(ioc);
  Poster poster = [&ioc](std::function<void()> task) { net::post(ioc, std::move(task)); };
  const auto start = std::chrono::steady_clock::now();
  size_t next_to_submit = 0;
  size_t next_to_write = 0;
  size_t num_done = 0;
  int64_t num_tokens = 0;
  auto last_progress = start - std::chrono::seconds(1);

  auto print_progress = [&](bool force) {
    if (!options.progress) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_progress < std::chrono::milliseconds(100)) return;
    last_progress = now;
    const double seconds = std::chrono::duration<double>(now - start).count();
    const double pct = total == 0 ? 100.0 : 100.0 * static_cast<double>(num_done) / total;
    const int width = 30;
    const int filled = static_cast<int>(pct / 100.0 * width);
    std::fprintf(stderr, "\r[%s%s] %zu/%zu (%.0f%%) | %.1f tok/s | %.1fs",
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 num_done, total, pct, seconds > 0 ? num_tokens / seconds : 0.0, seconds);
    std::fflush(stderr);
  };

  std::function<void()> submit_more;
  auto finish = [&](size_t index, std::string out_line) {
    jobs[index].output = std::move(out_line);
    ++num_done;
    while (next_to_write < total && jobs[next_to_write].output.has_value()) {
      output << *jobs[next_to_write].output << '\n';
      jobs[next_to_write].output = std::string();  // written; keep has_value
      jobs[next_to_write].body = json();
      ++next_to_write;
    }
    print_progress(num_done == total);
    if (num_done == total) {
      work.reset();
    } else {
      submit_more();
    }
  };
  submit_more = [&]() {
    while (next_to_submit < total &&
           next_to_submit - num_done < static_cast<size_t>(service_options.max_concurrent_requests)) {
      const size_t index = next_to_submit++;
      LineJob& job = jobs[index];
      if (!job.parse_error.ok()) {
        net::post(ioc, [&, index] { finish(index, ErrorLine(jobs[index], jobs[index].parse_error)); });
        continue;
      }
      auto sink = std::make_shared<CollectSink>([&, index](int status, std::string body) {
        // Called on the io thread, possibly from inside HandleGeneration: defer.
        net::post(ioc, [&, index, status, body = std::move(body)]() mutable {
          LineJob& j = jobs[index];
          json response = json::parse(body, nullptr, /*allow_exceptions=*/false);
          if (response.is_discarded()) response = json{{"error", {{"message", body}}}};
          // Like the lines rejected before running, a failed request names its input line
          // (blank lines are skipped, so output line numbers can differ from input ones).
          if (status != 200 && response.contains("error") && response["error"].is_object()) {
            json& error = response["error"];
            error["message"] = absl::StrCat("line ", j.line_number, ": ",
                                            error.value("message", std::string()));
          }
          if (status == 200 && response.contains("usage")) {
            const int64_t tokens = response["usage"].value("completion_tokens", int64_t{0});
            num_tokens += tokens;
          }
          if (j.custom_id.has_value()) response["custom_id"] = *j.custom_id;
          finish(index, DumpJson(response));
        });
      });
      service.HandleGeneration(job.endpoint, job.body, sink, poster, nullptr, job.ordered_tools,
                               job.ordered_body);
    }
  };
  if (total > 0) {
    net::post(ioc, [&] { submit_more(); });
    ioc.run();
  }
  if (options.progress) std::fprintf(stderr, "\n");
  output.flush();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("wrote {} lines to {} in {:.1f}s ({} generated tokens, {:.1f} tok/s)", total,
               options.output_path, seconds, num_tokens, seconds > 0 ? num_tokens / seconds : 0.0);
  runtime->backend.reset();
  return output.good() ? 0 : 1;
}

}  // namespace sluice
