// LLMEngine's async scheduling (EngineOptions::async_scheduling, issue 5): with a model that
// supports asynchronous sampled steps, step N+1 is scheduled and enqueued before step N's
// tokens are read, its inputs referring to them as placeholders -(r + 1). Whatever the
// pipelining, every request's tokens, logprobs, finish reasons and cached-token counts must
// equal those of the synchronous engine on the same model; blocks must all come back.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "engine/model/model.h"
#include "engine/sched/async_engine.h"
#include "engine/sched/llm_engine.h"
#include "engine/spec/drafter.h"
#include "tests/unit/ranked_model.h"

namespace sluice {
namespace {

EngineRequest Request(const std::string& id, int salt, int max_tokens, int prompt_len = 9) {
  EngineRequest r;
  r.request_id = id;
  for (int i = 0; i < prompt_len; ++i) r.prompt_token_ids.push_back(2 + (i * 5 + salt * 11) % 60);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.logprobs = 0;
  return r;
}

struct Arrival {
  int step = 0;  // Step() calls made before it is added
  EngineRequest request;
};

struct GenRun {
  std::map<std::string, std::vector<SampledToken>> tokens;
  std::map<std::string, FinishReason> finish;
  std::map<std::string, int32_t> cached;  // num_cached_tokens of the last output
  int async_steps = 0, max_unread = 0, fed_back = 0, full_steps = 0, greedy_steps = 0;
  int sampled_rows = 0;
  int64_t preemptions = 0;
  int64_t spec_verifications = 0, spec_pipelined_steps = 0;
  bool blocks_back = false;
};

struct EngineSetup {
  int64_t num_kv_blocks = 256;
  int32_t max_num_batched_tokens = 512;
  bool prefix_caching = true;
  int32_t max_model_len = 0;
  // Step() call -> request to abort before it.
  std::map<int, std::string> aborts;
  std::shared_ptr<Drafter> drafter;  // speculative decoding with auto verification
};

GenRun Generate(bool async, const std::vector<Arrival>& arrivals, const EngineSetup& setup = {}) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = setup.num_kv_blocks;
  options.max_num_batched_tokens = setup.max_num_batched_tokens;
  options.enable_prefix_caching = setup.prefix_caching;
  options.async_scheduling = async;
  options.max_model_len = setup.max_model_len;
  options.speculative.drafter = setup.drafter;
  options.speculative.num_speculative_tokens = 3;
  options.speculative.verify = VerifyMode::kAuto;
  auto model = std::make_unique<RankedModel>(/*device_greedy=*/true, /*async=*/true);
  RankedModel* m = model.get();
  auto created = LLMEngine::Create(std::move(model), options);
  EXPECT_TRUE(created.ok()) << created.status();
  GenRun run;
  if (!created.ok()) return run;
  LLMEngine& engine = **created;
  size_t next = 0;
  for (int step = 0; step < 2000; ++step) {
    while (next < arrivals.size() && arrivals[next].step <= step) {
      EXPECT_TRUE(engine.AddRequest(arrivals[next].request).ok());
      ++next;
    }
    if (auto it = setup.aborts.find(step); it != setup.aborts.end()) engine.AbortRequest(it->second);
    if (next == arrivals.size() && !engine.HasUnfinishedRequests() && !engine.HasStepWork()) {
      break;
    }
    for (RequestOutput& out : engine.Step()) {
      EXPECT_TRUE(out.status.ok()) << out.request_id << ": " << out.status;
      for (SampledToken& t : out.new_tokens) run.tokens[out.request_id].push_back(std::move(t));
      run.cached[out.request_id] = out.num_cached_tokens;
      if (out.finished()) run.finish[out.request_id] = out.finish_reason;
    }
  }
  EXPECT_FALSE(engine.HasUnfinishedRequests());
  EXPECT_FALSE(engine.HasStepWork());
  run.async_steps = m->async_steps();
  run.max_unread = m->max_unread();
  run.fed_back = m->fed_back_tokens();
  run.sampled_rows = m->sampled_rows();
  run.full_steps = m->full_steps();
  run.greedy_steps = m->greedy_steps();
  run.preemptions = engine.counters().num_preemptions;
  run.spec_verifications = engine.counters().num_spec_verifications;
  run.spec_pipelined_steps = engine.counters().num_spec_pipelined_steps;
  run.blocks_back = engine.num_free_blocks() == engine.num_total_blocks();
  return run;
}

void ExpectSame(const GenRun& sync, const GenRun& async) {
  ASSERT_EQ(sync.tokens.size(), async.tokens.size());
  for (const auto& [id, want] : sync.tokens) {
    ASSERT_TRUE(async.tokens.contains(id)) << id;
    const std::vector<SampledToken>& got = async.tokens.at(id);
    ASSERT_EQ(got.size(), want.size()) << id;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].token_id, want[i].token_id) << id << " token " << i;
      EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-6) << id << " token " << i;
    }
  }
  EXPECT_EQ(sync.finish, async.finish);
  EXPECT_EQ(sync.cached, async.cached);
  EXPECT_TRUE(sync.blocks_back);
  EXPECT_TRUE(async.blocks_back);
}

