#include "engine/sched/step_cost_model.h"

#include <chrono>
#include <ctime>

#include <algorithm>

namespace sluice {

double CostClockSeconds(CostClock clock) {
  if (clock == CostClock::kProcessCpu) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void StepCostModel::Observe(double tokens, double seconds) {
  w_ = w_ * decay_ + 1.0;
  x_ = x_ * decay_ + tokens;
  y_ = y_ * decay_ + seconds;
  xx_ = xx_ * decay_ + tokens * tokens;
  xy_ = xy_ * decay_ + tokens * seconds;
  ++n_;
}

bool StepCostModel::Identified() const {
  // Relative spread below 1e-9: all observations at one token count.
  return w_ > 0 && w_ * xx_ - x_ * x_ > 1e-9 * w_ * xx_;
}

double StepCostModel::per_token_seconds() const {
  if (w_ <= 0 || x_ <= 0) return 0.0;
  if (!Identified()) return y_ / x_;
  const double slope = (w_ * xy_ - x_ * y_) / (w_ * xx_ - x_ * x_);
  // A negative fixed part means the line is steeper than measured: cap it at the mean rate.
  return std::clamp(slope, 0.0, y_ / x_);
}

double StepCostModel::fixed_seconds() const {
  if (w_ <= 0 || !Identified()) return 0.0;
  return std::max(0.0, (y_ - per_token_seconds() * x_) / w_);
}

}  // namespace sluice
