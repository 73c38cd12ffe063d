// StepTotals: cumulative forward steps of one kind, their scheduled tokens and seconds. Engines
// count them (EngineCounters), workers report them in heartbeats, and the router's planner fits
// each pool's step cost, fixed + per_token · tokens, from their increments.
#ifndef SLUICE_ENGINE_SCHED_STEP_TOTALS_H_
#define SLUICE_ENGINE_SCHED_STEP_TOTALS_H_

#include <cstdint>

namespace sluice {

struct StepTotals {
  int64_t num_steps = 0;
  int64_t num_tokens = 0;
  double seconds = 0.0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_STEP_TOTALS_H_