std::vector<Arrival> Staggered(int n, int max_tokens_base) {
  std::vector<Arrival> arrivals;
  for (int i = 0; i < n; ++i) {
    EngineRequest r =
        Request("r" + std::to_string(i), i, max_tokens_base + (i * 7) % 13, 5 + (i * 3) % 11);
    r.sampling.ignore_eos = i % 2 == 0;  // the fake's EOS is frequent: keep half running
    arrivals.push_back({i / 3, r});
  }
  return arrivals;
}

TEST(AsyncSchedulingTest, PipelinedStepsEqualSynchronousSteps) {
  const std::vector<Arrival> arrivals = Staggered(12, 6);
  const GenRun sync = Generate(false, arrivals);
  const GenRun async = Generate(true, arrivals);
  ExpectSame(sync, async);
  // The synchronous engine never enqueues a step before reading the previous one.
  EXPECT_EQ(sync.async_steps, 0);
  EXPECT_GT(sync.greedy_steps, 0);
  // The async one does, feeding sampled tokens back without the host.
  EXPECT_EQ(async.full_steps + async.greedy_steps, 0);
  EXPECT_GE(async.async_steps, sync.greedy_steps);
  EXPECT_EQ(async.max_unread, Model::kMaxUnreadSteps);
  EXPECT_GT(async.fed_back, 50);
  // The fake's EOS really ends some requests early (their pipelined extra token is dropped).
  int stopped = 0;
  for (const auto& [id, reason] : sync.finish) stopped += reason == FinishReason::kStop ? 1 : 0;
  EXPECT_GT(stopped, 0);
  EXPECT_LT(stopped, 12);
}

TEST(AsyncSchedulingTest, PreemptionUnderTightKvCache) {
  // 24 blocks of 4 tokens: 12 requests of up to ~35 tokens cannot all stay resident.
  EngineSetup setup;
  setup.num_kv_blocks = 24;
  setup.max_num_batched_tokens = 16;  // chunked prefills interleave with decodes
  setup.max_model_len = 64;
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 12; ++i) {
    EngineRequest r = Request("p" + std::to_string(i), i, 14 + i % 5, 8 + i % 9);
    r.sampling.ignore_eos = true;
    arrivals.push_back({0, r});
  }
  const GenRun sync = Generate(false, arrivals, setup);
  const GenRun async = Generate(true, arrivals, setup);
  ExpectSame(sync, async);
  EXPECT_GT(sync.preemptions, 0);
  EXPECT_GT(async.preemptions, 0);
  EXPECT_GT(async.fed_back, 0);
}

