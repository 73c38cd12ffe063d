#include "services/api/choice_output.h"

#include <utility>

namespace sluice {

ChoiceOutput::ChoiceOutput(const Tokenizer& tokenizer, const SamplingParams& params,
                           bool want_logprobs, int64_t text_offset_base)
    : detokenizer_(tokenizer, params.skip_special_tokens),
      stop_matcher_(params.stop, params.include_stop_str_in_output),
      min_tokens_(params.min_tokens),
      want_logprobs_(want_logprobs),
      include_stop_token_text_(params.include_stop_str_in_output),
      text_offset_base_(text_offset_base) {}

void ChoiceOutput::Finish(ChoiceDelta& delta, const char* reason, bool flush) {
  if (flush && num_output_tokens_ <= min_tokens_) {
    delta.text += detokenizer_.Flush();  // still within min_tokens: no stop string applies
  } else if (flush) {
    // Held-back bytes of the detokenizer go through the matcher too: they may complete a stop.
    StopStringMatcher::Result r = stop_matcher_.Push(detokenizer_.Flush());
    delta.text += r.text;
    if (r.stopped) {
      reason = "stop";
      delta.stopped_by_string = true;
    } else {
      delta.text += stop_matcher_.Flush();
    }
  }
  text_ += delta.text;
  finished_ = true;
  finish_reason_ = reason;
  delta.finished = true;
  delta.finish_reason = reason;
}

ChoiceDelta ChoiceOutput::Push(const RequestOutput& output) {
  ChoiceDelta delta;
  if (finished_) return delta;
  num_prompt_tokens_ = output.num_prompt_tokens;
  num_cached_tokens_ = output.num_cached_tokens;
  if (!output.prompt_logprobs.empty()) prompt_logprobs_ = output.prompt_logprobs;
  const bool stop_token_end = output.finish_reason == FinishReason::kStop;
  for (size_t i = 0; i < output.new_tokens.size(); ++i) {
    const SampledToken& token = output.new_tokens[i];
    ++num_output_tokens_;
    cumulative_logprob_ += token.logprob;
    if (want_logprobs_) {
      TokenLogprobInfo info;
      info.token_id = token.token_id;
      info.logprob = token.logprob;
      info.top_logprobs = token.top_logprobs;
      info.text_offset = text_offset_base_ + raw_text_bytes_;
      delta.tokens.push_back(info);
      logprobs_.push_back(std::move(info));
    }
    // vLLM (v1 detokenizer): the EOS / stop_token_ids token that ended the request is not part
    // of the text unless include_stop_str_in_output.
    const bool is_final_stop_token = stop_token_end && i + 1 == output.new_tokens.size();
    if (is_final_stop_token && !include_stop_token_text_) continue;
    std::string piece = detokenizer_.Push(token.token_id);
    raw_text_bytes_ += static_cast<int64_t>(piece.size());
    if (num_output_tokens_ <= min_tokens_) {  // stop strings apply after min_tokens tokens
      delta.text += piece;
      continue;
    }
    StopStringMatcher::Result r = stop_matcher_.Push(piece);
    delta.text += r.text;
    if (r.stopped) {
      delta.stopped_by_string = true;
      Finish(delta, "stop", /*flush=*/false);
      return delta;
    }
  }
  switch (output.finish_reason) {
    case FinishReason::kNone:
      text_ += delta.text;
      break;
    case FinishReason::kStop:
      Finish(delta, "stop", /*flush=*/true);
      break;
    case FinishReason::kLength:
      Finish(delta, "length", /*flush=*/true);
      break;
    case FinishReason::kAbort:
    case FinishReason::kError:
      text_ += delta.text;
      finished_ = true;
      delta.finished = true;
      delta.failed = true;
      delta.error = output.status.ok()
                        ? (output.finish_reason == FinishReason::kAbort
                               ? absl::UnavailableError("the request was aborted by the server")
                               : absl::InternalError("the engine failed the request"))
                        : output.status;
      finish_reason_ = FinishReasonName(output.finish_reason);
      break;
  }
  return delta;
}

}  // namespace sluice
