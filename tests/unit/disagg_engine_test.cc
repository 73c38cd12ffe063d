// Disaggregation hooks of LLMEngine / AsyncEngine: prefill-held KV blocks (release, abort,
// timeout) and decode-side reservations completed by a KV transfer. The KV is moved by hand
// between two engines' caches (what transfer/ does over UCX); the fake ChecksumModel reads every
// cached token, so a wrong block or a recomputed/duplicated first token changes the output.
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/kv/kv_block_allocator.h"
#include "engine/sched/async_engine.h"
#include "engine/sched/llm_engine.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

using testing::ChecksumModel;

std::vector<int32_t> Prompt(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + (i * 7 + salt * 13) % (ChecksumModel::kVocab - 3));
  return p;
}

EngineRequest Greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                     bool hold = false) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.hold_kv_blocks = hold;
  return r;
}

std::unique_ptr<LLMEngine> MakeEngine(int64_t num_blocks, int64_t hold_ms = 30000,
                                      int64_t reserve_ms = 30000) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = num_blocks;
  options.max_model_len = 64;  // 16 blocks of 4 tokens hold one sequence
  options.max_num_batched_tokens = 16;  // forces chunked prefill for longer prompts
  options.kv_hold_timeout_ms = hold_ms;
  options.kv_reserve_timeout_ms = reserve_ms;
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

// Steps until `id` finishes; returns all its outputs.
std::vector<RequestOutput> RunUntilFinished(LLMEngine& engine, const std::string& id,
                                            std::vector<RequestOutput>* others = nullptr) {
  std::vector<RequestOutput> mine;
  for (int i = 0; i < 1000; ++i) {
    for (RequestOutput& out : engine.Step()) {
      if (out.request_id != id) {
        if (others != nullptr) others->push_back(out);
        continue;
      }
      mine.push_back(out);
      if (out.finished()) return mine;
    }
  }
  ADD_FAILURE() << "request " << id << " did not finish";
  return mine;
}

// Copies the prompt's KV blocks (k(0): one float per token) from `src` to `dst`.
void CopyBlocks(LLMEngine& src, const std::vector<int32_t>& src_blocks, LLMEngine& dst,
                const std::vector<int32_t>& dst_blocks, int64_t num_prompt_tokens) {
  const int64_t bs = src.block_size();
  const int64_t n = NumBlocksFor(num_prompt_tokens, bs);
  ASSERT_EQ(static_cast<int64_t>(src_blocks.size()), n);
  ASSERT_GE(static_cast<int64_t>(dst_blocks.size()), n);
  for (int64_t b = 0; b < n; ++b) {
    std::memcpy(dst.kv_cache().k(0) + dst_blocks[b] * bs, src.kv_cache().k(0) + src_blocks[b] * bs,
                bs * sizeof(float));
  }
}

TEST(DisaggEngineTest, PrefillHoldsPromptBlocksUntilRelease) {
  auto engine = MakeEngine(32);
  const std::vector<int32_t> prompt = Prompt(37, 1);  // 3 prefill chunks of <= 16 tokens
  ASSERT_TRUE(engine->AddRequest(Greedy("p", prompt, 8, /*hold=*/true)).ok());
  std::vector<RequestOutput> outs = RunUntilFinished(*engine, "p");
  ASSERT_EQ(outs.size(), 1u);
  const RequestOutput& last = outs.back();
  EXPECT_TRUE(last.kv_held);
  EXPECT_EQ(last.finish_reason, FinishReason::kNone);
  ASSERT_EQ(last.new_tokens.size(), 1u);
  EXPECT_EQ(last.new_tokens[0].token_id, ChecksumModel::Reference(prompt, 1)[0]);
  // log_softmax of one logit 10 among 63 zeros.
  EXPECT_NEAR(last.new_tokens[0].logprob, -std::log1p(63.0 * std::exp(-10.0)), 1e-6);
  EXPECT_EQ(last.num_prompt_tokens, 37);
  EXPECT_EQ(last.held_block_ids.size(), 10u);  // ceil(37 / 4)
  EXPECT_EQ(engine->num_free_blocks(), 22);
  EXPECT_EQ(engine->num_held_blocks(), 10);
  EXPECT_FALSE(engine->HasUnfinishedRequests());
  EXPECT_TRUE(engine->HasPendingTimers());
  // The held id cannot be reused while pinned.
  EXPECT_EQ(engine->AddRequest(Greedy("p", prompt, 8)).code(), absl::StatusCode::kAlreadyExists);

  ASSERT_TRUE(engine->ReleaseHeldBlocks("p").ok());
  EXPECT_EQ(engine->num_free_blocks(), 32);
  EXPECT_EQ(engine->num_held_blocks(), 0);
  EXPECT_EQ(engine->ReleaseHeldBlocks("p").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine->counters().num_held_released, 1);
  EXPECT_FALSE(engine->HasPendingTimers());
}