TEST(AsyncSchedulingTest, HostSamplingRequestRunsSynchronouslyBesideOthers) {
  std::vector<Arrival> arrivals = Staggered(6, 8);
  EngineRequest penalized = Request("pen", 40, 9);
  penalized.sampling.presence_penalty = 0.7f;
  penalized.sampling.ignore_eos = true;
  arrivals.push_back({4, penalized});
  const GenRun sync = Generate(false, arrivals);
  const GenRun async = Generate(true, arrivals);
  ExpectSame(sync, async);
  // The steps the penalized request samples in ran on the host; the rest were pipelined.
  EXPECT_EQ(async.full_steps, 9);
  EXPECT_GT(async.async_steps, 0);
  EXPECT_EQ(async.tokens.at("pen").size(), 9u);
}

// Seeded temperature / top-k / top-p / min-p requests are sampled on the device in the async
// engine (kernels::SamplingRow carrying the request's keyed draw) and on the host in the
// synchronous one: the same tokens.
TEST(AsyncSchedulingTest, SeededSamplingOnDeviceEqualsHostSampling) {
  std::vector<Arrival> arrivals = Staggered(8, 10);
  const float temperatures[] = {0.7f, 1.0f, 1.3f, 0.9f};
  for (size_t i = 0; i < arrivals.size(); ++i) {
    SamplingParams& p = arrivals[i].request.sampling;
    p.temperature = temperatures[i % 4];
    p.seed = 1000 + static_cast<int64_t>(i);
    if (i % 4 == 1) p.top_k = 5;
    if (i % 4 == 2) p.top_p = 0.6f;
    if (i % 4 == 3) p.min_p = 0.3f;
    if (i == 7) p.temperature = 0.0f;  // a greedy row beside the sampled ones
  }
  const GenRun sync = Generate(false, arrivals);
  const GenRun async = Generate(true, arrivals);
  ExpectSame(sync, async);
  EXPECT_EQ(async.full_steps + async.greedy_steps, 0);  // every step went through the device
  EXPECT_GT(async.sampled_rows, 40);
  EXPECT_GT(sync.full_steps, 0);  // the host sampled them in the synchronous engine
  // The draws matter: the sampled requests do not all follow the greedy choice.
  const GenRun greedy = Generate(true, Staggered(8, 10));
  int differ = 0;
  for (int i = 0; i < 7; ++i) {
    const std::string id = "r" + std::to_string(i);
    differ += sync.tokens.at(id).front().token_id != greedy.tokens.at(id).front().token_id ||
              sync.tokens.at(id).size() != greedy.tokens.at(id).size();
  }
  EXPECT_GT(differ, 0);
}

// A seeded request's tokens depend only on its own (seed, choice, position) draws: alone, in
// batches of other seeded and unseeded requests arriving at various steps, pipelined or not,
// with chunked prefill and with preemption, it samples the same tokens.
TEST(AsyncSchedulingTest, SeededRequestSamplesTheSameAloneOrInAnyBatch) {
  EngineRequest target = Request("target", 3, 20, 11);
  target.sampling.temperature = 1.5f;
  target.sampling.top_k = 20;
  target.sampling.seed = 77;
  target.sampling.ignore_eos = true;
  const GenRun alone = Generate(false, {{0, target}});
  const std::vector<SampledToken>& want = alone.tokens.at("target");
  ASSERT_EQ(want.size(), 20u);
  EngineRequest other_choice = target;  // the same seed, another choice: other draws
  other_choice.sampling.choice_index = 1;
  const GenRun second = Generate(false, {{0, other_choice}});
  int differ = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    differ += second.tokens.at("target")[i].token_id != want[i].token_id;
  }
  EXPECT_GT(differ, 0);

  struct Case {
    int others;
    int target_step;
    bool async;
    EngineSetup setup;
    bool preempts = false;
  };
  EngineSetup chunked;
  chunked.max_num_batched_tokens = 5;
  EngineSetup tight;  // 24 blocks of 4 tokens for up to 13 sequences of ~35 tokens: preemption
  tight.num_kv_blocks = 24;
  tight.max_num_batched_tokens = 16;
  tight.max_model_len = 64;
  const Case cases[] = {{1, 0, false, {}},   {7, 2, false, {}}, {7, 2, true, {}},
                        {12, 1, true, {}},   {5, 0, false, chunked}, {5, 3, true, chunked},
                        {12, 0, false, tight, true}, {12, 0, true, tight, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.others << " others, target at step " << c.target_step
                                    << (c.async ? ", async" : ", sync"));
    std::vector<Arrival> arrivals;
    for (int i = 0; i < c.others; ++i) {
      EngineRequest r = Request("o" + std::to_string(i), 10 + i, 12 + i % 7, 6 + (i * 5) % 13);
      r.sampling.temperature = i % 3 == 0 ? 0.0f : 1.0f;
      if (i % 3 == 1) r.sampling.seed = 77;  // the target's seed, other prompts
      r.sampling.ignore_eos = i % 2 == 0;
      arrivals.push_back({i % 4, r});
    }
    arrivals.push_back({c.target_step, target});
    std::stable_sort(arrivals.begin(), arrivals.end(),
                     [](const Arrival& a, const Arrival& b) { return a.step < b.step; });
    const GenRun run = Generate(c.async, arrivals, c.setup);
    const std::vector<SampledToken>& got = run.tokens.at("target");
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].token_id, want[i].token_id) << "token " << i;
      // The async engine's logprob comes from the device sampler's reference, not SampleToken.
      EXPECT_NEAR(got[i].logprob, want[i].logprob, c.async ? 1e-6 : 0.0) << "token " << i;
    }
    if (c.preempts) EXPECT_GT(run.preemptions, 0);
    EXPECT_TRUE(run.blocks_back);
  }
}

