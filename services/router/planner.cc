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
          {"image_request_rate_rps", load.image_request_rate},
          {"mean_images_per_image_request", load.mean_images_per_image_request},
          {"image_requests_in_window", load.num_image_requests},
          {"window_seconds", load.window_seconds}};
}

// SizeForTtft: replicas of a pool that serves each request in one job of `service` seconds, so
// that waiting (M/D/1, Poisson arrivals at `rate`) plus service stays within `budget`; the
// numbers go into `e`.
int64_t SizeForTtft(double rate, double service, double budget, int64_t min_replicas,
                    const std::string& service_name, nlohmann::json& e) {
  const double work = rate * service;  // busy seconds per second
  const double slack = budget - service;
  e["busy_replicas"] = work;
  if (slack <= 0) {
    e["slo_feasible"] = false;
    e["formula"] = absl::StrCat("ceil(rate * ", service_name, ")");
    e["note"] = absl::StrCat("one request's ", service_name,
                             " alone exceeds its TTFT budget: replicas only keep up");
    return CeilAtLeast(work, min_replicas);
  }
  const double rho_max = 2 * slack / (2 * slack + service);
  e["slo_feasible"] = true;
  e["max_utilization"] = rho_max;
  return CeilAtLeast(work / rho_max, min_replicas);
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
                     int64_t current_replicas, int64_t min_replicas, double ttft_share) {
  PoolPlan plan;
  nlohmann::json& e = plan.explanation;
  const double budget = slo.ttft_seconds * ttft_share;
  e["slo_ttft_seconds"] = slo.ttft_seconds;
  e["ttft_budget_seconds"] = budget;
  if (!StartPlan("prefill", load, cost, current_replicas, min_replicas, plan)) return plan;
  const double new_tokens = std::max(0.0, load.mean_prompt_tokens - load.mean_cached_tokens);
  const double service = cost.fixed_seconds + cost.per_token_seconds * new_tokens;
  e["new_tokens_per_request"] = new_tokens;
  e["prefill_seconds_per_request"] = service;
  plan.desired_replicas = SizeForTtft(load.arrival_rate, service, budget, min_replicas,
                                      "prefill_seconds_per_request", e);
  if (e["slo_feasible"].get<bool>()) {
    e["formula"] =
        "ceil(arrival_rate * S / rho_max), S = fixed + per_token * (prompt - cached), "
        "rho_max = 2 (budget - S) / (2 (budget - S) + S) (M/D/1 wait + S <= budget), "
        "budget = slo_ttft (times 1 - encode_share with an encoder pool)";
  }
  return plan;
}

PoolPlan PlanEncoder(const Workload& load, const StepCost& cost, double cache_hit_rate,
                     const PlannerSlo& slo, int64_t current_replicas, int64_t min_replicas) {
  PoolPlan plan;
  nlohmann::json& e = plan.explanation;
  const double budget = slo.ttft_seconds * slo.encode_share;
  e["slo_ttft_seconds"] = slo.ttft_seconds;
  e["encode_share"] = slo.encode_share;
  e["ttft_budget_seconds"] = budget;
  e["cache_hit_rate"] = cache_hit_rate;
  if (!StartPlan("encoder", load, cost, current_replicas, min_replicas, plan)) return plan;
  // The fit's "steps" are Encode calls and its "tokens" images encoded.
  e["cost_model"]["units"] = "fixed_seconds per Encode call, per_token_seconds per image encoded";
  const double images = load.mean_images_per_image_request * (1.0 - cache_hit_rate);
  const double service = cost.fixed_seconds + cost.per_token_seconds * images;
  e["images_encoded_per_request"] = images;
  e["encode_seconds_per_request"] = service;
  plan.desired_replicas = SizeForTtft(load.image_request_rate, service, budget, min_replicas,
                                      "encode_seconds_per_request", e);
  if (e["slo_feasible"].get<bool>()) {
    e["formula"] =
        "ceil(image_request_rate * S / rho_max), S = fixed + per_image * images_per_request * "
        "(1 - cache_hit_rate), rho_max = 2 (budget - S) / (2 (budget - S) + S), "
        "budget = encode_share * slo_ttft";
  }
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
  SeenAt(finished);
  events_.push_back({finished, prompt_tokens, cached_tokens, output_tokens});
  // Bounded without scrapes too: what left the window is dropped here as well.
  while (events_.front().finished <= finished - window_) events_.pop_front();
}

void WorkloadWindow::AddImageRequest(absl::Time arrived, int64_t num_images) {
  std::lock_guard<std::mutex> lock(mu_);
  SeenAt(arrived);
  image_events_.push_back({arrived, num_images});
  while (image_events_.front().arrived <= arrived - window_) image_events_.pop_front();
}

void WorkloadWindow::SeenAt(absl::Time t) {
  if (first_ == absl::InfinitePast() || t < first_) first_ = t;
}

