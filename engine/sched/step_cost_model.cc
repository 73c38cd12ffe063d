#include "engine/sched/step_cost_model.h"

#include <algorithm>

namespace sluice {

void StepCostModel::Observe(double tokens, double seconds) {
  w_ = w_ * decay_ + 1.0;
  x_ = x_ * decay_ + tokens;
  y_ = y_ * decay_ + seconds;
  xx_ = xx_ * decay_ + tokens * tokens;
  xy_ = xy_ * decay_ + tokens * seconds;
  ++n_;
}

double StepCostModel::per_token_seconds() const {
  if (w_ <= 0) return 0.0;
  const double var = w_ * xx_ - x_ * x_;
  // Relative spread below 1e-9: all observations at one token count, the slope is unknown.
  if (var <= 1e-9 * w_ * xx_) return 0.0;
  return std::max(0.0, (w_ * xy_ - x_ * y_) / var);
}

double StepCostModel::fixed_seconds() const {
  if (w_ <= 0) return 0.0;
  return std::max(0.0, (y_ - per_token_seconds() * x_) / w_);
}

}  // namespace sluice
