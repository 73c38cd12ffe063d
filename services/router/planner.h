// Planner: the replicas each worker pool (prefill, decode, and encoder for a vision-language
// model) needs to meet a TTFT and an ITL SLO at the observed load, with a step cost model per
// pool fitted from the workers' own timed steps.
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
// Encoder pool (a vision-language model, or encoder workers registered): the router sends each
// request's images to one encoder in one Encode call, so an image request is one job of
// S_enc = fixed + per_image · I · (1 − h) seconds, I the mean images per image request and h the
// encoders' embedding-cache hit rate (both measured), fixed and per_image fitted from the
// encoders' (calls, images encoded, seconds). The encode stage gets a share of the TTFT SLO
// (slo.encode_share): the same M/D/1 sizing as prefill on the arrival rate of image requests with
// budget encode_share · slo_ttft, and the prefill pool then plans with the rest,
// (1 − encode_share) · slo_ttft.
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
  // Share of the TTFT SLO the encode stage (waiting for an encoder, encoding) may take when the
  // deployment has an encoder pool; prefill gets the rest.
  double encode_share = 0.25;
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
  // Requests with images to encode, counted at arrival.
  double image_request_rate = 0.0;  // per second
  double mean_images_per_image_request = 0.0;
  int64_t num_image_requests = 0;  // in the window
};

// PoolPlan: one pool's answer and the numbers behind it (as JSON for /v1/planner).
struct PoolPlan {
  std::string pool;
  int64_t current_replicas = 0;
  int64_t desired_replicas = 0;
  nlohmann::json explanation;
};

// PlanPrefill / PlanDecode / PlanEncoder: the formulas above. `ttft_share` is the part of the
// TTFT SLO prefill may take (1 − encode_share with an encoder pool). `kv_blocks_per_replica` and
// `block_size` bound the decode batch (0: no bound). For the encoder, the cost is per Encode call
// (fixed) and per image encoded (per_token_seconds), and `cache_hit_rate` the share of images
// the encoders answered from their cache.
PoolPlan PlanPrefill(const Workload& load, const StepCost& cost, const PlannerSlo& slo,
                     int64_t current_replicas, int64_t min_replicas, double ttft_share = 1.0);
PoolPlan PlanDecode(const Workload& load, const StepCost& cost, const PlannerSlo& slo,
                    int64_t kv_blocks_per_replica, int64_t block_size, int64_t current_replicas,
                    int64_t min_replicas);
PoolPlan PlanEncoder(const Workload& load, const StepCost& cost, double cache_hit_rate,
                     const PlannerSlo& slo, int64_t current_replicas, int64_t min_replicas);

// WorkloadWindow: finished requests over the last `window` (thread-safe).
class WorkloadWindow {
 public:
  explicit WorkloadWindow(absl::Duration window) : window_(window) {}
  void Add(absl::Time finished, int64_t prompt_tokens, int64_t cached_tokens,
           int64_t output_tokens);
  // AddImageRequest: a request with `num_images` images to encode arrived.
  void AddImageRequest(absl::Time arrived, int64_t num_images);
  // Snapshot: the window ending at `now`. The rate divides by the window, or by the time since
  // the first request ever seen when that is shorter (a fresh router).
  Workload Snapshot(absl::Time now) const;

 private:
  struct Event {
    absl::Time finished;
    int64_t prompt, cached, output;
  };
  struct ImageEvent {
    absl::Time arrived;
    int64_t num_images;
  };
  void SeenAt(absl::Time t);  // mu_ held
  const absl::Duration window_;
  mutable std::mutex mu_;
  mutable std::deque<Event> events_;             // guarded by mu_
  mutable std::deque<ImageEvent> image_events_;  // guarded by mu_
  absl::Time first_ = absl::InfinitePast();      // the earliest event ever seen
};

enum class PlannerPool { kPrefill, kDecode, kEncoder };

// PlannerWorker: what the planner reads of one registered worker.
struct PlannerWorker {
  std::string worker_id;
  PlannerPool pool = PlannerPool::kDecode;
  bool draining = false;
  int64_t num_total_blocks = 0;
  int64_t block_size = 0;
  StepTotals prefill_steps;  // cumulative
  StepTotals decode_steps;
  // Encoder workers: Encode calls, images encoded (cache hits excluded), seconds; and images
  // answered in all (cumulative).
  StepTotals encode_steps;
  int64_t num_images_answered = 0;
};

struct PlannerOptions {
  PlannerSlo slo;
  absl::Duration window = absl::Seconds(60);
  int64_t min_replicas = 1;
  // Plan the encoder pool (the model takes images). It is planned as well whenever encoder
  // workers are registered.
  bool encoder_pool = false;
};

// Planner: the window, each pool's cost fit (from worker step-total increments) and the plan.
// Thread-safe.
class Planner {
 public:
  explicit Planner(PlannerOptions options);
  void ObserveRequest(absl::Time finished, int64_t prompt_tokens, int64_t cached_tokens,
                      int64_t output_tokens);
  // ObserveImageRequest: a request with `num_images` images to encode arrived.
  void ObserveImageRequest(absl::Time arrived, int64_t num_images);
  // Plan refreshes the cost fits from `workers` (increments since the previous call per worker;
  // a restarted worker's totals start over) and returns the plans of prefill, decode and, with
  // an encoder pool, encoder, in that order.
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
  StepCostFit encode_fit_;   // guarded by mu_
  // Encoder images over every increment seen: answered and encoded (the cache hit rate).
  int64_t images_answered_ = 0, images_encoded_ = 0;  // guarded by mu_
  struct Seen {
    StepTotals prefill, decode, encode;
    int64_t images_answered = 0;
  };
  std::map<std::string, Seen> last_;  // guarded by mu_
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_PLANNER_H_