TEST(DisaggEngineTest, FirstTokenThatEndsTheRequestHoldsNothing) {
  auto engine = MakeEngine(32);
  ASSERT_TRUE(engine->AddRequest(Greedy("one", Prompt(9, 2), 1, /*hold=*/true)).ok());
  std::vector<RequestOutput> outs = RunUntilFinished(*engine, "one");
  EXPECT_FALSE(outs.back().kv_held);
  EXPECT_EQ(outs.back().finish_reason, FinishReason::kLength);
  EXPECT_TRUE(outs.back().held_block_ids.empty());
  EXPECT_EQ(engine->num_free_blocks(), 32);
}

TEST(DisaggEngineTest, HeldBlocksFreedByAbortAndByTimeout) {
  auto engine = MakeEngine(32, /*hold_ms=*/30);
  ASSERT_TRUE(engine->AddRequest(Greedy("a", Prompt(8, 3), 4, true)).ok());
  ASSERT_TRUE(engine->AddRequest(Greedy("b", Prompt(12, 4), 4, true)).ok());
  RunUntilFinished(*engine, "a");
  RunUntilFinished(*engine, "b");
  EXPECT_EQ(engine->num_held_blocks(), 2 + 3);
  engine->AbortRequest("a");  // frees at once: no output, the request already finished
  EXPECT_EQ(engine->num_held_blocks(), 3);
  EXPECT_EQ(engine->num_free_blocks(), 29);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_TRUE(engine->Step().empty());
  EXPECT_EQ(engine->num_held_blocks(), 0);
  EXPECT_EQ(engine->num_free_blocks(), 32);
  EXPECT_EQ(engine->counters().num_held_expired, 1);
  EXPECT_EQ(engine->counters().num_held_released, 1);
}

// Prefill on one engine, move the KV, decode on another: the same tokens as one engine, the
// first token reported once (by prefill), never recomputed.
TEST(DisaggEngineTest, ReserveAndCompleteTransferMatchesSingleEngineRun) {
  for (int len : {1, 4, 5, 16, 37}) {
    SCOPED_TRACE(len);
    const std::vector<int32_t> prompt = Prompt(len, len);
    const int max_tokens = 12;
    const std::vector<int32_t> expected = ChecksumModel::Reference(prompt, max_tokens);

    auto prefill = MakeEngine(64);
    auto decode = MakeEngine(64);
    // Other traffic on the decode engine, so its block ids differ from prefill's.
    ASSERT_TRUE(decode->AddRequest(Greedy("other", Prompt(9, 77), 20)).ok());
    std::vector<RequestOutput> other_outs = decode->Step();

    // The router reserves on decode while prefill runs: first token not known yet.
    auto reserved = decode->ReserveForTransfer(Greedy("r", prompt, max_tokens), std::nullopt);
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    EXPECT_EQ(static_cast<int64_t>(reserved->size()), NumBlocksFor(len + 1, 4));
    EXPECT_EQ(decode->num_reserved(), 1);
    EXPECT_EQ(decode->num_free_blocks(), 64 - 3 - NumBlocksFor(len + 1, 4));

    ASSERT_TRUE(prefill->AddRequest(Greedy("r", prompt, max_tokens, true)).ok());
    std::vector<RequestOutput> pre = RunUntilFinished(*prefill, "r");
    ASSERT_TRUE(pre.back().kv_held);
    const SampledToken first = pre.back().new_tokens.at(0);
    EXPECT_EQ(first.token_id, expected[0]);

    // While reserved the sequence is never scheduled.
    for (int i = 0; i < 3; ++i) {
      for (RequestOutput& o : decode->Step()) {
        EXPECT_NE(o.request_id, "r");
        other_outs.push_back(o);
      }
    }
    CopyBlocks(*prefill, pre.back().held_block_ids, *decode, *reserved, len);
    ASSERT_TRUE(prefill->ReleaseHeldBlocks("r").ok());
    EXPECT_EQ(prefill->num_free_blocks(), 64);
    ASSERT_TRUE(decode->CompleteTransfer("r", absl::OkStatus(), first).ok());
    EXPECT_EQ(decode->num_reserved(), 0);

    std::vector<RequestOutput> outs = RunUntilFinished(*decode, "r", &other_outs);
    std::vector<int32_t> tokens = {first.token_id};
    for (const RequestOutput& o : outs) {
      for (const SampledToken& t : o.new_tokens) tokens.push_back(t.token_id);
    }
    EXPECT_EQ(tokens, expected);
    EXPECT_EQ(outs.back().finish_reason, FinishReason::kLength);
    EXPECT_EQ(outs.back().num_output_tokens, max_tokens);
    EXPECT_EQ(outs.front().num_output_tokens, 2);  // the first output is the second token
    // Only the reserved slot for the first token and later ones were computed on decode.
    EXPECT_EQ(decode->counters().num_generation_tokens,
              static_cast<int64_t>(other_outs.size()) + max_tokens - 1);
    decode->AbortRequest("other");
    RunUntilFinished(*decode, "other");
    EXPECT_EQ(decode->num_free_blocks(), 64);
  }
}

