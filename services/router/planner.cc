#include "services/router/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

int64_t CeilAtLeast(double x, int64_t floor) {
  if (!std::isfinite(x)) return floor;
  return std::max<int64_t>(floor, static_cast<int64_t>(std::ceil(x - 1e-9)));
}

nlohmann::json CostJson(const StepCost& cost) {
  return {{"fixed_seconds", cost.fixed_seconds},
          {"per_token_seconds", cost.per_token_seconds},
          {"steps_observed", cost.num_steps}};
}

nlohmann::json WorkloadJson(const Workload& load) {
  return {{"arrival_rate_rps", load.arrival_rate},
          {"mean_prompt_tokens", load.mean_prompt_tokens},
          {"mean_cached_tokens", load.mean_cached_tokens},
          {"prefix_hit_rate", load.mean_prompt_tokens > 0
                                  ? load.mean_cached_tokens / load.mean_prompt_tokens
                                  : 0.0},
          {"mean_output_tokens", load.mean_output_tokens},
          {"requests_in_window", load.num_requests},
          {"window_seconds", load.window_seconds}};
}

}  // namespace

void StepCostFit::Add(const StepTotals& d) {
  if (d.num_steps <= 0 || d.seconds < 0 || d.num_tokens < 0) return;
  const double s = static_cast<double>(d.num_steps);
  const double t = static_cast<double>(d.num_tokens);
  ss_ += s * s;
  st_ += s * t;
  tt_ += t * t;
  sy_ += s * d.seconds;
  ty_ += t * d.seconds;
  num_steps_ += d.num_steps;
  tokens_ += t;
  seconds_ += d.seconds;
}

StepCost StepCostFit::Fit() const {
  StepCost cost;
  cost.num_steps = num_steps_;
  if (num_steps_ == 0) return cost;
  const double det = ss_ * tt_ - st_ * st_;
  // Normal equations of the two-parameter fit; when increments do not vary in tokens per step
  // (det ~ 0) the split is unknown: all of the cost per token (pessimistic for large batches).
  if (det > 1e-9 * ss_ * tt_) {
    cost.fixed_seconds = (sy_ * tt_ - ty_ * st_) / det;
    cost.per_token_seconds = (ty_ * ss_ - sy_ * st_) / det;
  }
  if (!(det > 1e-9 * ss_ * tt_) || cost.fixed_seconds < 0 || cost.per_token_seconds < 0) {
    if (cost.fixed_seconds < 0 && det > 1e-9 * ss_ * tt_) {
      cost.fixed_seconds = 0;
      cost.per_token_seconds = tt_ > 0 ? ty_ / tt_ : 0;  // fit through the origin
    } else if (cost.per_token_seconds < 0 && det > 1e-9 * ss_ * tt_) {
      cost.per_token_seconds = 0;
      cost.fixed_seconds = ss_ > 0 ? sy_ / ss_ : 0;
    } else {
      cost.fixed_seconds = 0;
      cost.per_token_seconds = tokens_ > 0 ? seconds_ / tokens_ : 0;
    }
  }
  return cost;
}

// Starts a pool's plan with what every explanation shows. Returns false, with the plan final,
// while the pool has reported no steps: without a cost model the current count stays.
bool StartPlan(const std::string& pool, const Workload& load, const StepCost& cost,
               int64_t current_replicas, int64_t min_replicas, PoolPlan& plan) {
  plan.pool = pool;
  plan.current_replicas = current_replicas;
  plan.explanation["workload"] = WorkloadJson(load);
  plan.explanation["cost_model"] = CostJson(cost);
  if (cost.num_steps > 0) return true;
  plan.desired_replicas = std::max(current_replicas, min_replicas);
  plan.explanation["note"] = absl::StrCat("no cost model yet (no ", pool,
                                          " steps reported): keeping the current count");
  return false;
}

