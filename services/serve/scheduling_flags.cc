#include "services/serve/scheduling_flags.h"

#include <map>
#include <string>

#include "absl/strings/str_format.h"

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
                 "shortest_prefill_first: a prompt D tokens longer than another overtakes it "
                 "after waiting 1/A times as long as computing D tokens takes (credit: A x "
                 "seconds waited x the fitted prefill tokens/s); 0: pure shortest-first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option_function<double>(
         "--step-time-budget-ms",
         [&engine](double ms) { engine.step_time_budget_seconds = ms / 1000.0; },
         "Cut prefill chunks so one engine step takes about this long, priced by the cost "
         "model fitted from measured steps (0: only --max-num-batched-tokens bounds a step)")
      ->check(CLI::NonNegativeNumber)
      ->default_str(absl::StrFormat("%g", kDefaultStepTimeBudgetMs));
}

}  // namespace sluice