// The KV source died (or was too slow) after the first token went out: decode recomputes the
// prompt itself (the reserved blocks were never written, so reading them would change the
// fake model's output) and continues from the known first token.
TEST(DisaggEngineTest, FailedTransferWithKnownFirstTokenRecomputesThePrompt) {
  for (absl::Status failure : {absl::UnavailableError("KV transfer peer failed or is unreachable"),
                               absl::DeadlineExceededError("transfer too slow")}) {
    SCOPED_TRACE(failure.ToString());
    const std::vector<int32_t> prompt = Prompt(37, 5);
    const int max_tokens = 10;
    const std::vector<int32_t> expected = ChecksumModel::Reference(prompt, max_tokens);
    auto decode = MakeEngine(64);
    ASSERT_TRUE(decode->ReserveForTransfer(Greedy("r", prompt, max_tokens), std::nullopt).ok());
    const SampledToken first{expected[0], -0.5f, {}};
    ASSERT_TRUE(decode->CompleteTransfer("r", failure, first).ok());
    EXPECT_EQ(decode->num_reserved(), 0);
    std::vector<RequestOutput> outs = RunUntilFinished(*decode, "r");
    std::vector<int32_t> tokens = {first.token_id};
    for (const RequestOutput& o : outs) {
      EXPECT_TRUE(o.status.ok()) << o.status;
      for (const SampledToken& t : o.new_tokens) tokens.push_back(t.token_id);
    }
    EXPECT_EQ(tokens, expected);  // the first token is not emitted again
    EXPECT_EQ(outs.back().finish_reason, FinishReason::kLength);
    EXPECT_EQ(outs.back().num_output_tokens, max_tokens);
    const EngineCounters& c = decode->counters();
    EXPECT_EQ(c.num_transfers_recomputed, 1);
    EXPECT_EQ(c.num_transfers_failed, 0);
    EXPECT_EQ(c.num_transfers_completed, 0);
    // The prompt plus the first token's position were computed here.
    EXPECT_EQ(c.num_prompt_tokens_computed, 37);
    EXPECT_EQ(decode->num_free_blocks(), 64);
  }
}

