// LLMEngine and Scheduler tests on a fake model (tests/util/fake_models.h) whose output depends
// on every token stored in the paged KV cache, so wrong block tables, slot mappings, chunk boundaries or a bad recompute
// after preemption change the generated tokens.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/model/model.h"
#include "engine/sched/async_engine.h"
#include "engine/sched/llm_engine.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

using testing::ChecksumModel;
using testing::GreedyRequest;
constexpr int64_t kVocab = ChecksumModel::kVocab;

std::vector<int32_t> Reference(std::vector<int32_t> tokens, int n) {
  return ChecksumModel::Reference(std::move(tokens), n);
}

std::vector<int32_t> Prompt(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + (i * 7 + salt * 13) % (kVocab - 3));
  return p;
}

struct EngineRun {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, FinishReason> finish;
  std::map<std::string, RequestOutput> last;
};

EngineRun Drain(LLMEngine& engine, int max_steps = 10000) {
  EngineRun run;
  for (int i = 0; i < max_steps && engine.HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : engine.Step()) {
      for (const SampledToken& t : out.new_tokens) run.tokens[out.request_id].push_back(t.token_id);
      if (out.finished()) {
        EXPECT_EQ(run.finish.count(out.request_id), 0u) << "finished twice: " << out.request_id;
        run.finish[out.request_id] = out.finish_reason;
        run.last[out.request_id] = out;
      }
    }
  }
  EXPECT_FALSE(engine.HasUnfinishedRequests());
  return run;
}

std::unique_ptr<LLMEngine> MakeEngine(const EngineOptions& options) {
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

TEST(LLMEngineTest, SingleRequestMatchesReference) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 128;
  auto engine = MakeEngine(options);
  ASSERT_TRUE(engine->AddRequest(GreedyRequest("a", Prompt(10, 0), 20)).ok());
  EngineRun run = Drain(*engine);
  EXPECT_EQ(run.tokens["a"], Reference(Prompt(10, 0), 20));
  EXPECT_EQ(run.finish["a"], FinishReason::kLength);
  EXPECT_EQ(run.last["a"].num_prompt_tokens, 10);
  EXPECT_EQ(run.last["a"].num_output_tokens, 20);
  EXPECT_EQ(engine->num_free_blocks(), 128);
}

// Queue time (RequestOutput::queue_seconds) and the timed step totals the planner fits: with
// one sequence at a time, the second request waits for the first to finish.
TEST(LLMEngineTest, ReportsQueueTimeAndStepTotals) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 128;
  options.max_num_seqs = 1;
  options.async_scheduling = false;
  auto engine = MakeEngine(options);
  ASSERT_TRUE(engine->AddRequest(GreedyRequest("a", Prompt(10, 0), 20)).ok());
  ASSERT_TRUE(engine->AddRequest(GreedyRequest("b", Prompt(10, 1), 20)).ok());
  std::map<std::string, std::vector<double>> queue;
  while (engine->HasUnfinishedRequests()) {
    for (const RequestOutput& out : engine->Step()) queue[out.request_id].push_back(out.queue_seconds);
  }
  for (const std::string id : {"a", "b"}) {
    ASSERT_EQ(queue[id].size(), 20u) << id;
    for (double q : queue[id]) EXPECT_EQ(q, queue[id].front()) << id;  // fixed once scheduled
    EXPECT_GE(queue[id].front(), 0.0) << id;
  }
  EXPECT_GT(queue["b"].front(), queue["a"].front());  // b waited for a's 20 steps
  const EngineCounters& c = engine->counters();
  EXPECT_EQ(c.prefill_steps.num_steps, 2);
  EXPECT_EQ(c.prefill_steps.num_tokens, 20);
  EXPECT_EQ(c.decode_steps.num_steps, 38);
  EXPECT_EQ(c.decode_steps.num_tokens, 38);
  EXPECT_GT(c.prefill_steps.seconds, 0.0);
  EXPECT_GT(c.decode_steps.seconds, 0.0);
}