PoolPlan PlanPrefill(const Workload& load, const StepCost& cost, const PlannerSlo& slo,
                     int64_t current_replicas, int64_t min_replicas) {
  PoolPlan plan;
  nlohmann::json& e = plan.explanation;
  e["slo_ttft_seconds"] = slo.ttft_seconds;
  if (!StartPlan("prefill", load, cost, current_replicas, min_replicas, plan)) return plan;
  const double new_tokens = std::max(0.0, load.mean_prompt_tokens - load.mean_cached_tokens);
  const double service = cost.fixed_seconds + cost.per_token_seconds * new_tokens;
  const double work = load.arrival_rate * service;  // busy seconds per second
  const double slack = slo.ttft_seconds - service;
  e["new_tokens_per_request"] = new_tokens;
  e["prefill_seconds_per_request"] = service;
  e["busy_replicas"] = work;
  if (slack <= 0) {
    plan.desired_replicas = CeilAtLeast(work, min_replicas);
    e["slo_feasible"] = false;
    e["formula"] = "ceil(arrival_rate * prefill_seconds_per_request)";
    e["note"] = "one request's prefill alone exceeds the TTFT SLO: replicas only keep up";
    return plan;
  }
  const double rho_max = 2 * slack / (2 * slack + service);
  plan.desired_replicas = CeilAtLeast(work / rho_max, min_replicas);
  e["slo_feasible"] = true;
  e["max_utilization"] = rho_max;
  e["formula"] =
      "ceil(arrival_rate * S / rho_max), S = fixed + per_token * (prompt - cached), "
      "rho_max = 2 (slo_ttft - S) / (2 (slo_ttft - S) + S) (M/D/1 wait + S <= slo_ttft)";
  return plan;
}

PoolPlan PlanDecode(const Workload& load, const StepCost& cost, const PlannerSlo& slo,
                    int64_t kv_blocks_per_replica, int64_t block_size, int64_t current_replicas,
                    int64_t min_replicas) {
  PoolPlan plan;
  nlohmann::json& e = plan.explanation;
  e["slo_itl_seconds"] = slo.itl_seconds;
  if (!StartPlan("decode", load, cost, current_replicas, min_replicas, plan)) return plan;
  constexpr double kUnbounded = 1e9;
  bool feasible = true;
  double batch_slo = kUnbounded;
  if (cost.fixed_seconds >= slo.itl_seconds) {
    feasible = false;
    batch_slo = 1;
  } else if (cost.per_token_seconds > 0) {
    batch_slo = std::max(1.0, std::floor((slo.itl_seconds - cost.fixed_seconds) /
                                         cost.per_token_seconds));
  }
  double batch_kv = kUnbounded;
  if (kv_blocks_per_replica > 0 && block_size > 0) {
    const double blocks_per_seq = std::max(
        1.0, std::ceil((load.mean_prompt_tokens + load.mean_output_tokens) / block_size));
    batch_kv = std::max(1.0, std::floor(kv_blocks_per_replica / blocks_per_seq));
  }
  const double batch = std::min(batch_slo, batch_kv);
  const double step = cost.fixed_seconds + cost.per_token_seconds * batch;
  const double demand = load.arrival_rate * load.mean_output_tokens;  // tokens per second
  const double per_replica = step > 0 ? batch / step : kUnbounded;
  plan.desired_replicas = CeilAtLeast(demand / per_replica, min_replicas);
  e["slo_feasible"] = feasible;
  e["max_batch_by_slo"] = batch_slo;
  e["max_batch_by_kv"] = batch_kv;
  e["batch_per_replica"] = batch;
  e["step_seconds_at_batch"] = step;
  e["tokens_per_second_per_replica"] = per_replica;
  e["demand_tokens_per_second"] = demand;
  e["formula"] =
      "ceil(arrival_rate * output * t(B) / B), B = min(floor((slo_itl - fixed) / per_token), "
      "floor(kv_blocks / ceil((prompt + output) / block_size))), t(B) = fixed + per_token * B";
  if (!feasible) e["note"] = "a one-request decode step exceeds the ITL SLO";
  return plan;
}

void WorkloadWindow::Add(absl::Time finished, int64_t prompt_tokens, int64_t cached_tokens,
                         int64_t output_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_ == absl::InfinitePast()) first_ = finished;
  events_.push_back({finished, prompt_tokens, cached_tokens, output_tokens});
  // Bounded without scrapes too: what left the window is dropped here as well.
  while (events_.front().finished <= finished - window_) events_.pop_front();
}

Workload WorkloadWindow::Snapshot(absl::Time now) const {
  std::lock_guard<std::mutex> lock(mu_);
  while (!events_.empty() && events_.front().finished <= now - window_) events_.pop_front();
  Workload load;
  if (first_ == absl::InfinitePast()) return load;
  const absl::Duration span = std::min(window_, now - first_);
  load.window_seconds = absl::ToDoubleSeconds(span);
  double prompt = 0, cached = 0, output = 0;
  for (const Event& e : events_) {
    if (e.finished > now) continue;
    ++load.num_requests;
    prompt += static_cast<double>(e.prompt);
    cached += static_cast<double>(e.cached);
    output += static_cast<double>(e.output);
  }
  if (load.num_requests > 0) {
    const double n = static_cast<double>(load.num_requests);
    load.mean_prompt_tokens = prompt / n;
    load.mean_cached_tokens = cached / n;
    load.mean_output_tokens = output / n;
    load.arrival_rate = load.window_seconds > 0 ? n / load.window_seconds : 0.0;
  }
  return load;
}

