// StepCostModel: the time of one forward step as fixed + per_token · tokens, fitted online by
// exponentially weighted least squares over measured steps. The engine fits one for the target
// model (every step) and a draft model fits its own per draft round; speculative decoding's
// confidence scheduler prices verification and drafting with them.
#ifndef SLUICE_ENGINE_SCHED_STEP_COST_MODEL_H_
#define SLUICE_ENGINE_SCHED_STEP_COST_MODEL_H_

#include <cstdint>

namespace sluice {

// The clock step costs are measured on. kWall (serving): elapsed time. kProcessCpu: CPU time of
// every thread of the process — for a CPU-backend engine on a shared machine, where elapsed time
// also counts waiting for a core; the fits' ratios (all the confidence scheduler uses) match
// kWall's on a dedicated machine. Not for CUDA, whose steps wait on the device.
enum class CostClock { kWall, kProcessCpu };
// Seconds on `clock` since an arbitrary origin (differences only).
double CostClockSeconds(CostClock clock);

class StepCostModel {
 public:
  // `decay` in (0, 1]: weight kept by older observations per new one (1: plain least squares).
  explicit StepCostModel(double decay = 0.99) : decay_(decay) {}
  void Observe(double tokens, double seconds);
  // Fitted coefficients, both >= 0. With no spread in observed token counts the split is
  // unknown and the pessimistic one is taken: all of the cost per token (fixed 0, slope the mean
  // seconds per token); with no observation both are 0.
  double fixed_seconds() const;
  double per_token_seconds() const;
  double Predict(double tokens) const { return fixed_seconds() + per_token_seconds() * tokens; }
  int64_t num_observations() const { return n_; }
  // True once observed token counts differ enough to split fixed and per-token cost.
  bool Identified() const;

 private:
  double decay_;
  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;  // weighted sums
  int64_t n_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_STEP_COST_MODEL_H_
