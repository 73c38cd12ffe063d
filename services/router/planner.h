// Planner: the replicas each worker pool (prefill, decode) needs to meet a TTFT and an ITL SLO
// at the observed load, with a step cost model per pool fitted from the workers' own timed steps.
// The router exports the numbers (sluice_planner_desired_replicas{pool}) for an autoscaler (KEDA,
// deploy/k8s) and explains each one on GET /v1/planner.
//
// Inputs, over a sliding window: arrival rate λ (finished requests per second), mean prompt
// tokens P, mean prompt tokens served from a prefix cache C (prefix hit rate C / P), mean output
// tokens O. Step cost of a pool: t(n) = fixed + per_token · n for a step of n tokens, fitted by
// least squares over the increments of the workers' cumulative (steps, tokens, seconds).
//
// Prefill pool: a request costs S = fixed + per_token · (P − C) seconds of prefill (one step; a
// lower bound on batching's benefit, so the estimate errs high). Requests arrive as a Poisson
// stream and each replica serves them in turn (M/D/1): waiting W = ρ·S / (2·(1 − ρ)) at
// utilization ρ. TTFT ≈ W + S ≤ slo_ttft gives ρ_max = 2·(slo_ttft − S) / (2·(slo_ttft − S) + S),
// and replicas = ⌈λ·S / ρ_max⌉. With S ≥ slo_ttft no replica count meets the SLO: the pool gets
// ⌈λ·S⌉ (keeps up with the load) and the plan says so.
//
// Decode pool: a decode step with B running requests costs t(B) ≤ slo_itl, so B ≤ B_slo =
// ⌊(slo_itl − fixed) / per_token⌋; a replica holds at most B_kv = ⌊kv_blocks / ⌈(P + O) /
// block_size⌉⌋ sequences. With B = min(B_slo, B_kv) a replica emits B / t(B) tokens per second
// against a demand of λ·O: replicas = ⌈λ·O·t(B) / B⌉.
//
// Every pool gets at least min_replicas. A pool whose cost model has no steps yet keeps its
// current replica count (the plan says "no cost model yet").
#ifndef SLUICE_SERVICES_ROUTER_PLANNER_H_
#define SLUICE_SERVICES_ROUTER_PLANNER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/sched/step_totals.h"
#include "nlohmann/json.hpp"

namespace sluice {

struct PlannerSlo {
  double ttft_seconds = 2.0;
  double itl_seconds = 0.1;
};

// StepCost: a pool's fitted step time, fixed + per_token · tokens (seconds).
struct StepCost {
  double fixed_seconds = 0.0;
  double per_token_seconds = 0.0;
  int64_t num_steps = 0;  // steps the fit saw; 0: unknown
};

// StepCostFit: least squares of seconds = fixed · steps + per_token · tokens over increments of
// cumulative step totals (each increment covers one or more steps). Not thread-safe.
class StepCostFit {
 public:
  void Add(const StepTotals& increment);
  StepCost Fit() const;

 private:
  double ss_ = 0, st_ = 0, tt_ = 0, sy_ = 0, ty_ = 0;  // Σ steps², steps·tokens, tokens², ·seconds
  int64_t num_steps_ = 0;
  double tokens_ = 0, seconds_ = 0;
};

// Workload: the load the plan is for.
struct Workload {
  double arrival_rate = 0.0;  // requests per second
  double mean_prompt_tokens = 0.0;
  double mean_cached_tokens = 0.0;
  double mean_output_tokens = 0.0;
  int64_t num_requests = 0;  // in the window
  double window_seconds = 0.0;
};

// PoolPlan: one pool's answer and the numbers behind it (as JSON for /v1/planner).
struct PoolPlan {
  std::string pool;
  int64_t current_replicas = 0;
  int64_t desired_replicas = 0;
  nlohmann::json explanation;
};

// PlanPrefill / PlanDecode: the formulas above. `kv_blocks_per_replica` and `block_size` bound
// the decode batch (0: no bound).
PoolPlan PlanPrefill(const Workload& load, const StepCost& cost, const PlannerSlo& slo,
                     int64_t current_replicas, int64_t min_replicas);
PoolPlan PlanDecode(const Workload& load, const StepCost& cost, const PlannerSlo& slo,
                    int64_t kv_blocks_per_replica, int64_t block_size, int64_t current_replicas,
                    int64_t min_replicas);

// WorkloadWindow: finished requests over the last `window` (thread-safe).
class WorkloadWindow {
 public:
  explicit WorkloadWindow(absl::Duration window) : window_(window) {}
  void Add(absl::Time finished, int64_t prompt_tokens, int64_t cached_tokens,
           int64_t output_tokens);
  // Snapshot: the window ending at `now`. The rate divides by the window, or by the time since
  // the first request ever seen when that is shorter (a fresh router).
  Workload Snapshot(absl::Time now) const;

 private:
  struct Event {
    absl::Time finished;
    int64_t prompt, cached, output;
  };
  const absl::Duration window_;
  mutable std::mutex mu_;
  mutable std::deque<Event> events_;  // guarded by mu_
  absl::Time first_ = absl::InfinitePast();
};

// PlannerWorker: what the planner reads of one registered worker.
struct PlannerWorker {
  std::string worker_id;
  bool prefill = false;  // else decode
  bool draining = false;
  int64_t num_total_blocks = 0;
  int64_t block_size = 0;
  StepTotals prefill_steps;  // cumulative
  StepTotals decode_steps;
};

struct PlannerOptions {
  PlannerSlo slo;
  absl::Duration window = absl::Seconds(60);
  int64_t min_replicas = 1;
};

// Planner: the window, each pool's cost fit (from worker step-total increments) and the plan.
// Thread-safe.
class Planner {
 public:
  explicit Planner(PlannerOptions options);
  void ObserveRequest(absl::Time finished, int64_t prompt_tokens, int64_t cached_tokens,
                      int64_t output_tokens);
  // Plan refreshes the cost fits from `workers` (increments since the previous call per worker;
  // a restarted worker's totals start over) and returns {"prefill": ..., "decode": ...}.
  std::vector<PoolPlan> Plan(const std::vector<PlannerWorker>& workers, absl::Time now);
  // Json: the /v1/planner page for plans from Plan().
  nlohmann::json Json(const std::vector<PoolPlan>& plans, absl::Time now) const;
  // RenderMetrics: sluice_planner_desired_replicas{pool} and sluice_planner_current_replicas
  // {pool} gauges.
  static std::string RenderMetrics(const std::vector<PoolPlan>& plans);
  const PlannerOptions& options() const { return options_; }

 private:
  const PlannerOptions options_;
  WorkloadWindow window_;
  std::mutex mu_;
  StepCostFit prefill_fit_;  // guarded by mu_
  StepCostFit decode_fit_;   // guarded by mu_
  std::map<std::string, std::pair<StepTotals, StepTotals>> last_;  // guarded by mu_
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_PLANNER_H_
