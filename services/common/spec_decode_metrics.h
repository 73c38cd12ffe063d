// Prometheus lines for speculative decoding, shared by `sluice serve` and the workers' /metrics.
#ifndef SLUICE_SERVICES_COMMON_SPEC_DECODE_METRICS_H_
#define SLUICE_SERVICES_COMMON_SPEC_DECODE_METRICS_H_

#include <cstdint>
#include <string>

#include "engine/sched/llm_engine.h"

namespace sluice {

struct SpecDecodeStats {
  int64_t num_draft_tokens = 0;     // drafts verified by the target
  int64_t num_accepted_tokens = 0;  // of those, accepted
  int64_t num_verifications = 0;    // sequence-steps that verified at least one draft
  double draft_seconds = 0.0;
  double verify_seconds = 0.0;
  int64_t num_pipelined_steps = 0;  // EngineCounters::num_spec_pipelined_steps
};

SpecDecodeStats SpecDecodeFromCounters(const EngineCounters& c);

// AppendSpecDecodeMetrics appends (vLLM's spec_decode names, sluice_ prefix):
//   sluice_spec_decode_num_draft_tokens_total, ..._num_accepted_tokens_total,
//   ..._num_drafts_total (verifications), ..._draft_seconds_total, ..._verify_seconds_total,
//   ..._pipelined_steps_total (steps auto verification ran plain and pipelined instead),
//   and the gauges ..._acceptance_rate (accepted / drafts) and ..._mean_accepted_length
//   (tokens per verification, the target's own token included; 0 before any).
void AppendSpecDecodeMetrics(const SpecDecodeStats& stats, std::string& out);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_SPEC_DECODE_METRICS_H_
