// ChoiceOutput: turns one engine request's token stream into the text of one OpenAI choice.
//
// Each token goes through the IncrementalDetokenizer (never half a UTF-8 character), then the
// StopStringMatcher (text that may start a stop string is held back). When a stop string
// matches, the choice finishes with "stop" and the caller must abort the engine request; tokens
// arriving after that are ignored. The text of the first min_tokens tokens is not searched for
// stop strings (vLLM, PR 22014: stop strings apply once min_tokens tokens are out).
// Not thread-safe: one owner (the request's strand).
#ifndef SLUICE_SERVICES_API_CHOICE_OUTPUT_H_
#define SLUICE_SERVICES_API_CHOICE_OUTPUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sample/sampler.h"
#include "engine/sample/stop_string_matcher.h"
#include "engine/sched/request.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace sluice {

// TokenLogprobInfo is one generated token with its logprobs, ready for either response shape.
struct TokenLogprobInfo {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  int64_t text_offset = 0;  // byte offset of the token's text in the choice's text (pre-stop)
  bool has_logprob = true;  // false: the first prompt token (no logprob: JSON null)
};

// ChoiceDelta is what one engine output adds to a choice.
struct ChoiceDelta {
  std::string text;                       // new text, valid UTF-8
  std::vector<TokenLogprobInfo> tokens;   // tokens consumed by this output (logprobs wanted)
  bool finished = false;                  // the choice ended with this delta
  std::string finish_reason;              // "stop" | "length" when finished normally
  bool stopped_by_string = false;         // finished by a stop string: abort the engine request
  bool failed = false;                    // engine reported abort/error
  absl::Status error;                     // with failed
};

class ChoiceOutput {
 public:
  // `tokenizer` must outlive this object. `text_offset_base` is added to text offsets (the
  // echoed prompt's length in bytes, else 0).
  ChoiceOutput(const Tokenizer& tokenizer, const SamplingParams& params, bool want_logprobs,
               int64_t text_offset_base = 0);

  // Push consumes one engine output. After a finished delta, further calls return an empty,
  // finished-free delta.
  ChoiceDelta Push(const RequestOutput& output);

  bool finished() const { return finished_; }
  const std::string& text() const { return text_; }
  const std::string& finish_reason() const { return finish_reason_; }
  int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int32_t num_cached_tokens() const { return num_cached_tokens_; }
  // Tokens consumed (up to and including the one that completed a stop string).
  int32_t num_output_tokens() const { return num_output_tokens_; }
  const std::vector<TokenLogprobInfo>& logprobs() const { return logprobs_; }
  // The sum of the consumed tokens' logprobs (best_of ranking; the engine reports each
  // sampled token's logprob when SamplingParams::logprobs is set).
  double cumulative_logprob() const { return cumulative_logprob_; }
  // The prompt logprobs the engine sent with the first token (prompt tokens 1..), if asked.
  const std::vector<PromptLogprob>& prompt_logprobs() const { return prompt_logprobs_; }

 private:
  // Finish records the end of the choice and flushes held-back text into `delta`.
  void Finish(ChoiceDelta& delta, const char* reason, bool flush);

  IncrementalDetokenizer detokenizer_;
  StopStringMatcher stop_matcher_;
  std::vector<int32_t> stop_token_ids_;
  int32_t min_tokens_;
  bool want_logprobs_;
  bool include_stop_token_text_;
  int64_t text_offset_base_;
  int64_t raw_text_bytes_ = 0;  // detokenized bytes before stop-string processing
  std::string text_;
  std::vector<TokenLogprobInfo> logprobs_;
  std::vector<PromptLogprob> prompt_logprobs_;
  std::string finish_reason_;
  bool finished_ = false;
  int32_t num_prompt_tokens_ = 0;
  int32_t num_cached_tokens_ = 0;
  int32_t num_output_tokens_ = 0;
  double cumulative_logprob_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_CHOICE_OUTPUT_H_
