// Command-line flags of fair prefill (engine/sched/scheduler.h) for every command that runs an
// engine: `serve`, `generate`, `prefill`, `decode`.
#ifndef SLUICE_SERVICES_SERVE_SCHEDULING_FLAGS_H_
#define SLUICE_SERVICES_SERVE_SCHEDULING_FLAGS_H_

#include <CLI/CLI.hpp>

#include "engine/sched/llm_engine.h"

namespace sluice {

// The defaults the flags give (EngineOptions' own defaults keep the library at fcfs with no
// time budget): shortest-prefill-first with aging, and a per-step time budget.
inline constexpr SchedulingPolicy kDefaultSchedulingPolicy = SchedulingPolicy::kShortestPrefillFirst;
inline constexpr double kDefaultStepTimeBudgetMs = 250.0;
// A prompt whose prefill takes T seconds longer than a fresh one's overtakes it after waiting
// 50 T: long prompts are not starved, yet a saturated prefill worker (long prompts always
// queued) still serves short ones first (0.1 let them block shorts: bench/README.md).
inline constexpr double kDefaultPrefillAging = 0.02;

// AddSchedulingFlags sets the defaults above into `engine` and registers --scheduling-policy,
// --prefill-aging, --step-time-budget-ms and --log-steps.
void AddSchedulingFlags(CLI::App& app, EngineOptions& engine);
// LogStep: --log-steps' engine.on_step, one info line 'step {json}' per timed engine step (StepTrace).
void LogStep(const StepTrace& trace);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_SCHEDULING_FLAGS_H_
