// StepTrace: what one engine step ran and how long it took (EngineOptions::on_step), to see
// where a request's time goes (e.g. a short prompt's wait behind long prompts' chunks).
#ifndef SLUICE_ENGINE_SCHED_STEP_TRACE_H_
#define SLUICE_ENGINE_SCHED_STEP_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace sluice {

// StepTraceRow: one scheduled sequence of the step.
struct StepTraceRow {
  std::string request_id;
  int32_t num_prompt_tokens = 0;
  int32_t num_new_tokens = 0;       // q: tokens computed this step (a decode: 1 plus drafts)
  int32_t num_computed_before = 0;  // c: tokens whose KV existed before the step
  bool prefill = false;             // q covers prompt tokens
  bool samples = false;             // the step samples a token for it (a prefill: its first)
  double waited_seconds = 0;        // from its arrival at the engine to this step's start
};

struct StepTrace {
  int64_t step = 0;                // EngineCounters::num_steps
  double seconds = 0;              // the forward pass, measured
  double predicted_seconds = 0;    // cost(q, c) as fitted before the step (0: not fitted)
  double budget_seconds = 0;       // the step time budget (0: none)
  std::vector<StepTraceRow> rows;  // in the step's order
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_STEP_TRACE_H_
