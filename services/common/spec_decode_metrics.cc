#include "services/common/spec_decode_metrics.h"

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

void Metric(std::string& out, const char* name, const char* type, const char* help,
            double value) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ",
                  value, "\n");
}

}  // namespace

SpecDecodeStats SpecDecodeFromCounters(const EngineCounters& c) {
  return SpecDecodeStats{c.num_spec_draft_tokens, c.num_spec_accepted_tokens,
                         c.num_spec_verifications, c.spec_draft_seconds, c.spec_verify_seconds,
                         c.num_spec_pipelined_steps};
}

void AppendSpecDecodeMetrics(const SpecDecodeStats& s, std::string& out) {
  Metric(out, "sluice_spec_decode_num_draft_tokens_total", "counter",
         "Draft tokens verified by the target model.", static_cast<double>(s.num_draft_tokens));
  Metric(out, "sluice_spec_decode_num_accepted_tokens_total", "counter",
         "Draft tokens the target accepted.", static_cast<double>(s.num_accepted_tokens));
  Metric(out, "sluice_spec_decode_num_drafts_total", "counter",
         "Verifications: sequence-steps that verified at least one draft token.",
         static_cast<double>(s.num_verifications));
  Metric(out, "sluice_spec_decode_draft_seconds_total", "counter",
         "Time spent drafting (draft model forwards or n-gram lookup).", s.draft_seconds);
  Metric(out, "sluice_spec_decode_verify_seconds_total", "counter",
         "Target forward time of steps that verified drafts.", s.verify_seconds);
  Metric(out, "sluice_spec_decode_pipelined_steps_total", "counter",
         "Steps auto verification ran plain and pipelined (async scheduling, no drafts) because "
         "they measured faster than speculating.",
         static_cast<double>(s.num_pipelined_steps));
  Metric(out, "sluice_spec_decode_acceptance_rate", "gauge",
         "Accepted / verified draft tokens since start (0 before any).",
         s.num_draft_tokens > 0
             ? static_cast<double>(s.num_accepted_tokens) / static_cast<double>(s.num_draft_tokens)
             : 0.0);
  Metric(out, "sluice_spec_decode_mean_accepted_length", "gauge",
         "Tokens emitted per verification, the target's own token included (0 before any).",
         s.num_verifications > 0 ? static_cast<double>(s.num_accepted_tokens +
                                                        s.num_verifications) /
                                       static_cast<double>(s.num_verifications)
                                 : 0.0);
}

}  // namespace sluice
