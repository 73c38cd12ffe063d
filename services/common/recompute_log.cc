#include "services/common/recompute_log.h"

#include "nlohmann/json.hpp"
#include "services/serve/log.h"

namespace sluice {

RecomputeLogEntry RecomputeLogEntryOf(const RecomputeEvent& event) {
  RecomputeLogEntry e;
  e.request_id = event.request_id;
  e.cause = RecomputeCauseName(event.cause);
  e.preempted = IsPreemption(event.cause);
  e.blocks_freed = event.num_blocks_freed;
  e.tokens_to_recompute = event.num_tokens_to_recompute;
  e.needed_by = event.needed_by;
  e.detail = event.detail;
  return e;
}

std::string RecomputeLogJson(const RecomputeLogEntry& entry) {
  // ordered_json: the fields stay in the documented order for readers of raw logs.
  nlohmann::ordered_json j = {{"request_id", entry.request_id},
                              {"cause", entry.cause},
                              {"preempted", entry.preempted}};
  // What happens to a preempted request: its KV is dropped and recomputed when it is readmitted
  // (vLLM's recompute preemption mode; no swap to host memory).
  if (entry.preempted) j["mode"] = "recompute";
  j["blocks_freed"] = entry.blocks_freed;
  j["tokens_to_recompute"] = entry.tokens_to_recompute;
  if (!entry.needed_by.empty()) j["needed_by"] = entry.needed_by;
  if (!entry.source.empty()) j["source"] = entry.source;
  if (!entry.detail.empty()) j["detail"] = entry.detail;
  // Request ids and error texts come from clients and peers: invalid UTF-8 is replaced, never
  // thrown on.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void LogRecompute(const RecomputeLogEntry& entry) {
  spdlog::warn("recompute {}", RecomputeLogJson(entry));
}

void LogRecomputeEvent(const RecomputeEvent& event) { LogRecompute(RecomputeLogEntryOf(event)); }

}  // namespace sluice