// Many requests, small token budget (prefill split into chunks), few blocks (preemption and
// recompute): every request still produces exactly the reference tokens, and every block is
// free at the end.
TEST(LLMEngineTest, ChunkedPrefillAndPreemptionKeepOutputsExact) {
  for (int32_t budget : {3, 8, 64}) {
    EngineOptions options;
    options.block_size = 4;
    options.num_kv_blocks = 64;  // 256 tokens for 12 requests of up to 70 tokens each
    options.max_model_len = 256;
    options.max_num_batched_tokens = budget;
    options.max_num_seqs = 8;
    auto engine = MakeEngine(options);
    for (int i = 0; i < 12; ++i) {
      ASSERT_TRUE(engine->AddRequest(GreedyRequest(absl::StrCat("r", i), Prompt(5 + 3 * i, i), 30)).ok());
    }
    EngineRun run = Drain(*engine);
    for (int i = 0; i < 12; ++i) {
      const std::string id = absl::StrCat("r", i);
      EXPECT_EQ(run.tokens[id], Reference(Prompt(5 + 3 * i, i), 30)) << id << " budget " << budget;
      EXPECT_EQ(run.finish[id], FinishReason::kLength);
    }
    // With a large budget 8 sequences run at once and outgrow the 64 blocks.
    if (budget == 64) EXPECT_GT(engine->counters().num_preemptions, 0);
    EXPECT_EQ(engine->num_free_blocks(), 64);
    EXPECT_EQ(engine->num_running(), 0);
    EXPECT_EQ(engine->num_waiting(), 0);
  }
}

// Migration: a request resumed with the first k outputs of an undisturbed run continues with
// exactly the rest of them (greedy, and seeded sampling: the generator skips k draws); the
// resumed tokens are not emitted again and count toward max_tokens.
TEST(LLMEngineTest, ResumedRequestContinuesTheUndisturbedRun) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 128;
  for (bool seeded : {false, true}) {
    auto make = [&](const std::string& id) {
      EngineRequest r = GreedyRequest(id, Prompt(10, 4), 24);
      if (seeded) {
        r.sampling.temperature = 1.0f;
        r.sampling.seed = 1234;
      }
      return r;
    };
    auto whole_engine = MakeEngine(options);
    ASSERT_TRUE(whole_engine->AddRequest(make("whole")).ok());
    const std::vector<int32_t> whole = Drain(*whole_engine).tokens["whole"];
    ASSERT_EQ(whole.size(), 24u);
    for (int k : {1, 11, 23}) {
      auto engine = MakeEngine(options);
      EngineRequest resumed = make("resumed");
      resumed.resumed_output_token_ids.assign(whole.begin(), whole.begin() + k);
      ASSERT_TRUE(engine->AddRequest(resumed).ok());
      EngineRun run = Drain(*engine);
      EXPECT_EQ(run.tokens["resumed"], std::vector<int32_t>(whole.begin() + k, whole.end()))
          << "k " << k << " seeded " << seeded;
      EXPECT_EQ(run.finish["resumed"], FinishReason::kLength);
      EXPECT_EQ(run.last["resumed"].num_prompt_tokens, 10);
      EXPECT_EQ(run.last["resumed"].num_output_tokens, 24);
      EXPECT_EQ(engine->num_free_blocks(), 128);
    }
  }
  auto engine = MakeEngine(options);
  EngineRequest too_many = GreedyRequest("x", Prompt(10, 4), 3);
  too_many.resumed_output_token_ids = {5, 6, 7};
  EXPECT_TRUE(absl::IsInvalidArgument(engine->AddRequest(too_many)));
  EngineRequest bad_id = GreedyRequest("y", Prompt(10, 4), 8);
  bad_id.resumed_output_token_ids = {static_cast<int32_t>(kVocab)};
  EXPECT_TRUE(absl::IsInvalidArgument(engine->AddRequest(bad_id)));
}

TEST(LLMEngineTest, AbortFreesBlocksAndOthersContinue) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 100;
  auto engine = MakeEngine(options);
  ASSERT_TRUE(engine->AddRequest(GreedyRequest("keep", Prompt(9, 1), 25)).ok());
  ASSERT_TRUE(engine->AddRequest(GreedyRequest("drop", Prompt(9, 2), 25)).ok());
  for (int i = 0; i < 3; ++i) engine->Step();
  EXPECT_LT(engine->num_free_blocks(), 100);
  engine->AbortRequest("drop");
  engine->AbortRequest("unknown");  // ignored
  EngineRun run = Drain(*engine);
  EXPECT_EQ(run.finish["drop"], FinishReason::kAbort);
  EXPECT_EQ(run.finish.count("unknown"), 0u);
  EXPECT_EQ(run.tokens["keep"].size(), 22u);  // 3 tokens came before Drain
  EXPECT_EQ(run.finish["keep"], FinishReason::kLength);
  EXPECT_EQ(engine->num_free_blocks(), 100);
}