// The KV cache holds exactly one max-length sequence. A (running) fills 6 of 8 blocks, W's
// transfer reserves the other 2 and completes; in that step A needs a 7th block, preempts itself
// and goes to the front of the waiting queue, ahead of W, which holds its 2 blocks. A can never
// fit while W waits behind it. W runs on its transferred KV (it needs no block more) rather than
// being preempted and recomputing KV that arrived intact; once it finishes, A goes on.
TEST(DisaggEngineTest, WaitingTransferHoldingBlocksDoesNotStallThePreemptedHead) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 8;
  options.max_model_len = 32;
  options.max_num_batched_tokens = 16;
  std::vector<RecomputeEvent> recomputes;
  options.on_recompute = [&](const RecomputeEvent& e) { recomputes.push_back(e); };
  auto created = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  ASSERT_TRUE(created.ok());
  LLMEngine& engine = **created;
  const std::vector<int32_t> a_prompt = Prompt(4, 1);
  const std::vector<int32_t> w_prompt = Prompt(4, 2);
  ASSERT_TRUE(engine.AddRequest(Greedy("a", a_prompt, 28)).ok());
  std::vector<int32_t> a_tokens;
  while (a_tokens.size() < 20) {  // A: 4 + 20 tokens = 6 full blocks
    for (const RequestOutput& o : engine.Step()) {
      for (const SampledToken& t : o.new_tokens) a_tokens.push_back(t.token_id);
    }
  }
  ASSERT_EQ(a_tokens.size(), 20u);
  ASSERT_EQ(engine.num_free_blocks(), 2);
  const std::vector<int32_t> w_expected = ChecksumModel::Reference(w_prompt, 4);
  auto reserved = engine.ReserveForTransfer(Greedy("w", w_prompt, 4), std::nullopt);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(engine.num_free_blocks(), 0);
  // W's prompt KV from a prefill engine into its reserved blocks.
  auto prefill = MakeEngine(32);
  ASSERT_TRUE(prefill->AddRequest(Greedy("w", w_prompt, 4, /*hold=*/true)).ok());
  const std::vector<RequestOutput> pre = RunUntilFinished(*prefill, "w");
  ASSERT_TRUE(pre.back().kv_held);
  ASSERT_EQ(pre.back().new_tokens.at(0).token_id, w_expected[0]);
  CopyBlocks(*prefill, pre.back().held_block_ids, engine, *reserved, 4);
  // One more step of A alone (W is only reserved): A now needs a 7th block for its next token.
  for (const RequestOutput& o : engine.Step()) {
    for (const SampledToken& t : o.new_tokens) a_tokens.push_back(t.token_id);
  }
  ASSERT_EQ(a_tokens.size(), 21u);
  ASSERT_TRUE(engine.CompleteTransfer("w", absl::OkStatus(), pre.back().new_tokens.at(0)).ok());
  std::vector<RequestOutput> a_outs;
  std::vector<RequestOutput> w_outs = RunUntilFinished(engine, "w", &a_outs);
  // W finished on its transferred KV (nothing recomputed) before A took another step.
  std::vector<int32_t> w_tokens = {w_expected[0]};
  for (const RequestOutput& o : w_outs) {
    for (const SampledToken& t : o.new_tokens) w_tokens.push_back(t.token_id);
  }
  EXPECT_EQ(w_tokens, w_expected);
  EXPECT_EQ(engine.counters().num_preemptions, 1);  // A itself only
  EXPECT_EQ(engine.counters().num_preemptions_waiting_head, 0);
  // Reported as it happened: A gave its 6 blocks back for its own next token, and the 24
  // tokens it had computed (4 prompt + 20 outputs) are computed again.
  ASSERT_EQ(recomputes.size(), 1u);
  EXPECT_EQ(recomputes[0].request_id, "a");
  EXPECT_EQ(recomputes[0].cause, RecomputeCause::kOutOfKvBlocks);
  EXPECT_EQ(recomputes[0].num_blocks_freed, 6);
  EXPECT_EQ(recomputes[0].num_tokens_to_recompute, 24);
  EXPECT_EQ(recomputes[0].needed_by, "a");
  EXPECT_EQ(recomputes[0].detail, "");
  EXPECT_EQ(engine.counters().num_transfers_completed, 1);
  EXPECT_EQ(engine.counters().num_transfers_recomputed, 0);
  std::vector<RequestOutput> rest = RunUntilFinished(engine, "a");
  a_outs.insert(a_outs.end(), rest.begin(), rest.end());
  for (const RequestOutput& o : a_outs) {
    for (const SampledToken& t : o.new_tokens) a_tokens.push_back(t.token_id);
  }
  EXPECT_EQ(a_tokens, ChecksumModel::Reference(a_prompt, 28));
  EXPECT_EQ(engine.counters().num_preemptions, 1);
  EXPECT_EQ(engine.num_free_blocks(), 8);
}

TEST(DisaggEngineTest, FailedTransferFailsWhenRecomputeIsOffOrTheErrorIsNotTheSources) {
  struct Case {
    bool recompute;
    absl::Status failure;
    std::optional<SampledToken> first;
  };
  const std::vector<Case> cases = {
      {false, absl::UnavailableError("peer gone"), SampledToken{9}},
      {true, absl::FailedPreconditionError("KV transfer mode mismatch"), SampledToken{9}},
      {true, absl::CancelledError("client cancelled during the KV transfer"), SampledToken{9}},
      {true, absl::UnavailableError("peer gone"), std::nullopt},  // first token unknown
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.failure.ToString());
    EngineOptions options;
    options.block_size = 4;
    options.num_kv_blocks = 32;
    options.max_model_len = 64;
    options.recompute_failed_transfers = c.recompute;
    auto decode = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
    ASSERT_TRUE(decode.ok());
    ASSERT_TRUE((*decode)->ReserveForTransfer(Greedy("x", Prompt(9, 1), 4), std::nullopt).ok());
    ASSERT_TRUE((*decode)->CompleteTransfer("x", c.failure, c.first).ok());
    std::vector<RequestOutput> outs = RunUntilFinished(**decode, "x");
    ASSERT_EQ(outs.size(), 1u);
    EXPECT_EQ(outs[0].finish_reason, FinishReason::kError);
    EXPECT_EQ(outs[0].status, c.failure);
    EXPECT_EQ((*decode)->counters().num_transfers_failed, 1);
    EXPECT_EQ((*decode)->counters().num_transfers_recomputed, 0);
    EXPECT_EQ((*decode)->num_free_blocks(), 32);
  }
}

