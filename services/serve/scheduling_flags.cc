#include "services/serve/scheduling_flags.h"

#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "services/serve/log.h"

namespace sluice {

void AddSchedulingFlags(CLI::App& app, EngineOptions& engine) {
  engine.scheduling_policy = kDefaultSchedulingPolicy;
  engine.step_time_budget_seconds = kDefaultStepTimeBudgetMs / 1000.0;
  engine.prefill_aging = kDefaultPrefillAging;
  std::map<std::string, SchedulingPolicy> policies;
  for (SchedulingPolicy p : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority,
                             SchedulingPolicy::kShortestPrefillFirst}) {
    policies.emplace(SchedulingPolicyName(p), p);
  }
  app.add_option("--scheduling-policy", engine.scheduling_policy,
                 "Order of prefills: shortest_prefill_first (fewest tokens left first, with "
                 "aging; decodes always go first), priority (the request's `priority`, then "
                 "arrival, as vLLM), fcfs (arrival order, running requests first)")
      ->transform(CLI::CheckedTransformer(policies).description(""))
      ->type_name("POLICY")
      ->default_str(SchedulingPolicyName(kDefaultSchedulingPolicy));
  app.add_option("--prefill-aging", engine.prefill_aging,
                 "shortest_prefill_first: a prompt whose prefill takes T seconds longer than "
                 "another's (priced by the fitted step cost model) overtakes it after waiting "
                 "T/A seconds (credit: A x seconds waited); 0: pure shortest-first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option_function<double>(
         "--step-time-budget-ms",
         [&engine](double ms) { engine.step_time_budget_seconds = ms / 1000.0; },
         "Cut prefill chunks so one engine step takes about this long, priced by the cost "
         "model fitted from measured steps (0: only --max-num-batched-tokens bounds a step)")
      ->check(CLI::NonNegativeNumber)
      ->default_str(absl::StrFormat("%g", kDefaultStepTimeBudgetMs));
  app.add_flag_callback(
      "--log-steps", [&engine] { engine.on_step = LogStep; },
      "Log every timed engine step (info: 'step {json}'): its measured and predicted time "
      "and each row (request id, prompt tokens, new tokens, tokens computed before, samples, "
      "ms waited since arrival); for benchmarks");
}

void LogStep(const StepTrace& trace) {
  nlohmann::json rows = nlohmann::json::array();
  for (const StepTraceRow& r : trace.rows) {
    rows.push_back({r.request_id, r.num_prompt_tokens, r.num_new_tokens, r.num_computed_before,
                    r.samples, std::round(r.waited_seconds * 1e4) / 10});
  }
  const nlohmann::json line = {{"step", trace.step},
                               {"ms", std::round(trace.seconds * 1e4) / 10},
                               {"pred_ms", std::round(trace.predicted_seconds * 1e4) / 10},
                               {"budget_ms", trace.budget_seconds * 1e3},
                               {"rows", std::move(rows)}};
  spdlog::info("step {}", line.dump());
}

}  // namespace sluice
