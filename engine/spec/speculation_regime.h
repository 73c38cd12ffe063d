// SpeculationRegime: with --speculative-verify auto on a model that runs asynchronous steps
// (the CUDA runners), chooses per step between the two ways the engine can decode:
//   * speculative steps: drafting needs each step's real last token, so every step is read
//     before the next one is planned (synchronous), and the confidence scheduler decides the
//     drafts (ConfidenceScheduler; it may decide none);
//   * pipelined plain steps: no drafts, async scheduling on (the next step is enqueued before
//     this one is read, so the host's scheduling, drafting-free, overlaps the device).
// The confidence scheduler's cost model prices drafts against a synchronous plain step, which is
// the wrong baseline when the pipelined one is faster (a small model on a GPU: the host's step
// overhead is most of a synchronous step). So each regime's realized rate is measured — tokens
// emitted per second of engine time per running sequence, over the steps it ran — and the better
// one runs. The two share the work (ConfidenceScheduler::Baseline):
//   * in speculation's first measurement (DraftsInFull()) every sequence drafts and
//     verifies in full, so the window measures speculation itself — not synchronous plain steps
//     that the pessimistic priors or a cost fit thrown off by a few slow first steps would plan
//     — and calibrates acceptance at every depth;
//   * while speculation runs (it won) the scheduler plans the best L >= 1 drafts: no drafts at
//     all is the pipelined regime, whose rate this class measures; per-sequence thresholds
//     still cut the drafts that do not pay;
//   * a retry of speculation (Retrying()) runs the scheduler's own plan, L = 0 included, so where
//     drafting does not pay (large batches) a retry costs synchronous plain steps, not drafts;
//   * the target's cost fit then prices verify steps only (a plain synchronous step may take
//     another path, CUDA graphs, whose cost would bend the line through the verify steps). The other is measured again for kMeasureSteps steps after an interval that starts
// at kRetryInterval steps and grows (up to kMaxRetryInterval) each time it still loses, by the
// factor it lost by and at least 2, as the confidence scheduler spaces its probes; a retry
// running below kAbandonRatio of the running regime's rate ends after kMinRetrySteps counted
// steps. So a batch where speculation never pays spends next to nothing on it (on a GPU, a CPU
// draft model's speculative step of 8 sequences costs ~10 plain pipelined steps), and one where
// it starts paying (longer outputs, a warmer calibration) finds out.
#ifndef SLUICE_ENGINE_SPEC_SPECULATION_REGIME_H_
#define SLUICE_ENGINE_SPEC_SPECULATION_REGIME_H_

#include <cstdint>
#include <vector>

namespace sluice {

class SpeculationRegime {
 public:
  // Steps per measurement of a regime; its first step is not counted (it may be the switch: a
  // drained pipeline, or a first draft round that catches up on many tokens).
  static constexpr int64_t kMeasureSteps = 8;
  static constexpr int64_t kRetryInterval = 32;
  static constexpr int64_t kMaxRetryInterval = 1024;
  static constexpr int64_t kMinRetrySteps = 2;
  static constexpr double kAbandonRatio = 0.5;
  // NoteNewSequences retries for new texts only in batches of at most kTurnoverMaxSequences
  // (a larger batch's gain averages over many texts, and drafting it in full costs more), and
  // only while speculation's last rate was at least kTurnoverRetryRatio of the pipelined one
  // (at batch 1 a quoting text drafts ~1.8x the plain rate and prose ~0.75x).
  static constexpr int64_t kTurnoverMaxSequences = 4;
  static constexpr double kTurnoverRetryRatio = 0.4;
  // Weight of the older steps in the running regime's rate, per step.
  static constexpr double kDecay = 0.9;
  // A measurement leaves out its steps slower than kOutlierFactor × its median step: one-off
  // costs the engine could not net out (Model::kernel_setup_seconds) would otherwise decide a
  // regime from one step of eight.
  static constexpr double kOutlierFactor = 4.0;

  // Pipelined: the next step runs plain and pipelined (else speculative).
  bool Pipelined() const { return pipelined_; }
  // DraftsInFull: the next step is one of speculation's first measurement, or of a retry for
  // new sequences (NoteNewSequences); the confidence scheduler then drafts and verifies in full
  // (ConfidenceScheduler::Baseline::kMeasuring): a new text's acceptance is not calibrated yet.
  bool DraftsInFull() const {
    return !pipelined_ && (phase_ == Phase::kFirst || (phase_ == Phase::kRetry && full_retry_));
  }
  // Retrying: the next step is one of a later measurement of the regime not running.
  bool Retrying() const { return phase_ == Phase::kRetry; }
  // Observe: the step just run (in the regime Pipelined() said) took `seconds` of engine time,
  // from its start to the next step's, and emitted `tokens` tokens for `sequences` running
  // decode sequences. Steps without decode sequences are not observed. Then moves on: may
  // switch the regime of the next step.
  void Observe(double seconds, int64_t tokens, int64_t sequences);
  // NoteNewSequences: `count` of the `decoding` decode sequences of the next step start
  // decoding with it. Once half the decode batch has started in pipelined steps since
  // speculation last ran, the pipelined regime retries speculation at once, drafting in full,
  // its spacing back at kRetryInterval: what drafting gains depends on the text, and at batch 1
  // a new request's text alone decides. Not for batches over kTurnoverMaxSequences, nor when
  // speculation's last rate was below kTurnoverRetryRatio of the pipelined one: no text makes
  // up for that (a CPU draft model's verify steps beside a GPU target: 0.05x at batch 64).
  void NoteNewSequences(int64_t count, int64_t decoding);
  // The measured rates (tokens per second per sequence; 0 before a measurement).
  double speculative_rate() const { return rate_[0].Value(); }
  double pipelined_rate() const { return rate_[1].Value(); }
  int64_t num_switches() const { return num_switches_; }

 private:
  struct Rate {
    double tokens = 0.0;
    double sequence_seconds = 0.0;
    double Value() const { return sequence_seconds > 0.0 ? tokens / sequence_seconds : 0.0; }
  };
  enum class Phase { kFirst, kSecond, kExploit, kRetry };
  struct Step {
    double seconds = 0.0;
    double tokens = 0.0;
    double sequences = 0.0;
  };
  void Start(bool pipelined, Phase phase);
  // The rate of the measurement's steps, those slower than kOutlierFactor × the median left out.
  Rate MeasuredRate() const;

  bool pipelined_ = false;      // speculative first: it also calibrates the drafter
  Phase phase_ = Phase::kFirst;
  int64_t phase_steps_ = 0;     // steps observed in this phase
  int64_t retry_interval_ = kRetryInterval;
  int64_t num_switches_ = 0;
  bool full_retry_ = false;         // this retry drafts in full (new sequences)
  int64_t new_since_measured_ = 0;  // sequences that started decoding in pipelined steps
                                    // since speculation last ran
  Rate rate_[2];                // [speculative, pipelined]
  std::vector<Step> window_;    // the counted steps of the measurement in progress
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_SPECULATION_REGIME_H_