TEST(DisaggEngineTest, ReservationErrorsAbortAndTimeoutFreeBlocks) {
  auto decode = MakeEngine(16, 30000, /*reserve_ms=*/30);
  ASSERT_TRUE(decode->ReserveForTransfer(Greedy("x", Prompt(6, 1), 4), std::nullopt).ok());
  EXPECT_EQ(decode->num_free_blocks(), 14);
  // Not enough blocks (59 + 1 tokens need 15): nothing changes.
  auto big = decode->ReserveForTransfer(Greedy("big", Prompt(59, 1), 4), std::nullopt);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(decode->num_free_blocks(), 14);
  // Duplicate id and unknown id.
  EXPECT_EQ(decode->ReserveForTransfer(Greedy("x", Prompt(6, 1), 4), std::nullopt).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(decode->CompleteTransfer("nope", absl::OkStatus(), SampledToken{5}).code(),
            absl::StatusCode::kNotFound);
  // OK without a first token anywhere is refused and the reservation stays.
  EXPECT_EQ(decode->CompleteTransfer("x", absl::OkStatus(), std::nullopt).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode->num_reserved(), 1);
  // A failed transfer fails the request with its status and frees its blocks.
  ASSERT_TRUE(decode->CompleteTransfer("x", absl::UnavailableError("peer gone"), std::nullopt).ok());
  std::vector<RequestOutput> outs = RunUntilFinished(*decode, "x");
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].finish_reason, FinishReason::kError);
  EXPECT_EQ(outs[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(decode->num_free_blocks(), 16);
  // Abort while reserved.
  ASSERT_TRUE(decode->ReserveForTransfer(Greedy("y", Prompt(6, 1), 4), SampledToken{7}).ok());
  EXPECT_EQ(decode->num_free_blocks(), 14);
  decode->AbortRequest("y");
  outs = RunUntilFinished(*decode, "y");
  EXPECT_EQ(outs.back().finish_reason, FinishReason::kAbort);
  EXPECT_EQ(decode->num_free_blocks(), 16);
  // No CompleteTransfer within kv_reserve_timeout_ms.
  ASSERT_TRUE(decode->ReserveForTransfer(Greedy("z", Prompt(6, 1), 4), SampledToken{7}).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  outs = RunUntilFinished(*decode, "z");
  EXPECT_EQ(outs.back().finish_reason, FinishReason::kError);
  EXPECT_EQ(outs.back().status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(decode->num_free_blocks(), 16);
  EXPECT_EQ(decode->counters().num_transfers_failed, 3);
  EXPECT_FALSE(decode->HasUnfinishedRequests());
}

// The first token comes off the wire (PrefillResponse.first_token): one outside the vocabulary
// fails the request instead of reaching the model's embedding lookup (worker_request_fuzz's
// regression input `first-token-outside-vocab`), given at either call.
TEST(DisaggEngineTest, FirstTokenOutsideTheVocabularyFailsTheRequest) {
  auto decode = MakeEngine(16);
  for (int32_t bad : {int32_t{ChecksumModel::kVocab}, int32_t{-1}, int32_t{2147483647}}) {
    ASSERT_TRUE(decode->ReserveForTransfer(Greedy("a", Prompt(6, 1), 4), std::nullopt).ok());
    const absl::Status s = decode->CompleteTransfer("a", absl::OkStatus(), SampledToken{bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("outside the vocabulary"), std::string::npos) << s;
    std::vector<RequestOutput> outs = RunUntilFinished(*decode, "a");
    ASSERT_EQ(outs.size(), 1u);
    EXPECT_EQ(outs[0].finish_reason, FinishReason::kError);
    EXPECT_EQ(outs[0].status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(outs[0].new_tokens.empty());
    EXPECT_EQ(decode->num_free_blocks(), 16);
  }
  // Given with the reservation, and used by a recompute after a failed transfer.
  ASSERT_TRUE(decode->ReserveForTransfer(Greedy("b", Prompt(6, 1), 4), SampledToken{-5}).ok());
  EXPECT_EQ(decode->CompleteTransfer("b", absl::UnavailableError("peer gone"), std::nullopt).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunUntilFinished(*decode, "b").back().status.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode->num_free_blocks(), 16);
  EXPECT_FALSE(decode->HasUnfinishedRequests());
}

// The same flow through two AsyncEngines (thread-safe entry points, callbacks).
TEST(DisaggEngineTest, AsyncEngineShutdownEndsWhatIsInFlightBeforeItsOwnerGoes) {
  AsyncEngine decode(MakeEngine(64));
  std::mutex mu;
  std::condition_variable cv;
  bool reserved = false;
  std::vector<RequestOutput> outputs;
  decode.ReserveForTransfer(
      Greedy("waiting", Prompt(9, 1), 4), std::nullopt, absl::Now() + absl::Seconds(10),
      [&](absl::StatusOr<std::vector<int32_t>> blocks) {
        std::lock_guard<std::mutex> lock(mu);
        reserved = blocks.ok();
        cv.notify_all();
      },
      [&](const RequestOutput& out) {
        std::lock_guard<std::mutex> lock(mu);
        outputs.push_back(out);
      });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return reserved; }));
  }
  // The reservation waits for a transfer that never completes: Shutdown gives it its final
  // output now, on return, while whoever owns the callback still exists.
  decode.Shutdown();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(outputs[0].request_id, "waiting");
    EXPECT_EQ(outputs[0].finish_reason, FinishReason::kAbort);
    EXPECT_TRUE(outputs[0].finished());
  }
  decode.Shutdown();  // idempotent
  EXPECT_EQ(decode.Submit(Greedy("late", Prompt(5, 1), 2), [](const RequestOutput&) {}).code(),
            absl::StatusCode::kUnavailable);
}

