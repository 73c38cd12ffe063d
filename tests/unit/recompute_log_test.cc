// Recomputes said as they happen: the log line of each (services/common/recompute_log.h), and
// the cause / reason labels of sluice_preemptions_total and sluice_decode_recomputes_total on
// serve's and the workers' /metrics.
#include "services/common/recompute_log.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "services/common/metrics.h"
#include "services/common/worker_metrics.h"

namespace sluice {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(RecomputeLogTest, PreemptionLineCarriesRequestCauseBlocksAndTokens) {
  RecomputeEvent e;
  e.request_id = "cmpl-7";
  e.cause = RecomputeCause::kOutOfKvBlocks;
  e.num_blocks_freed = 6;
  e.num_tokens_to_recompute = 24;
  e.needed_by = "cmpl-3";
  // The default logger writes to stdout: "[time] [warning] recompute {json}".
  ::testing::internal::CaptureStdout();
  LogRecomputeEvent(e);
  const std::string text = ::testing::internal::GetCapturedStdout();
  EXPECT_THAT(text, HasSubstr("warning"));
  EXPECT_THAT(text,
              EndsWith("] recompute {\"request_id\":\"cmpl-7\",\"cause\":\"out_of_kv_blocks\","
                       "\"preempted\":true,\"mode\":\"recompute\",\"blocks_freed\":6,"
                       "\"tokens_to_recompute\":24,\"needed_by\":\"cmpl-3\"}\n"));
  const nlohmann::json j = nlohmann::json::parse(text.substr(text.find('{')));
  EXPECT_EQ(j.at("cause"), "out_of_kv_blocks");
  EXPECT_EQ(j.at("mode"), "recompute");  // what happens to it: recomputed, not swapped
  EXPECT_EQ(j.at("blocks_freed"), 6);
}

TEST(RecomputeLogTest, EveryCauseHasItsName) {
  EXPECT_STREQ(RecomputeCauseName(RecomputeCause::kOutOfKvBlocks), "out_of_kv_blocks");
  EXPECT_STREQ(RecomputeCauseName(RecomputeCause::kWaitingHeadBlocked), "waiting_head_blocked");
  EXPECT_STREQ(RecomputeCauseName(RecomputeCause::kSwaReplayFailed), "swa_replay_failed");
  EXPECT_STREQ(RecomputeCauseName(RecomputeCause::kKvstoreSwaReplayFailed),
               "kvstore_swa_replay_failed");
  EXPECT_TRUE(IsPreemption(RecomputeCause::kWaitingHeadBlocked));
  EXPECT_FALSE(IsPreemption(RecomputeCause::kSwaReplayFailed));
}

TEST(RecomputeLogTest, ReplayFailureLineIsNotAPreemptionAndCarriesTheError) {
  RecomputeEvent e;
  e.request_id = "r";
  e.cause = RecomputeCause::kSwaReplayFailed;
  e.num_blocks_freed = 4;
  e.num_tokens_to_recompute = 60;
  e.detail = "replay forward failed";
  EXPECT_EQ(RecomputeLogJson(RecomputeLogEntryOf(e)),
            "{\"request_id\":\"r\",\"cause\":\"swa_replay_failed\",\"preempted\":false,"
            "\"blocks_freed\":4,\"tokens_to_recompute\":60,"
            "\"detail\":\"replay forward failed\"}");
}

// The decode worker's transfer recomputes: its own reason, the peer, the error; a client's
// request id that is not UTF-8 is replaced, not thrown on.
TEST(RecomputeLogTest, TransferLineCarriesSourceAndSurvivesBadBytes) {
  RecomputeLogEntry entry;
  entry.request_id = std::string("id-\xff");
  entry.cause = "pin_gone";
  entry.blocks_freed = 3;
  entry.tokens_to_recompute = 40;
  entry.source = "10.0.0.2:50051";
  entry.detail = "pin not found";
  const nlohmann::json j = nlohmann::json::parse(RecomputeLogJson(entry));
  EXPECT_EQ(j.at("request_id"), "id-\xEF\xBF\xBD");
  EXPECT_EQ(j.at("cause"), "pin_gone");
  EXPECT_EQ(j.at("preempted"), false);
  EXPECT_EQ(j.at("blocks_freed"), 3);
  EXPECT_EQ(j.at("tokens_to_recompute"), 40);
  EXPECT_EQ(j.at("source"), "10.0.0.2:50051");
  EXPECT_EQ(j.at("detail"), "pin not found");
  EXPECT_FALSE(j.contains("needed_by"));
  EXPECT_FALSE(j.contains("mode"));  // not a preemption
}

TEST(RecomputeMetricsTest, DecodeWorkerLabelsPreemptionsAndRecomputesByCause) {
  WorkerMetrics metrics("decode", "m");
  metrics.CountRecompute("pin_gone");
  metrics.CountRecompute("pin_gone");
  metrics.CountRecompute("transfer_timeout");
  AsyncEngineStats stats;
  stats.counters.num_preemptions = 5;
  stats.counters.num_preemptions_waiting_head = 2;
  stats.counters.num_transfers_recomputed = 4;
  stats.counters.num_swa_replay_recomputes = 1;
  stats.counters.num_kvstore_swa_replay_recomputes = 3;
  const std::string text = metrics.Render(stats, {}, {});
  // Every recompute by the cause of its log line: the engine's and the transfer reasons.
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_recomputes_total counter\n"
                              "sluice_recomputes_total{cause=\"out_of_kv_blocks\"} 3\n"
                              "sluice_recomputes_total{cause=\"waiting_head_blocked\"} 2\n"
                              "sluice_recomputes_total{cause=\"swa_replay_failed\"} 1\n"
                              "sluice_recomputes_total{cause=\"kvstore_swa_replay_failed\"} 3\n"
                              "sluice_recomputes_total{cause=\"pin_gone\"} 2\n"
                              "sluice_recomputes_total{cause=\"ack_failed\"} 0\n"
                              "sluice_recomputes_total{cause=\"transfer_timeout\"} 1\n"
                              "sluice_recomputes_total{cause=\"reservation_expired\"} 0\n"
                              "sluice_recomputes_total{cause=\"transfer_failed\"} 0\n"
                              "sluice_recomputes_total{cause=\"staging_copy_failed\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_preemptions_total counter\n"
                              "sluice_preemptions_total{cause=\"out_of_kv_blocks\"} 3\n"
                              "sluice_preemptions_total{cause=\"waiting_head_blocked\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sluice_decode_recomputes_total{reason=\"pin_gone\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sluice_decode_recomputes_total{reason=\"transfer_timeout\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("sluice_decode_recomputes_total{reason=\"ack_failed\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("sluice_decode_recomputes_total{reason=\"swa_replay_failed\"} 1\n"));
  // Every transfer recompute has a reason: the reasons sum to the recomputed transfers.
  EXPECT_THAT(text, HasSubstr("sluice_decode_transfers_recomputed_total 4\n"));
  EXPECT_THAT(text, Not(HasSubstr("\nsluice_preemptions_total ")));  // no unlabelled sample
}

TEST(RecomputeMetricsTest, PrefillWorkerAndServeLabelPreemptions) {
  WorkerMetrics prefill("prefill", "m");
  AsyncEngineStats stats;
  stats.counters.num_preemptions = 1;
  const std::string worker = prefill.Render(stats, {}, {});
  EXPECT_THAT(worker, HasSubstr("sluice_preemptions_total{cause=\"out_of_kv_blocks\"} 1\n"
                                "sluice_preemptions_total{cause=\"waiting_head_blocked\"} 0\n"));
  EXPECT_THAT(worker, Not(HasSubstr("sluice_decode_recomputes_total")));
  // A prefill worker's kvstore loads replay too: their failures have their cause; no transfer
  // reasons (a prefill worker receives no transfers).
  EXPECT_THAT(worker, HasSubstr("sluice_recomputes_total{cause=\"out_of_kv_blocks\"} 1\n"));
  EXPECT_THAT(worker,
              HasSubstr("sluice_recomputes_total{cause=\"kvstore_swa_replay_failed\"} 0\n"));
  EXPECT_THAT(worker, Not(HasSubstr("sluice_recomputes_total{cause=\"pin_gone\"}")));

  ApiMetrics api;
  BackendStats backend;
  backend.num_preemptions_total = 7;
  backend.num_preemptions_waiting_head_total = 1;
  backend.num_kvstore_swa_replay_recomputes_total = 2;
  const std::string serve = api.Render(backend);
  EXPECT_THAT(serve, HasSubstr("sluice_preemptions_total{cause=\"out_of_kv_blocks\"} 6\n"
                               "sluice_preemptions_total{cause=\"waiting_head_blocked\"} 1\n"));
  EXPECT_THAT(serve, HasSubstr("sluice_recomputes_total{cause=\"out_of_kv_blocks\"} 6\n"
                               "sluice_recomputes_total{cause=\"waiting_head_blocked\"} 1\n"
                               "sluice_recomputes_total{cause=\"swa_replay_failed\"} 0\n"
                               "sluice_recomputes_total{cause=\"kvstore_swa_replay_failed\"} 2\n"
                               "# HELP"));
}

}  // namespace
}  // namespace sluice