// The step in flight ends a sequence (a stop id) that the next plan already holds, and that
// plan needs the host sampler (a penalized request joins): the in-flight step is read first and
// the finished sequence must leave the plan before it runs synchronously.
TEST(AsyncSchedulingTest, SequenceFinishedByTheStepInFlightLeavesASynchronousPlan) {
  EngineRequest a = Request("a", 5, 6);
  const GenRun probe = Generate(false, {{0, a}});
  ASSERT_FALSE(probe.tokens.at("a").empty());
  a.sampling.stop_token_ids = {probe.tokens.at("a")[0].token_id};  // stops at its first token
  EngineRequest b = Request("b", 9, 5);
  b.sampling.presence_penalty = 0.5f;
  b.sampling.ignore_eos = true;
  // "b" arrives after the first Step(), which enqueued "a"'s prefill asynchronously.
  const std::vector<Arrival> arrivals = {{0, a}, {1, b}};
  const GenRun sync = Generate(false, arrivals);
  const GenRun async = Generate(true, arrivals);
  ExpectSame(sync, async);
  ASSERT_EQ(async.tokens.at("a").size(), 1u);
  EXPECT_EQ(async.finish.at("a"), FinishReason::kStop);
  EXPECT_EQ(async.tokens.at("b").size(), 5u);
  EXPECT_GE(async.async_steps, 1);
  EXPECT_EQ(async.full_steps, 5);
}

TEST(AsyncSchedulingTest, AbortWhileInFlightLeavesOthersAndFreesBlocks) {
  EngineSetup setup;
  setup.aborts = {{3, "r1"}, {6, "r4"}, {7, "r5"}};
  std::vector<Arrival> arrivals = Staggered(8, 20);
  for (Arrival& a : arrivals) a.request.sampling.ignore_eos = true;
  const GenRun sync = Generate(false, arrivals, setup);
  const GenRun async = Generate(true, arrivals, setup);
  for (const char* id : {"r1", "r4", "r5"}) {
    EXPECT_EQ(async.finish.at(id), FinishReason::kAbort) << id;
    EXPECT_EQ(sync.finish.at(id), FinishReason::kAbort) << id;
  }
  // The others are untouched by the aborts and equal the synchronous run.
  for (const char* id : {"r0", "r2", "r3", "r6", "r7"}) {
    ASSERT_TRUE(async.tokens.contains(id));
    ASSERT_EQ(async.tokens.at(id).size(), sync.tokens.at(id).size()) << id;
    for (size_t i = 0; i < sync.tokens.at(id).size(); ++i) {
      EXPECT_EQ(async.tokens.at(id)[i].token_id, sync.tokens.at(id)[i].token_id) << id << i;
    }
    EXPECT_EQ(async.finish.at(id), FinishReason::kLength) << id;
  }
  EXPECT_TRUE(async.blocks_back);
}