TEST(DisaggEngineTest, AsyncEnginesPrefillReserveTransferDecode) {
  AsyncEngine prefill(MakeEngine(64));
  AsyncEngine decode(MakeEngine(64));
  const std::vector<int32_t> prompt = Prompt(21, 5);
  const std::vector<int32_t> expected = ChecksumModel::Reference(prompt, 10);

  std::mutex mu;
  std::condition_variable cv;
  std::optional<RequestOutput> prefill_last;
  std::optional<absl::StatusOr<std::vector<int32_t>>> reserved;
  std::vector<int32_t> decoded;
  bool decode_done = false;
  std::optional<absl::Status> released, released_again;

  decode.ReserveForTransfer(
      Greedy("q", prompt, 10), std::nullopt, absl::Now() + absl::Seconds(10),
      [&](absl::StatusOr<std::vector<int32_t>> blocks) {
        std::lock_guard<std::mutex> lock(mu);
        reserved = std::move(blocks);
        cv.notify_all();
      },
      [&](const RequestOutput& out) {
        std::lock_guard<std::mutex> lock(mu);
        for (const SampledToken& t : out.new_tokens) decoded.push_back(t.token_id);
        if (out.finished()) decode_done = true;
        cv.notify_all();
      });
  ASSERT_TRUE(prefill
                  .Submit(Greedy("q", prompt, 10, true),
                          [&](const RequestOutput& out) {
                            std::lock_guard<std::mutex> lock(mu);
                            if (out.finished()) prefill_last = out;
                            cv.notify_all();
                          })
                  .ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10),
                            [&] { return prefill_last.has_value() && reserved.has_value(); }));
  }
  ASSERT_TRUE(reserved->ok()) << reserved->status();
  // Stats are published before the reservation callback: a caller that reads them next (the
  // worker's /metrics) sees the blocks taken, without waiting for a loop iteration.
  EXPECT_EQ(decode.Stats().num_free_blocks, 64 - static_cast<int64_t>(reserved->value().size()));
  EXPECT_EQ(decode.Stats().num_reserved, 1);
  ASSERT_TRUE(prefill_last->kv_held);
  // Stats are published after the step whose callback fired: wait for them.
  for (int i = 0; i < 200 && prefill.Stats().num_held_blocks != 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(prefill.Stats().num_held_blocks, 6);
  // Copy while neither engine touches these blocks (held / reserved).
  const int64_t bs = 4;
  for (size_t b = 0; b < prefill_last->held_block_ids.size(); ++b) {
    std::memcpy(decode.kv_cache().k(0) + (**reserved)[b] * bs,
                prefill.kv_cache().k(0) + prefill_last->held_block_ids[b] * bs,
                bs * sizeof(float));
  }
  prefill.ReleaseHeldBlocks("q", [&](absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    released = s;
    cv.notify_all();
  });
  decode.CompleteTransfer("q", absl::OkStatus(), prefill_last->new_tokens.at(0));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10),
                            [&] { return decode_done && released.has_value(); }));
  }
  EXPECT_TRUE(released->ok());
  prefill.ReleaseHeldBlocks("q", [&](absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    released_again = s;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10),
                            [&] { return released_again.has_value(); }));
  }
  EXPECT_EQ(released_again->code(), absl::StatusCode::kNotFound);
  std::vector<int32_t> tokens = {prefill_last->new_tokens[0].token_id};
  tokens.insert(tokens.end(), decoded.begin(), decoded.end());
  EXPECT_EQ(tokens, expected);
  // Stats are published after each loop iteration; give the loops a moment.
  for (int i = 0; i < 100 && (decode.Stats().num_free_blocks != 64 ||
                              prefill.Stats().num_free_blocks != 64);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(decode.Stats().num_free_blocks, 64);
  EXPECT_EQ(prefill.Stats().num_free_blocks, 64);
  EXPECT_EQ(prefill.Stats().num_held_blocks, 0);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// Seeded random sampling split across a prefill and a decode engine gives the tokens of one
// engine: each draw is keyed by (seed, choice, position), so the decode engine's first draw is
// at prompt length + 1 whatever the prefill engine drew.
TEST(DisaggEngineTest, SeededSamplingAcrossPrefillAndDecodeEqualsOneEngine) {
  const std::vector<int32_t> prompt = Prompt(13, 5);
  const int max_tokens = 16;
  auto sampled = [&](bool hold) {
    EngineRequest r = Greedy("r", prompt, max_tokens, hold);
    r.sampling.temperature = 3.0f;  // ~0.3 on the fake's peak: the draws decide
    r.sampling.seed = 4242;
    r.sampling.choice_index = 1;
    r.sampling.ignore_eos = true;
    return r;
  };
  auto single = MakeEngine(64);
  ASSERT_TRUE(single->AddRequest(sampled(false)).ok());
  std::vector<int32_t> want;
  for (const RequestOutput& o : RunUntilFinished(*single, "r")) {
    for (const SampledToken& t : o.new_tokens) want.push_back(t.token_id);
  }
  ASSERT_EQ(want.size(), static_cast<size_t>(max_tokens));
  // The draws matter: not the fake's greedy continuation.
  EXPECT_NE(want, ChecksumModel::Reference(prompt, max_tokens));

  auto prefill = MakeEngine(64);
  auto decode = MakeEngine(64);
  ASSERT_TRUE(decode->AddRequest(Greedy("other", Prompt(9, 77), 20)).ok());
  std::vector<RequestOutput> other_outs = decode->Step();
  ASSERT_TRUE(prefill->AddRequest(sampled(true)).ok());
  std::vector<RequestOutput> pre = RunUntilFinished(*prefill, "r");
  ASSERT_TRUE(pre.back().kv_held);
  const SampledToken first = pre.back().new_tokens.at(0);
  auto reserved = decode->ReserveForTransfer(sampled(false), first);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  CopyBlocks(*prefill, pre.back().held_block_ids, *decode, *reserved,
             static_cast<int64_t>(prompt.size()));
  ASSERT_TRUE(decode->CompleteTransfer("r", absl::OkStatus(), first).ok());
  std::vector<int32_t> got = {first.token_id};
  for (const RequestOutput& o : RunUntilFinished(*decode, "r", &other_outs)) {
    for (const SampledToken& t : o.new_tokens) got.push_back(t.token_id);
  }
  EXPECT_EQ(got, want);
}


// Migration through prefill: the request's first k outputs (what the client already has) are
// resumed on a prefill engine, which prefills prompt + those, samples output k + 1 and pins
// their KV; a decode engine reserves for prompt + k + 1 tokens, receives that KV and decodes the
// rest. Greedy and seeded sampling (draws keyed by position) give the undisturbed run's tokens
// exactly; the resumed tokens count toward max_tokens and are not emitted again.
TEST(DisaggEngineTest, ResumedRequestThroughPrefillContinuesTheUndisturbedRun) {
  const int max_tokens = 14;
  for (bool seeded : {false, true}) {
    for (int len : {5, 16, 37}) {
      const std::vector<int32_t> prompt = Prompt(len, len + 2);
      auto make = [&](bool hold) {
        EngineRequest r = Greedy("r", prompt, max_tokens, hold);
        if (seeded) {
          r.sampling.temperature = 3.0f;  // the draws decide (see the test above)
          r.sampling.seed = 777;
          r.sampling.ignore_eos = true;
        }
        return r;
      };
      auto single = MakeEngine(64);
      ASSERT_TRUE(single->AddRequest(make(false)).ok());
      std::vector<int32_t> whole;
      for (const RequestOutput& o : RunUntilFinished(*single, "r")) {
        for (const SampledToken& t : o.new_tokens) whole.push_back(t.token_id);
      }
      ASSERT_EQ(whole.size(), static_cast<size_t>(max_tokens));
      if (!seeded) {
        EXPECT_EQ(whole, ChecksumModel::Reference(prompt, max_tokens));
      }
      for (int k : {1, 3, 12}) {
        SCOPED_TRACE(::testing::Message()
                     << "seeded " << seeded << " len " << len << " k " << k);
        const std::vector<int32_t> resumed(whole.begin(), whole.begin() + k);
        auto prefill = MakeEngine(64);
        auto decode = MakeEngine(64);
        ASSERT_TRUE(decode->AddRequest(Greedy("other", Prompt(9, 77), 20)).ok());
        std::vector<RequestOutput> other_outs = decode->Step();

        EngineRequest pre_request = make(true);
        pre_request.resumed_output_token_ids = resumed;
        ASSERT_TRUE(prefill->AddRequest(pre_request).ok());
        std::vector<RequestOutput> pre = RunUntilFinished(*prefill, "r");
        ASSERT_EQ(pre.size(), 1u);
        ASSERT_TRUE(pre.back().kv_held);
        ASSERT_EQ(pre.back().new_tokens.size(), 1u);
        const SampledToken next = pre.back().new_tokens[0];
        EXPECT_EQ(next.token_id, whole[k]);
        EXPECT_EQ(pre.back().num_prompt_tokens, len);
        EXPECT_EQ(pre.back().num_output_tokens, k + 1);
        // Pinned: the KV of prompt + the resumed tokens (the new token has none yet).
        EXPECT_EQ(static_cast<int64_t>(pre.back().held_block_ids.size()),
                  NumBlocksFor(len + k, 4));
        EXPECT_EQ(prefill->num_held_blocks(), NumBlocksFor(len + k, 4));

        EngineRequest dec_request = make(false);
        dec_request.resumed_output_token_ids = resumed;
        auto reserved = decode->ReserveForTransfer(dec_request, std::nullopt);
        ASSERT_TRUE(reserved.ok()) << reserved.status();
        EXPECT_EQ(static_cast<int64_t>(reserved->size()), NumBlocksFor(len + k + 1, 4));
        CopyBlocks(*prefill, pre.back().held_block_ids, *decode, *reserved, len + k);
        ASSERT_TRUE(prefill->ReleaseHeldBlocks("r").ok());
        EXPECT_EQ(prefill->num_free_blocks(), 64);
        ASSERT_TRUE(decode->CompleteTransfer("r", absl::OkStatus(), next).ok());
        std::vector<int32_t> got = resumed;
        got.push_back(next.token_id);
        std::vector<RequestOutput> outs = RunUntilFinished(*decode, "r", &other_outs);
        for (const RequestOutput& o : outs) {
          for (const SampledToken& t : o.new_tokens) got.push_back(t.token_id);
        }
        EXPECT_EQ(got, whole);
        EXPECT_EQ(outs.back().finish_reason, FinishReason::kLength);
        EXPECT_EQ(outs.back().num_output_tokens, max_tokens);
        if (k + 2 <= max_tokens) {
          EXPECT_EQ(outs.front().num_output_tokens, k + 2);
        }
        decode->AbortRequest("other");
        RunUntilFinished(*decode, "other");
        EXPECT_EQ(decode->num_free_blocks(), 64);
      }
    }
  }
  // The resumed prefill's token is the last one max_tokens allows: it ends the request there,
  // nothing pinned.
  auto prefill = MakeEngine(64);
  const std::vector<int32_t> prompt = Prompt(9, 3);
  EngineRequest last = Greedy("last", prompt, 4, /*hold=*/true);
  const std::vector<int32_t> whole = ChecksumModel::Reference(prompt, 4);
  last.resumed_output_token_ids.assign(whole.begin(), whole.begin() + 3);
  ASSERT_TRUE(prefill->AddRequest(last).ok());
  std::vector<RequestOutput> outs = RunUntilFinished(*prefill, "last");
  EXPECT_FALSE(outs.back().kv_held);
  EXPECT_EQ(outs.back().finish_reason, FinishReason::kLength);
  ASSERT_EQ(outs.back().new_tokens.size(), 1u);
  EXPECT_EQ(outs.back().new_tokens[0].token_id, whole[3]);
  EXPECT_EQ(prefill->num_free_blocks(), 64);
}

}  // namespace
}  // namespace sluice
