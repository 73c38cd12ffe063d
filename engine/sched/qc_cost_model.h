// QcCostModel: the time of one forward step as a function of its rows, cost(q, c), fitted
// online from measured steps; the scheduler sizes prefill chunks with it under a per-step time
// budget (SchedulerConfig::step_time_budget_seconds).
//
// A row computes q new tokens of a sequence whose first c tokens are already in the KV cache.
// Its work has a part linear in q (projections, MLP, sampling: per token) and an attention part
// proportional to the query-key pairs it scores, q·c + q·(q+1)/2 (token i of the chunk attends
// to c + i + 1 keys; causal attention as in Vaswani et al. 2017). A step of rows (q_r, c_r):
//
//   cost = fixed + per_token · Σ q_r + per_pair · Σ pairs(q_r, c_r)
//
// The three coefficients are fitted by exponentially weighted least squares constrained to be
// >= 0 (the best of the fits on every subset of the terms whose coefficients are all >= 0: with
// three terms an exact non-negative least squares). Not thread-safe.
#ifndef SLUICE_ENGINE_SCHED_QC_COST_MODEL_H_
#define SLUICE_ENGINE_SCHED_QC_COST_MODEL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice {

class QcCostModel {
 public:
  // pairs(q, c) = q·c + q·(q+1)/2: query-key pairs scored by a chunk of q tokens after c.
  static double Pairs(double q, double c) { return q * c + q * (q + 1) / 2; }

  // `decay` in (0, 1]: weight kept by older observations per new one (1: plain least squares).
  explicit QcCostModel(double decay = 0.99) : decay_(decay) {}

  // Observe adds one measured step: Σq of its rows (tokens), Σ pairs(q, c) of its rows, and
  // its time in seconds.
  void Observe(double tokens, double pairs, double seconds);

  // True once at least kMinObservations steps with differing token counts were observed, so
  // that the per-token cost is separated from the fixed one.
  bool Fitted() const;
  double fixed_seconds() const { return Solve()[0]; }
  double per_token_seconds() const { return Solve()[1]; }
  double per_pair_seconds() const { return Solve()[2]; }
  // Predicted seconds of a step with these totals (0 before any observation).
  double Predict(double tokens, double pairs) const;
  // RowSeconds: the marginal cost of one row (q, c) in a step (no fixed part).
  double RowSeconds(double q, double c) const;
  int64_t num_observations() const { return n_; }

  // Overrun: the fit is a mean, so about half the steps take longer than predicted, more so
  // when other processes share the cores. Steps predicted to take at least `min_seconds` (0:
  // none tracked) record measured / predicted seconds; OverrunRatio is the kOverrunQuantile of
  // the last kOverrunWindow of them, at least 1 (1 with fewer than kMinObservations). A budget
  // divided by it holds for about that share of the steps.
  void TrackOverrun(double min_seconds) { overrun_min_seconds_ = min_seconds; }
  double OverrunRatio() const;

  static constexpr int64_t kMinObservations = 8;
  static constexpr size_t kOverrunWindow = 64;
  static constexpr double kOverrunQuantile = 0.9;

 private:
  // Solve returns {fixed, per_token, per_pair}, cached until the next Observe.
  const std::array<double, 3>& Solve() const;

  double decay_;
  // Weighted normal equations over the features (1, tokens, pairs): g_[i][j] = Σ w·x_i·x_j,
  // b_[i] = Σ w·x_i·y, yy_ = Σ w·y².
  std::array<std::array<double, 3>, 3> g_{};
  std::array<double, 3> b_{};
  double yy_ = 0;
  double min_tokens_ = 0, max_tokens_ = 0;
  int64_t n_ = 0;
  double overrun_min_seconds_ = 0;
  std::vector<double> overruns_;  // ring of the last kOverrunWindow ratios
  size_t next_overrun_ = 0;
  mutable bool solved_ = true;
  mutable std::array<double, 3> coef_{};
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_QC_COST_MODEL_H_