// SlowDrafter proposes three wrong-ish tokens per sequence with high confidence and takes 2 ms
// a round: speculation costs more than it can gain against the fake's microsecond steps.
class SlowDrafter final : public Drafter {
 public:
  std::string_view method() const override { return "slow"; }
  absl::Status Propose(absl::Span<const DraftInput> inputs, const DraftContinue& keep_going,
                       std::vector<DraftOutput>* outputs) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ++rounds;
    outputs->assign(inputs.size(), DraftOutput{});
    for (size_t i = 0; i < inputs.size(); ++i) {
      int32_t token = inputs[i].token_ids.back();
      for (int32_t j = 0; j < inputs[i].max_draft_tokens; ++j) {
        token = 2 + (token * 5 + 3) % 60;
        (*outputs)[i].tokens.push_back(token);
        (*outputs)[i].confidence.push_back(0.9f);
        if (keep_going && !keep_going(i, j, 0.9f)) break;
      }
    }
    return absl::OkStatus();
  }
  int rounds = 0;
};

// Auto verification on a model with asynchronous steps measures speculative steps (synchronous)
// against plain pipelined ones and runs the faster (SpeculationRegime): with a drafter that
// costs more than it gains, most steps run pipelined, speculation is retried now and then, and
// every switch (draining the pipeline to draft again) keeps the greedy output exact.
TEST(AsyncSchedulingTest, AutoVerificationRunsPipelinedStepsWhenSpeculationDoesNotPay) {
  std::vector<Arrival> arrivals = Staggered(6, 90);
  for (Arrival& a : arrivals) a.request.sampling.ignore_eos = true;
  const GenRun plain = Generate(true, arrivals);
  EngineSetup setup;
  auto drafter = std::make_shared<SlowDrafter>();
  setup.drafter = drafter;
  const GenRun spec = Generate(true, arrivals, setup);
  ExpectSame(plain, spec);
  EXPECT_GT(spec.spec_verifications, 0);  // the measured speculative steps verified drafts
  EXPECT_GT(spec.spec_pipelined_steps, 40);
  EXPECT_GT(spec.async_steps, 40);
  // Speculation ran in its first measurement and in retries only: far fewer rounds than steps.
  EXPECT_GT(drafter->rounds, 0);
  EXPECT_LT(drafter->rounds, spec.spec_pipelined_steps);
  // Without async scheduling there is nothing to weigh: every step speculates.
  const GenRun sync_spec = Generate(false, arrivals, setup);
  ExpectSame(plain, sync_spec);
  EXPECT_EQ(sync_spec.spec_pipelined_steps, 0);
  EXPECT_EQ(sync_spec.async_steps, 0);
}