TEST(LLMEngineTest, StopTokenIdsEosAndMinTokens) {
  const std::vector<int32_t> ref = Reference(Prompt(6, 3), 30);
  EngineOptions options;
  options.block_size = 8;
  options.num_kv_blocks = 64;
  auto engine = MakeEngine(options);
  // Stop on the 5th reference token.
  EngineRequest stop = GreedyRequest("stop", Prompt(6, 3), 30);
  stop.sampling.stop_token_ids = {ref[4]};
  ASSERT_TRUE(engine->AddRequest(stop).ok());
  EngineRun run = Drain(*engine);
  const auto first = std::find(ref.begin(), ref.end(), ref[4]) - ref.begin();
  EXPECT_EQ(run.tokens["stop"], std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(run.finish["stop"], FinishReason::kStop);
}

TEST(LLMEngineTest, RejectsBadRequests) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 128;
  options.max_model_len = 100;
  auto engine = MakeEngine(options);
  EXPECT_EQ(engine->AddRequest(GreedyRequest("empty", {}, 4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->AddRequest(GreedyRequest("oov", {5, 64}, 4)).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status too_long = engine->AddRequest(GreedyRequest("long", Prompt(90, 0), 20));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("maximum context length is 100"), std::string::npos)
      << too_long;
  ASSERT_TRUE(engine->AddRequest(GreedyRequest("dup", Prompt(4, 0), 4)).ok());
  EXPECT_EQ(engine->AddRequest(GreedyRequest("dup", Prompt(4, 0), 4)).code(),
            absl::StatusCode::kAlreadyExists);
  Drain(*engine);
}

TEST(LLMEngineTest, CreateRejectsCacheTooSmallForOneSequence) {
  EngineOptions options;
  options.block_size = 16;
  options.num_kv_blocks = 2;
  options.max_model_len = 64;
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LLMEngineTest, BatchInvariantModeNeedsAModelThatIs) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 64;
  options.batch_invariant = true;
  // The fake model does not declare Model::IsBatchInvariant (as the CUDA runners do not).
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(engine.status().message().find("batch-invariant"), std::string::npos)
      << engine.status();
}

TEST(AsyncEngineTest, DeliversEveryRequestOnceAndFrees) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 48;
  options.max_model_len = 128;
  options.max_num_batched_tokens = 16;
  auto engine = MakeEngine(options);
  AsyncEngine async(std::move(engine));
  std::mutex mu;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, FinishReason> finish;
  std::condition_variable cv;
  constexpr int kRequests = 20;
  for (int i = 0; i < kRequests; ++i) {
    const std::string id = absl::StrCat("q", i);
    // q19 asks for many tokens and is aborted from its first output, so the abort is
    // processed (before the next step) while it is certainly still running.
    ASSERT_TRUE(async
                    .Submit(GreedyRequest(id, Prompt(4 + i, i), i == 19 ? 100 : 12),
                            [&, id](const RequestOutput& out) {
                              if (id == "q19" && out.num_output_tokens == 1) async.Abort(id);
                              std::lock_guard<std::mutex> lock(mu);
                              for (const auto& t : out.new_tokens) tokens[id].push_back(t.token_id);
                              if (out.finished()) {
                                finish[id] = out.finish_reason;
                                cv.notify_all();
                              }
                            })
                    .ok());
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30),
                          [&] { return finish.size() == static_cast<size_t>(kRequests); }));
  for (int i = 0; i < 19; ++i) {
    const std::string id = absl::StrCat("q", i);
    EXPECT_EQ(tokens[id], Reference(Prompt(4 + i, i), 12)) << id;
  }
  EXPECT_EQ(finish["q19"], FinishReason::kAbort);
  EXPECT_EQ(tokens["q19"].size(), 1u);
  lock.unlock();
  // Stats are published after the step that finished the last request.
  for (int i = 0; i < 100 && async.Stats().num_free_blocks != 48; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(async.Stats().num_free_blocks, 48);
  EXPECT_EQ(async.Submit(GreedyRequest("bad", {}, 1), [](const RequestOutput&) {}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
