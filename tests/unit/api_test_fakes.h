// Test doubles for the OpenAI API layer: a byte tokenizer, a scripted InferenceBackend, a sink
// that records what a handler wrote, and a manual executor.
#ifndef SLUICE_TESTS_UNIT_API_TEST_FAKES_H_
#define SLUICE_TESTS_UNIT_API_TEST_FAKES_H_

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/api/inference_backend.h"
#include "services/common/response_sink.h"

namespace sluice::testing {

// ByteTokenizer: id 0 "<s>" (BOS), 1 "</s>" (EOS), 2 "<|user|>", 3 "<|assistant|>" are special;
// id 4 + b is the single byte b. Encode with add_special_tokens prepends BOS.
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBos = 0;
  static constexpr int32_t kEos = 1;
  static constexpr int32_t kByteBase = 4;
  static int32_t Byte(char c) { return kByteBase + static_cast<unsigned char>(c); }
  // Ids encodes `text` byte-wise (no specials, no BOS).
  static std::vector<int32_t> Ids(std::string_view text) {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(Byte(c));
    return ids;
  }

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens,
                              bool parse_special) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(kBos);
    size_t i = 0;
    while (i < text.size()) {
      bool matched = false;
      if (parse_special) {
        for (int32_t id = 0; id < kByteBase; ++id) {
          const std::string& s = kSpecials[id];
          if (text.substr(i, s.size()) == s) {
            ids.push_back(id);
            i += s.size();
            matched = true;
            break;
          }
        }
      }
      if (!matched) ids.push_back(Byte(text[i++]));
    }
    return ids;
  }
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string out;
    byte_level::AppendUtf8Lossy(DecodeBytes(ids, skip_special_tokens), &out);
    return out;
  }
  std::string DecodeBytes(absl::Span<const int32_t> ids,
                          bool skip_special_tokens) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < kByteBase) {
        if (!skip_special_tokens && id >= 0) out += kSpecials[id];
      } else if (id < vocab_size()) {
        out.push_back(static_cast<char>(id - kByteBase));
      }
    }
    return out;
  }
  std::string IdToToken(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    return id < kByteBase ? kSpecials[id] : std::string(1, static_cast<char>(id - kByteBase));
  }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    for (int32_t id = 0; id < kByteBase; ++id) {
      if (token == kSpecials[id]) return id;
    }
    if (token.size() == 1) return Byte(token[0]);
    return std::nullopt;
  }
  bool IsSpecial(int32_t id) const override { return id >= 0 && id < kByteBase; }
  int32_t vocab_size() const override { return kByteBase + 256; }

 private:
  inline static const std::string kSpecials[kByteBase] = {"<s>", "</s>", "<|user|>",
                                                          "<|assistant|>"};
};

// FakeBackend records submissions; tests drive each request's callback by hand (acting as the
// engine thread). Thread-safe.
class FakeBackend : public InferenceBackend {
 public:
  struct Submitted {
    EngineRequest request;
    OutputCallback callback;
    int32_t num_output_tokens = 0;
  };

  absl::Status Submit(EngineRequest request, OutputCallback on_output) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!submit_error.ok()) return submit_error;
    order_.push_back(request.request_id);
    const std::string id = request.request_id;
    requests_[id] = Submitted{std::move(request), std::move(on_output)};
    return absl::OkStatus();
  }
  void Abort(const std::string& request_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.push_back(request_id);
  }
  BackendStats Stats() const override {
    BackendStats s;
    s.num_waiting_requests = 2;
    s.num_running_requests = 3;
    s.num_total_blocks = 100;
    s.num_free_blocks = 25;
    s.block_size = 16;
    return s;
  }
  int32_t max_model_len() const override { return max_len; }

  // Emit delivers an output for request `id` with `tokens` (logprob -0.5 each, and a top-2
  // list) and the given finish reason.
  void Emit(const std::string& id, const std::vector<int32_t>& tokens,
            FinishReason finish = FinishReason::kNone, absl::Status status = absl::OkStatus()) {
    OutputCallback callback;
    RequestOutput out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Submitted& s = requests_.at(id);
      callback = s.callback;
      out.request_id = id;
      for (int32_t t : tokens) {
        SampledToken st;
        st.token_id = t;
        st.logprob = -0.5f;
        st.top_logprobs = {{t, -0.5f}, {ByteTokenizer::Byte('z'), -1.5f}};
        st.top_logprobs.resize(s.request.sampling.logprobs.value_or(0));
        out.new_tokens.push_back(st);
      }
      // Prompt logprobs (when asked) come with the first output: token i scores -0.25 * i.
      if (s.num_output_tokens == 0 && s.request.sampling.prompt_logprobs.has_value()) {
        const std::vector<int32_t>& prompt = s.request.prompt_token_ids;
        for (size_t i = 1; i < prompt.size(); ++i) {
          PromptLogprob p;
          p.token_id = prompt[i];
          p.logprob = -0.25f * static_cast<float>(i);
          p.rank = 2;
          p.top_logprobs = {{ByteTokenizer::Byte('q'), -0.125f}};
          p.top_logprobs.resize(*s.request.sampling.prompt_logprobs);
          out.prompt_logprobs.push_back(p);
        }
      }
      s.num_output_tokens += static_cast<int32_t>(tokens.size());
      out.num_prompt_tokens = static_cast<int32_t>(s.request.prompt_token_ids.size());
      out.num_cached_tokens = cached_tokens;
      out.num_output_tokens = s.num_output_tokens;
      out.finish_reason = finish;
      out.status = std::move(status);
    }
    callback(out);
  }
  // EmitText emits the bytes of `text` as one token each.
  void EmitText(const std::string& id, std::string_view text,
                FinishReason finish = FinishReason::kNone) {
    Emit(id, ByteTokenizer::Ids(text), finish);
  }

  std::vector<std::string> order() const {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }
  EngineRequest request(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_.at(id).request;
  }
  std::vector<std::string> aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

  absl::Status submit_error;
  int32_t max_len = 64;
  int32_t cached_tokens = 0;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Submitted> requests_;
  std::vector<std::string> order_;
  std::vector<std::string> aborted_;
};

// RecordingSink records a handler's output.
class RecordingSink : public ResponseSink {
 public:
  void SendResponse(int s, const std::string& content_type, std::string b) override {
    ++num_responses;
    status = s;
    type = content_type;
    body = std::move(b);
  }
  void StartEventStream() override { stream_started = true; }
  void SendEvent(std::string event) override { events.push_back(std::move(event)); }
  void EndEventStream() override { stream_ended = true; }
  void AddResponseHeader(const std::string& name, const std::string& value) override {
    headers[name] = value;
  }

  nlohmann::json json() const { return nlohmann::json::parse(body); }
  // EventJson parses event i ("data: {...}\n\n").
  nlohmann::json EventJson(size_t i) const {
    const std::string& e = events.at(i);
    return nlohmann::json::parse(e.substr(6, e.size() - 8));
  }

  int num_responses = 0;
  int status = 0;
  std::string type;
  std::string body;
  bool stream_started = false;
  bool stream_ended = false;
  std::vector<std::string> events;
  std::map<std::string, std::string> headers;
};

// ManualExecutor queues posted tasks until Drain() runs them on the test thread.
class ManualExecutor {
 public:
  Poster poster() {
    return [this](std::function<void()> task) {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    };
  }
  void Drain() {
    while (true) {
      std::function<void()> task;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

 private:
  std::mutex mu_;
  std::deque<std::function<void()>> tasks_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UNIT_API_TEST_FAKES_H_