// A sequence that a read step shows finished (EOS) frees its blocks while the next step, which
// computes one token for it for nothing, is still in flight and writes one of them. A transfer
// reservation waiting for blocks gets them at that moment; its writer (another process's KV
// push or this worker's pull) is not ordered after that step on the device, so the blocks may
// be announced only once no unread step writes any of them (GPU finding: sluice-mini-moe push
// mode, 21 of 200 concurrent requests differed).
TEST(AsyncSchedulingTest, ReservedBlocksAreAnnouncedOnceNoStepInFlightWritesThem) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 12;  // two generating requests fill it: reservations wait for frees
  options.max_model_len = 48;
  options.max_num_batched_tokens = 512;
  options.enable_prefix_caching = false;
  options.async_scheduling = true;
  auto model = std::make_unique<RankedModel>(/*device_greedy=*/true, /*async=*/true);
  RankedModel* m = model.get();
  auto created = LLMEngine::Create(std::move(model), options);
  ASSERT_TRUE(created.ok()) << created.status();
  AsyncEngine engine(*std::move(created));

  constexpr int kGenerations = 16;
  constexpr int kReservations = 24;
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0, eos = 0, announced = 0, written_in_flight = 0, failed = 0;
  for (int i = 0; i < kGenerations; ++i) {
    ASSERT_TRUE(engine
                    .Submit(Request("g" + std::to_string(i), i, 16),
                            [&](const RequestOutput& out) {
                              if (!out.finished()) return;
                              std::lock_guard<std::mutex> lock(mu);
                              ++finished;
                              eos += out.finish_reason == FinishReason::kStop ? 1 : 0;
                              cv.notify_all();
                            })
                    .ok());
  }
  for (int i = 0; i < kReservations; ++i) {
    const std::string id = "t" + std::to_string(i);
    engine.ReserveForTransfer(
        Request(id, 100 + i, 4), std::nullopt, absl::Now() + absl::Seconds(30),
        // The engine thread: the model's unread steps are those that may still be running.
        [&, id](absl::StatusOr<std::vector<int32_t>> blocks) {
          std::lock_guard<std::mutex> lock(mu);
          if (!blocks.ok()) {
            ++failed;
          } else {
            ++announced;
            written_in_flight += m->UnreadStepsWrite(*blocks) ? 1 : 0;
          }
          engine.Abort(id);  // the transfer never comes: the blocks go back for the next one
          cv.notify_all();
        },
        [](const RequestOutput&) {});
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] {
      return finished == kGenerations && announced + failed == kReservations;
    }));
  }
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(announced, kReservations);
  EXPECT_EQ(written_in_flight, 0);
  EXPECT_GT(eos, 0);  // sequences did end while a step computed one more token for them
  engine.Shutdown();
}

// Blocks committed to the prefix cache after pipelined steps hold the real tokens, never a
// placeholder: a later request whose prompt is an earlier request's prompt + output hits the
// cache exactly as in the synchronous engine.
TEST(AsyncSchedulingTest, PrefixCacheSeesRealTokens) {
  EngineRequest first = Request("first", 3, 23, 13);
  first.sampling.ignore_eos = true;  // 23 outputs: most full blocks hold generated tokens
  const GenRun sync0 = Generate(false, {{0, first}});
  ASSERT_TRUE(sync0.tokens.contains("first"));
  EngineRequest second = Request("second", 0, 6);
  second.prompt_token_ids = first.prompt_token_ids;
  for (const SampledToken& t : sync0.tokens.at("first")) {
    second.prompt_token_ids.push_back(t.token_id);
  }
  second.prompt_token_ids.push_back(7);
  // "second" arrives after "first" finished (first ends within 24 steps).
  const std::vector<Arrival> arrivals = {{0, first}, {40, second}};
  const GenRun sync = Generate(false, arrivals);
  const GenRun async = Generate(true, arrivals);
  ExpectSame(sync, async);
  const int full_blocks = static_cast<int>(second.prompt_token_ids.size() - 1) / 4;
  EXPECT_EQ(full_blocks, 9);
  EXPECT_GE(sync.cached.at("second"), 4 * (full_blocks - 1));
  EXPECT_EQ(async.cached.at("second"), sync.cached.at("second"));
}

TEST(AsyncSchedulingTest, OffWithoutModelSupport) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 64;
  auto model = std::make_unique<RankedModel>(/*device_greedy=*/true, /*async=*/false);
  RankedModel* m = model.get();
  auto engine = LLMEngine::Create(std::move(model), options);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->AddRequest(Request("a", 1, 5)).ok());
  int tokens = 0;
  for (int i = 0; i < 50 && (*engine)->HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : (*engine)->Step()) tokens += out.new_tokens.size();
  }
  EXPECT_GT(tokens, 0);
  EXPECT_EQ(m->async_steps(), 0);
  EXPECT_GT(m->greedy_steps(), 0);
}

}  // namespace
}  // namespace sluice
