#include "engine/sched/qc_cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sluice {
namespace {

// SolveSubset solves the normal equations restricted to the terms in `mask` (bit i: term i),
// in coordinates scaled to unit diagonal. False when the restricted system is singular.
bool SolveSubset(const std::array<std::array<double, 3>, 3>& g, const std::array<double, 3>& b,
                 unsigned mask, std::array<double, 3>& coef) {
  int idx[3];
  int k = 0;
  for (int i = 0; i < 3; ++i) {
    if ((mask >> i) & 1u) idx[k++] = i;
  }
  double scale[3];
  for (int i = 0; i < k; ++i) {
    const double d = g[idx[i]][idx[i]];
    if (!(d > 0)) return false;
    scale[i] = std::sqrt(d);
  }
  double a[3][4];
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < k; ++j) a[i][j] = g[idx[i]][idx[j]] / (scale[i] * scale[j]);
    a[i][k] = b[idx[i]] / scale[i];
  }
  // Gauss-Jordan with partial pivoting; a pivot near zero means collinear terms.
  for (int c = 0; c < k; ++c) {
    int p = c;
    for (int r = c + 1; r < k; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    }
    if (std::abs(a[p][c]) < 1e-9) return false;
    for (int j = 0; j <= k; ++j) std::swap(a[c][j], a[p][j]);
    for (int r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int j = c; j <= k; ++j) a[r][j] -= f * a[c][j];
    }
  }
  coef = {0, 0, 0};
  for (int i = 0; i < k; ++i) coef[idx[i]] = a[i][k] / a[i][i] / scale[i];
  return true;
}

}  // namespace

void QcCostModel::Observe(double tokens, double pairs, double seconds) {
  if (overrun_min_seconds_ > 0 && Fitted()) {
    const double predicted = Predict(tokens, pairs);
    if (predicted >= overrun_min_seconds_) {
      if (overruns_.size() < kOverrunWindow) {
        overruns_.push_back(seconds / predicted);
      } else {
        overruns_[next_overrun_] = seconds / predicted;
        next_overrun_ = (next_overrun_ + 1) % kOverrunWindow;
      }
    }
  }
  const double x[3] = {1.0, tokens, pairs};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) g_[i][j] = g_[i][j] * decay_ + x[i] * x[j];
    b_[i] = b_[i] * decay_ + x[i] * seconds;
  }
  yy_ = yy_ * decay_ + seconds * seconds;
  if (n_ == 0) {
    min_tokens_ = max_tokens_ = tokens;
  } else {
    min_tokens_ = std::min(min_tokens_, tokens);
    max_tokens_ = std::max(max_tokens_, tokens);
  }
  ++n_;
  solved_ = false;
}

double QcCostModel::OverrunRatio() const {
  if (static_cast<int64_t>(overruns_.size()) < kMinObservations) return 1.0;
  std::vector<double> sorted = overruns_;
  const size_t k = static_cast<size_t>(std::ceil(kOverrunQuantile * sorted.size())) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end());
  return std::max(1.0, sorted[k]);
}

bool QcCostModel::Fitted() const {
  return n_ >= kMinObservations && max_tokens_ > min_tokens_;
}

const std::array<double, 3>& QcCostModel::Solve() const {
  if (solved_) return coef_;
  solved_ = true;
  coef_ = {0, 0, 0};
  double best_sse = std::numeric_limits<double>::infinity();
  for (unsigned mask = 1; mask < 8; ++mask) {
    std::array<double, 3> c;
    if (!SolveSubset(g_, b_, mask, c)) continue;
    if (c[0] < 0 || c[1] < 0 || c[2] < 0) continue;
    // Weighted residual sum of squares from the normal equations: yy - 2c·b + cᵀGc.
    double sse = yy_;
    for (int i = 0; i < 3; ++i) {
      sse -= 2 * c[i] * b_[i];
      for (int j = 0; j < 3; ++j) sse += c[i] * g_[i][j] * c[j];
    }
    if (sse < best_sse) {
      best_sse = sse;
      coef_ = c;
    }
  }
  return coef_;
}

double QcCostModel::Predict(double tokens, double pairs) const {
  const std::array<double, 3>& c = Solve();
  return c[0] + c[1] * tokens + c[2] * pairs;
}

double QcCostModel::RowSeconds(double q, double c) const {
  const std::array<double, 3>& k = Solve();
  return k[1] * q + k[2] * Pairs(q, c);
}

}  // namespace sluice
