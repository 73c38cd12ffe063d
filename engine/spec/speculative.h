// Speculative decoding options (EngineOptions::speculative) and the confidence scheduler that
// picks, per sequence and step, how many draft tokens to verify.
#ifndef SLUICE_ENGINE_SPEC_SPECULATIVE_H_
#define SLUICE_ENGINE_SPEC_SPECULATIVE_H_

#include <array>
#include <cstdint>
#include <functional>
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
  // Seconds on a clock of the caller's (differences only) that replaces cost_clock for the
  // target's step-cost fit and the wall clock for SpeculationRegime's rates; null: those.
  // Tests inject a virtual clock that a fake model advances by modelled step costs.
  std::function<double()> clock;
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

// ConfidenceScheduler decides drafting and verification lengths (DeepSeek's
// confidence-scheduled verification), maximizing the expected tokens per unit of step cost.
//
// Per sequence, P_j = c_1 · ... · c_j (c_i: the calibrated confidence of draft i) estimates that
// the first j drafts are all accepted; verifying draft j gains P_j expected tokens. With the
// target's fitted step cost a + b·tokens and a draft round's a_d + b_d·sequences, a step of B
// sequences that each draft and verify L tokens costs, per sequence,
//   C(L) = a/B + b·(1 + L) + L·(a_d/B + b_d)
// and yields E(L) = 1 + Σ_{j≤L} Π_{i≤j} ᾱ_i tokens, ᾱ_i being the mean calibrated confidence
// measured at draft depth i. BeginStep plans the rate r* = max_L E(L)/C(L) (L = 0: no
// speculation, r* = B/(a + b·B)). A long-run rate is maximal when every choice gains at least r*
// tokens per second it costs (Dinkelbach's criterion for ratio objectives), so, per sequence:
//   * drafting continues past draft j while P_j · ᾱ_{j+1} >= r* · (b + b_d + a_d/B): the next
//     draft's expected gain pays for its round and its verification row;
//   * a drafted token is verified while P_j >= r* · b: its draft round is already spent, only
//     its verification row is priced.
// Sequences in one step verify different lengths. Until the target's step cost is split into
// fixed and per-token parts (StepCostModel::Identified) every step is a probe (below). When no
// L > 0 beats L = 0 (large batches,
// slow verification) nothing is drafted except kProbeSequences sequences drafting and
// verifying in full every kProbeInterval steps, keeping the calibration and the cost fits
// measured; while probes keep finding that drafting does not pay the interval doubles up to
// kMaxProbeInterval, so a batch where speculation never pays spends next to nothing on it.
class ConfidenceScheduler {
 public:
  // What a step without drafts is, for BeginStep's plan (engine/spec/speculation_regime.h).
  enum class Baseline {
    // A synchronous plain step: L = 0 is one of the plans. Without SpeculationRegime, and in
    // its retries of speculation (no drafts when they do not pay: a cheap retry).
    kSynchronous,
    // SpeculationRegime runs plain steps pipelined and measures them itself: this step is one
    // of its speculative steps, so the plan is the best L >= 1 (a synchronous L = 0 step only
    // loses to a pipelined one), the per-sequence thresholds cutting drafts as usual.
    kPipelined,
    // SpeculationRegime's first measurement of speculation: every sequence drafts and verifies
    // in full whatever the priors and the cost fit say, so the measured rate is that of
    // speculation and the calibration learns acceptance at every depth (confidence-scheduled
    // verification cannot learn an acceptance it never verifies).
    kMeasuring,
  };

  static constexpr int64_t kProbeInterval = 16;
  static constexpr int64_t kMaxProbeInterval = 512;
  static constexpr int32_t kProbeSequences = 2;
  // ᾱ_i before depth i has drafts: kDepthPrior pseudo-observations of kDepthPriorMean.
  static constexpr double kDepthPrior = 4.0;
  static constexpr double kDepthPriorMean = 0.7;

  ConfidenceScheduler(VerifyMode mode, int32_t max_tokens) : mode_(mode), max_tokens_(max_tokens) {}

  // BeginStep prices a step of `batch` decode sequences with the target's step cost and the
  // drafter's round cost (null: free) and returns the most drafts any sequence may get (0: do
  // not draft). `*probe_only` is set when only kProbeSequences sequences should draft (they
  // then draft and verify max_tokens).
  int32_t BeginStep(int32_t batch, const StepCostModel& target, const StepCostModel* draft,
                    bool* probe_only, Baseline baseline = Baseline::kSynchronous);
  // The planned rate r* (tokens per second per sequence of the step) and the two thresholds
  // on P_j derived from it (0 in fixed mode, during probes and before any step is priced).
  double planned_rate() const { return rate_; }
  double draft_threshold() const { return draft_threshold_; }
  double verify_threshold() const { return verify_threshold_; }
  // The planned verification length (argmax of E(L)/C(L)) of the last BeginStep.
  int32_t planned_length() const { return planned_length_; }
  // KeepGoing: asked after draft `j` (0-based) was proposed with `confidence`; given the running
  // product before it (1 for j = 0), updates the product to P_{j+1} and says whether draft
  // j + 1 is worth drafting.
  bool KeepGoing(int32_t j, float confidence, double* product) const;
  // VerifyLength: the number of `confidence`'s leading drafts to verify.
  int32_t VerifyLength(absl::Span<const float> confidence) const;
  // ObserveDrafts records the confidences of one sequence's drafts, by depth (ᾱ_i).
  void ObserveDrafts(absl::Span<const float> confidence);
  // ObserveVerification records a verification of drafts with these confidences, of which the
  // first `num_accepted` were accepted (the draft after them, if verified, was rejected; later
  // ones were not tested).
  void ObserveVerification(absl::Span<const float> confidence, int32_t num_verified,
                           int32_t num_accepted);
  const ConfidenceCalibration& calibration() const { return calibration_; }
  // ᾱ_i for depth i = 1..kMaxSpeculativeTokens.
  double DepthAcceptance(int32_t depth) const;

 private:
  VerifyMode mode_;
  int32_t max_tokens_;
  bool probing_ = false;
  double rate_ = 0.0;
  double draft_threshold_ = 0.0;
  double verify_threshold_ = 0.0;
  int32_t planned_length_ = 0;
  int64_t steps_ = 0;
  int64_t probe_interval_ = kProbeInterval;
  int64_t next_probe_ = kProbeInterval;  // the step (steps_) of the next probe
  ConfidenceCalibration calibration_;
  // Exponentially weighted sums of calibrated confidence per depth (index depth - 1).
  std::array<double, kMaxSpeculativeTokens> depth_sum_{};
  std::array<double, kMaxSpeculativeTokens> depth_weight_{};
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_SPECULATIVE_H_
