#include "services/router/wire_convert.h"

#include "services/common/misconfigured_peer.h"

namespace sluice {

void ToWire(const SamplingParams& params, v1::SamplingParams* out) {
  out->set_temperature(params.temperature);
  out->set_top_p(params.top_p);
  out->set_top_k(params.top_k);
  out->set_min_p(params.min_p);
  out->set_presence_penalty(params.presence_penalty);
  out->set_frequency_penalty(params.frequency_penalty);
  out->set_repetition_penalty(params.repetition_penalty);
  if (params.seed.has_value()) out->set_seed(*params.seed);
  out->set_choice_index(params.choice_index);
  out->set_max_tokens(params.max_tokens);
  out->set_min_tokens(params.min_tokens);
  out->set_ignore_eos(params.ignore_eos);
  for (int32_t id : params.stop_token_ids) out->add_stop_token_ids(id);
  for (const std::string& stop : params.stop) out->add_stop(stop);
  out->set_include_stop_str_in_output(params.include_stop_str_in_output);
  out->set_skip_special_tokens(params.skip_special_tokens);
  if (params.logprobs.has_value()) out->set_logprobs(*params.logprobs);
  for (int32_t id : params.allowed_token_ids) out->add_allowed_token_ids(id);
  for (const auto& [id, bias] : params.logit_bias) {
    v1::LogitBias* wire = out->add_logit_bias();
    wire->set_token_id(id);
    wire->set_bias(bias);
  }
  for (const std::vector<int32_t>& word : params.bad_words_token_ids) {
    out->add_bad_words()->mutable_token_ids()->Add(word.begin(), word.end());
  }
  if (params.prompt_logprobs.has_value()) out->set_prompt_logprobs(*params.prompt_logprobs);
}

void ToWire(const SampledToken& token, v1::SampledToken* out) {
  out->set_token_id(token.token_id);
  out->set_logprob(token.logprob);
  for (const TokenLogprob& top : token.top_logprobs) {
    v1::TokenLogprob* wire = out->add_top_logprobs();
    wire->set_token_id(top.token_id);
    wire->set_logprob(top.logprob);
  }
}

std::vector<PromptLogprob> PromptLogprobsFromWire(
    const google::protobuf::RepeatedPtrField<v1::PromptLogprob>& in) {
  std::vector<PromptLogprob> out;
  out.reserve(in.size());
  for (const v1::PromptLogprob& p : in) {
    PromptLogprob entry;
    entry.token_id = p.token_id();
    entry.logprob = p.logprob();
    entry.rank = p.rank();
    for (const v1::TokenLogprob& top : p.top_logprobs()) {
      entry.top_logprobs.push_back(TokenLogprob{top.token_id(), top.logprob()});
    }
    out.push_back(std::move(entry));
  }
  return out;
}

SampledToken FromWire(const v1::SampledToken& token) {
  SampledToken out;
  out.token_id = token.token_id();
  out.logprob = token.logprob();
  out.top_logprobs.reserve(token.top_logprobs_size());
  for (const v1::TokenLogprob& top : token.top_logprobs()) {
    out.top_logprobs.push_back(TokenLogprob{top.token_id(), top.logprob()});
  }
  return out;
}

FinishReason FromWire(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case v1::FINISH_REASON_LENGTH:
      return FinishReason::kLength;
    case v1::FINISH_REASON_ABORT:
      return FinishReason::kAbort;
    case v1::FINISH_REASON_ERROR:
      return FinishReason::kError;
    default:
      return FinishReason::kNone;
  }
}

absl::Status StatusFromWire(const v1::Error& error) {
  const int code = error.code();
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(error.message().empty() ? "worker error" : error.message());
  }
  return ErrorCauseFromWire(error,
                            absl::Status(static_cast<absl::StatusCode>(code), error.message()));
}

}  // namespace sluice
