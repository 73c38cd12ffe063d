// RecomputeEvent: the engine dropped KV a request had (or had been sent) and computes those
// tokens again. One event per request and occurrence, reported through
// EngineOptions::on_recompute so that every recompute can be logged with its cause.
#ifndef SLUICE_ENGINE_SCHED_RECOMPUTE_EVENT_H_
#define SLUICE_ENGINE_SCHED_RECOMPUTE_EVENT_H_

#include <cstdint>
#include <string>

namespace sluice {

enum class RecomputeCause {
  // Preempted: a running request's next tokens needed KV blocks and none were free, so the
  // last running request in serving order gave its blocks back (vLLM's recompute preemption).
  kOutOfKvBlocks,
  // Preempted: nothing ran, the head of the waiting queue did not fit, and requests queued
  // behind it held blocks they could not run on; they gave them back so the head can start.
  kWaitingHeadBlocked,
  // A KV transfer moved only the full-attention layers (SWA bounded replay) and rebuilding the
  // sliding-window layers failed: the transferred prompt KV cannot be used.
  kSwaReplayFailed,
  // As kSwaReplayFailed for blocks loaded from the kvstore: the loaded tokens are computed.
  kKvstoreSwaReplayFailed,
};

// "out_of_kv_blocks" | "waiting_head_blocked" | "swa_replay_failed" |
// "kvstore_swa_replay_failed": the `cause` of log lines and metric labels.
inline const char* RecomputeCauseName(RecomputeCause cause) {
  switch (cause) {
    case RecomputeCause::kOutOfKvBlocks:
      return "out_of_kv_blocks";
    case RecomputeCause::kWaitingHeadBlocked:
      return "waiting_head_blocked";
    case RecomputeCause::kSwaReplayFailed:
      return "swa_replay_failed";
    case RecomputeCause::kKvstoreSwaReplayFailed:
      return "kvstore_swa_replay_failed";
  }
  return "unknown";
}

inline bool IsPreemption(RecomputeCause cause) {
  return cause == RecomputeCause::kOutOfKvBlocks || cause == RecomputeCause::kWaitingHeadBlocked;
}

struct RecomputeEvent {
  std::string request_id;
  RecomputeCause cause = RecomputeCause::kOutOfKvBlocks;
  // KV blocks the request gave back (a block shared through the prefix cache loses one
  // reference and stays cached for its other holders).
  int64_t num_blocks_freed = 0;
  // Tokens whose KV is lost and computed again (before any prefix-cache hit at readmission).
  int64_t num_tokens_to_recompute = 0;
  // Preemptions: the request whose tokens needed the blocks (for kWaitingHeadBlocked the
  // waiting head).
  std::string needed_by;
  // Replay failures: the error.
  std::string detail;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_RECOMPUTE_EVENT_H_