Planner::Planner(PlannerOptions options)
    : options_(std::move(options)), window_(options_.window) {}

void Planner::ObserveRequest(absl::Time finished, int64_t prompt_tokens, int64_t cached_tokens,
                             int64_t output_tokens) {
  window_.Add(finished, prompt_tokens, cached_tokens, output_tokens);
}

std::vector<PoolPlan> Planner::Plan(const std::vector<PlannerWorker>& workers, absl::Time now) {
  const Workload load = window_.Snapshot(now);
  int64_t num_prefill = 0, num_decode = 0, decode_blocks = 0, block_size = 0;
  StepCost prefill_cost, decode_cost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const PlannerWorker& w : workers) {
      auto [it, fresh] = last_.try_emplace(w.worker_id);
      auto delta = [](const StepTotals& now_totals, StepTotals& seen) {
        StepTotals d;
        if (now_totals.num_steps >= seen.num_steps) {
          d.num_steps = now_totals.num_steps - seen.num_steps;
          d.num_tokens = now_totals.num_tokens - seen.num_tokens;
          d.seconds = now_totals.seconds - seen.seconds;
        } else {
          d = now_totals;  // the worker restarted: its totals start over
        }
        seen = now_totals;
        return d;
      };
      // Both kinds of steps count for the worker's pool: a decode worker that prefills a short
      // prompt locally runs prefill steps too, but its pool is sized by decode steps.
      const StepTotals p = delta(w.prefill_steps, it->second.first);
      const StepTotals d = delta(w.decode_steps, it->second.second);
      if (w.prefill) {
        prefill_fit_.Add(p);
      } else {
        decode_fit_.Add(d);
      }
      if (w.draining) continue;
      if (w.prefill) {
        ++num_prefill;
      } else {
        ++num_decode;
        decode_blocks = decode_blocks == 0 ? w.num_total_blocks
                                           : std::min(decode_blocks, w.num_total_blocks);
        if (block_size == 0) block_size = w.block_size;
      }
    }
    prefill_cost = prefill_fit_.Fit();
    decode_cost = decode_fit_.Fit();
  }
  return {PlanPrefill(load, prefill_cost, options_.slo, num_prefill, options_.min_replicas),
          PlanDecode(load, decode_cost, options_.slo, decode_blocks, block_size, num_decode,
                     options_.min_replicas)};
}

nlohmann::json Planner::Json(const std::vector<PoolPlan>& plans, absl::Time now) const {
  nlohmann::json pools = nlohmann::json::array();
  for (const PoolPlan& p : plans) {
    pools.push_back({{"pool", p.pool},
                     {"current_replicas", p.current_replicas},
                     {"desired_replicas", p.desired_replicas},
                     {"explanation", p.explanation}});
  }
  return {{"object", "planner"},
          {"created", absl::ToUnixSeconds(now)},
          {"slo", {{"ttft_seconds", options_.slo.ttft_seconds},
                   {"itl_seconds", options_.slo.itl_seconds}}},
          {"window_seconds", absl::ToDoubleSeconds(options_.window)},
          {"min_replicas", options_.min_replicas},
          {"pools", pools}};
}

std::string Planner::RenderMetrics(const std::vector<PoolPlan>& plans) {
  std::string out;
  absl::StrAppend(&out,
                  "# HELP sluice_planner_desired_replicas Replicas the planner estimates each pool "
                  "needs to meet the TTFT / ITL SLO at the observed load (GET /v1/planner "
                  "explains).\n# TYPE sluice_planner_desired_replicas gauge\n");
  for (const PoolPlan& p : plans) {
    absl::StrAppend(&out, "sluice_planner_desired_replicas{pool=\"", p.pool, "\"} ",
                    p.desired_replicas, "\n");
  }
  absl::StrAppend(&out,
                  "# HELP sluice_planner_current_replicas Live (registered, not draining) "
                  "workers of each pool.\n# TYPE sluice_planner_current_replicas gauge\n");
  for (const PoolPlan& p : plans) {
    absl::StrAppend(&out, "sluice_planner_current_replicas{pool=\"", p.pool, "\"} ",
                    p.current_replicas, "\n");
  }
  return out;
}

}  // namespace sluice
