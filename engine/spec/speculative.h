// Speculative decoding options (EngineOptions::speculative) and the confidence scheduler that
// picks, per sequence and step, how many draft tokens to verify.
#ifndef SLUICE_ENGINE_SPEC_SPECULATIVE_H_
#define SLUICE_ENGINE_SPEC_SPECULATIVE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/sched/step_cost_model.h"
#include "engine/spec/drafter.h"
#include "engine/spec/rejection_sampler.h"

namespace sluice {

// Range of --num-speculative-tokens.
inline constexpr int32_t kMaxSpeculativeTokens = 16;

enum class VerifyMode {
  kFixed,  // draft and verify num_speculative_tokens every step
  kAuto,   // confidence-scheduled, up to num_speculative_tokens (the default)
};

struct SpeculativeOptions {
  std::shared_ptr<Drafter> drafter;  // null: no speculative decoding
  int32_t num_speculative_tokens = 5;  // k (kFixed) or its maximum (kAuto); 1..16
  VerifyMode verify = VerifyMode::kAuto;
  std::shared_ptr<const RejectionRule> rejection_rule;  // null: the exact rule
  // The clock the target's step-cost fit uses (a draft model's fit: DraftModelOptions).
  CostClock cost_clock = CostClock::kWall;
  bool enabled() const { return drafter != nullptr; }
  // InvalidArgument naming --num-speculative-tokens when it is outside [1, 16].
  absl::Status Validate() const;
};

// ParseVerifyMode: "auto" → kAuto, a number k → kFixed with *k set (1..16), else
// InvalidArgument naming --speculative-verify.
absl::Status ParseVerifyMode(const std::string& text, VerifyMode* mode, int32_t* k);

// ConfidenceCalibration maps a draft token's confidence (the drafter's probability) to the
// measured probability that the target accepts it, given the drafts before it were accepted:
// ten confidence bins, each the acceptance rate observed there with a prior of kPriorWeight
// pseudo-observations at the bin's centre.
class ConfidenceCalibration {
 public:
  static constexpr int kBins = 10;
  static constexpr double kPriorWeight = 4.0;
  double Map(float confidence) const;
  void Observe(float confidence, bool accepted);
  // The largest mapped value over the bins (an upper bound of any one position's acceptance).
  double MaxAcceptance() const;

 private:
  static int Bin(float confidence);
  std::array<double, kBins> accepted_{};
  std::array<double, kBins> total_{};
};

// ConfidenceScheduler decides verification lengths (DeepSeek's confidence-scheduled
// verification). For a sequence whose drafts have calibrated confidences c1, c2, ..., the
// probability that the first j are all accepted is P_j = c1 · ... · cj, and verifying draft j
// gains P_j expected tokens. Its cost in a step of B decode sequences is the target's per-token
// step cost b plus one draft round's share a_d / B + b_d (StepCostModel fits); against the rate
// without speculation, B / (a + b·B), draft j pays while
//   P_j >= threshold = (B · (b + b_d) + a_d) / (a + b·B).
// So each sequence verifies the longest prefix with P_j >= threshold (at most max_tokens),
// sequences in one step verify different lengths, and when even the best calibrated acceptance
// is below the threshold nothing is drafted (kProbeSequences sequences draft in full every
// kProbeInterval steps, keeping the calibration and the cost fit measured; while probes keep
// finding that drafting does not pay, the interval doubles up to kMaxProbeInterval, so a
// batch where speculation never pays spends next to nothing on it).
class ConfidenceScheduler {
 public:
  static constexpr int64_t kProbeInterval = 16;
  static constexpr int64_t kMaxProbeInterval = 512;
  static constexpr int32_t kProbeSequences = 2;

  ConfidenceScheduler(VerifyMode mode, int32_t max_tokens) : mode_(mode), max_tokens_(max_tokens) {}

  // BeginStep prices a step of `batch` decode sequences with the target's step cost and the
  // drafter's round cost (null: free) and returns the most drafts any sequence may get (0: do
  // not draft). `*probe_only` is set when only kProbeSequences sequences should draft.
  int32_t BeginStep(int32_t batch, const StepCostModel& target, const StepCostModel* draft,
                    bool* probe_only);
  double threshold() const { return threshold_; }
  // KeepGoing: given the running product so far (1 before the first draft) and the next draft's
  // confidence, updates the product and says whether that draft is worth verifying.
  bool KeepGoing(float confidence, double* product) const;
  // VerifyLength: the number of `confidence`'s leading drafts to verify.
  int32_t VerifyLength(absl::Span<const float> confidence) const;
  // ObserveVerification records a verification of drafts with these confidences, of which the
  // first `num_accepted` were accepted (the draft after them, if verified, was rejected; later
  // ones were not tested).
  void ObserveVerification(absl::Span<const float> confidence, int32_t num_verified,
                           int32_t num_accepted);
  const ConfidenceCalibration& calibration() const { return calibration_; }

 private:
  VerifyMode mode_;
  int32_t max_tokens_;
  double threshold_ = 0.0;
  int64_t steps_ = 0;
  int64_t probe_interval_ = kProbeInterval;
  int64_t next_probe_ = kProbeInterval;  // the step (steps_) of the next probe
  ConfidenceCalibration calibration_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_SPECULATIVE_H_