Workload WorkloadWindow::Snapshot(absl::Time now) const {
  std::lock_guard<std::mutex> lock(mu_);
  while (!events_.empty() && events_.front().finished <= now - window_) events_.pop_front();
  while (!image_events_.empty() && image_events_.front().arrived <= now - window_) {
    image_events_.pop_front();
  }
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
  double images = 0;
  for (const ImageEvent& e : image_events_) {
    if (e.arrived > now) continue;
    ++load.num_image_requests;
    images += static_cast<double>(e.num_images);
  }
  if (load.num_image_requests > 0) {
    const double n = static_cast<double>(load.num_image_requests);
    load.mean_images_per_image_request = images / n;
    load.image_request_rate = load.window_seconds > 0 ? n / load.window_seconds : 0.0;
  }
  return load;
}

Planner::Planner(PlannerOptions options)
    : options_(std::move(options)), window_(options_.window) {}

void Planner::ObserveRequest(absl::Time finished, int64_t prompt_tokens, int64_t cached_tokens,
                             int64_t output_tokens) {
  window_.Add(finished, prompt_tokens, cached_tokens, output_tokens);
}

void Planner::ObserveImageRequest(absl::Time arrived, int64_t num_images) {
  window_.AddImageRequest(arrived, num_images);
}

std::vector<PoolPlan> Planner::Plan(const std::vector<PlannerWorker>& workers, absl::Time now) {
  const Workload load = window_.Snapshot(now);
  int64_t num_prefill = 0, num_decode = 0, num_encoder = 0, decode_blocks = 0, block_size = 0;
  bool any_encoder = false;
  StepCost prefill_cost, decode_cost, encode_cost;
  double cache_hit_rate = 0.0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, Seen> seen_now;
    for (const PlannerWorker& w : workers) {
      Seen seen;
      if (auto it = last_.find(w.worker_id); it != last_.end()) seen = it->second;
      // A restarted worker's totals start over: its increment is then all it reports.
      const bool restarted = w.prefill_steps.num_steps < seen.prefill.num_steps ||
                             w.decode_steps.num_steps < seen.decode.num_steps ||
                             w.encode_steps.num_steps < seen.encode.num_steps ||
                             w.num_images_answered < seen.images_answered;
      if (restarted) seen = Seen{};
      auto delta = [](const StepTotals& totals, const StepTotals& before) {
        return StepTotals{totals.num_steps - before.num_steps,
                          totals.num_tokens - before.num_tokens, totals.seconds - before.seconds};
      };
      // Each pool's fit takes its own kind of steps: a decode worker that prefills a short
      // prompt locally runs prefill steps too, but its pool is sized by decode steps.
      switch (w.pool) {
        case PlannerPool::kPrefill:
          prefill_fit_.Add(delta(w.prefill_steps, seen.prefill));
          break;
        case PlannerPool::kDecode:
          decode_fit_.Add(delta(w.decode_steps, seen.decode));
          break;
        case PlannerPool::kEncoder: {
          const StepTotals d = delta(w.encode_steps, seen.encode);
          encode_fit_.Add(d);
          images_encoded_ += d.num_tokens;
          images_answered_ += w.num_images_answered - seen.images_answered;
          any_encoder = true;
          break;
        }
      }
      seen_now[w.worker_id] = Seen{w.prefill_steps, w.decode_steps, w.encode_steps,
                                   w.num_images_answered};
      if (w.draining) continue;
      switch (w.pool) {
        case PlannerPool::kPrefill:
          ++num_prefill;
          break;
        case PlannerPool::kDecode:
          ++num_decode;
          decode_blocks = decode_blocks == 0 ? w.num_total_blocks
                                             : std::min(decode_blocks, w.num_total_blocks);
          if (block_size == 0) block_size = w.block_size;
          break;
        case PlannerPool::kEncoder:
          ++num_encoder;
          break;
      }
    }
    last_ = std::move(seen_now);  // workers that left are forgotten
    prefill_cost = prefill_fit_.Fit();
    decode_cost = decode_fit_.Fit();
    encode_cost = encode_fit_.Fit();
    if (images_answered_ > 0) {
      cache_hit_rate = std::clamp(
          1.0 - static_cast<double>(images_encoded_) / static_cast<double>(images_answered_),
          0.0, 1.0);
    }
  }
  const bool plan_encoder = options_.encoder_pool || any_encoder;
  std::vector<PoolPlan> plans;
  plans.push_back(PlanPrefill(load, prefill_cost, options_.slo, num_prefill,
                              options_.min_replicas,
                              plan_encoder ? 1.0 - options_.slo.encode_share : 1.0));
  plans.push_back(PlanDecode(load, decode_cost, options_.slo, decode_blocks, block_size,
                             num_decode, options_.min_replicas));
  if (plan_encoder) {
    plans.push_back(PlanEncoder(load, encode_cost, cache_hit_rate, options_.slo, num_encoder,
                                options_.min_replicas));
  }
  return plans;
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
                   {"itl_seconds", options_.slo.itl_seconds},
                   {"encode_share", options_.slo.encode_share}}},
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
