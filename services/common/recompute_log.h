// The log line of every recompute a server makes (issue: each one said with its cause):
//
//   recompute {"request_id":"…","cause":"out_of_kv_blocks","preempted":true,"mode":"recompute",
//              "blocks_freed":4,"tokens_to_recompute":57,"needed_by":"…"}
//
// one line per request and occurrence, at warning level, JSON after the word "recompute" (as
// --log-steps writes "step {json}"). `cause` is a RecomputeCauseName for what the engine
// decides (preemptions, sliding-window replays that failed), or a decode worker's transfer
// reason (RecomputeReasonName: pin_gone, ack_failed, transfer_timeout, reservation_expired,
// transfer_failed, staging_copy_failed). A preemption says what happens to the request: `mode` "recompute" (it
// gave its blocks back, waits, and computes its tokens again when readmitted; swapping KV to
// host memory is not implemented). `needed_by` (preemptions: whose tokens needed the blocks),
// `source` (the peer whose KV was not used) and `detail` (the error) appear when known. Every
// line is counted in sluice_recomputes_total{cause} (services/common/metrics.h).
#ifndef SLUICE_SERVICES_COMMON_RECOMPUTE_LOG_H_
#define SLUICE_SERVICES_COMMON_RECOMPUTE_LOG_H_

#include <cstdint>
#include <string>

#include "engine/sched/recompute_event.h"

namespace sluice {

struct RecomputeLogEntry {
  std::string request_id;
  std::string cause;
  bool preempted = false;
  int64_t blocks_freed = 0;
  int64_t tokens_to_recompute = 0;
  std::string needed_by;  // omitted when empty, as the next two
  std::string source;
  std::string detail;
};

RecomputeLogEntry RecomputeLogEntryOf(const RecomputeEvent& event);
// RecomputeLogJson: the JSON object of the line (fields in the order above).
std::string RecomputeLogJson(const RecomputeLogEntry& entry);
// LogRecompute writes the line (spdlog, warning).
void LogRecompute(const RecomputeLogEntry& entry);
// LogRecomputeEvent: for EngineOptions::on_recompute.
void LogRecomputeEvent(const RecomputeEvent& event);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_RECOMPUTE_LOG_H_
