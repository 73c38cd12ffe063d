// A prefill worker's staged pushes (--kv-staging, push mode) run concurrently: PrefillService on
// loopback gRPC around an AsyncEngine with the fake ChecksumModel (k(0) holds each token's id),
// its KV unregistered and pushed through a StagingPool of two members (host copiers) over a real
// UCX agent (tcp) into a "decode worker's" registered blocks. Two PushKv calls are inside their
// staged transfers at the same time (each holds at its first copy-lane wait until the other got
// there too; a single set of slots would make them take turns), and each lands its prompt's KV
// exactly in its own reserved blocks. A failed device copy fails its push as UNAVAILABLE.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/sched/async_engine.h"
#include "engine/sched/llm_engine.h"
#include "gtest/gtest.h"
#include "services/common/worker_metrics.h"
#include "services/common/worker_wire.h"
#include "services/prefill/prefill_service.h"
#include "sluice/v1/worker.grpc.pb.h"
#include "tests/util/fake_models.h"
#include "transfer/block_runs_wire.h"
#include "transfer/device_copier.h"
#include "transfer/kv_transfer.h"
#include "transfer/staging_pool.h"

namespace sluice {
namespace {

using testing::ChecksumModel;

constexpr int64_t kBlocks = 32;
constexpr int64_t kBlockSize = 4;

// GateCopier: host copies whose first Wait runs `on_first_wait` first.
class GateCopier final : public transfer::DeviceCopier {
 public:
  explicit GateCopier(int num_lanes) : inner_(num_lanes) {}
  int num_lanes() const override { return inner_.num_lanes(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_.AllocateStaging(bytes);
  }
  void FreeStaging(void* staging) override { inner_.FreeStaging(staging); }
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         transfer::CopyDirection direction) override {
    return inner_.CopyAsync(lane, dst, src, bytes, direction);
  }
  absl::Status Wait(int lane) override {
    if (on_first_wait) std::exchange(on_first_wait, nullptr)();
    absl::Status s = inner_.Wait(lane);
    if (fail_next_wait.exchange(false)) return absl::InternalError("injected: copy faulted");
    return s;
  }
  std::function<void()> on_first_wait;
  std::atomic<bool> fail_next_wait{false};  // the next Wait fails, as a faulted device copy

 private:
  transfer::HostMemcpyCopier inner_;
};

std::unique_ptr<transfer::KvTransferAgent> MakeAgent() {
  transfer::KvTransferOptions options;
  options.transports = "tcp";
  auto agent = transfer::KvTransferAgent::Create(options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? std::move(*agent) : nullptr;
}

std::unique_ptr<LLMEngine> MakeEngine() {
  EngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = kBlocks;
  options.max_model_len = 64;
  options.enable_prefix_caching = false;
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

TEST(PrefillStagedPushTest, ConcurrentPushesOverlapAndLandExactly) {
  AsyncEngine engine(MakeEngine());
  WorkerMetrics metrics("prefill", "checksum");
  auto agent = MakeAgent();
  ASSERT_NE(agent, nullptr);
  const std::vector<transfer::KvRegion> regions = KvRegionsOf(engine.kv_cache());
  ASSERT_EQ(regions.size(), 1u);  // k(0): one float per token
  std::vector<GateCopier*> copiers;
  auto pool = transfer::StagingPool::Create(
      agent.get(), 2,
      [&copiers]() -> absl::StatusOr<std::unique_ptr<transfer::DeviceCopier>> {
        auto copier = std::make_unique<GateCopier>(2);
        copiers.push_back(copier.get());
        return std::unique_ptr<transfer::DeviceCopier>(std::move(copier));
      },
      transfer::StagingOptions{regions[0].block_bytes, 2});  // a slot per block
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::atomic<int> inside{0}, gave_up{0};
  for (GateCopier* c : copiers) {
    c->on_first_wait = [&inside, &gave_up] {
      ++inside;
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (inside.load() < 2 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
      if (inside.load() < 2) ++gave_up;
    };
  }
  PrefillServiceOptions options;
  options.transfer_mode = v1::KV_TRANSFER_MODE_PUSH;
  options.staging = pool->get();
  auto service = std::make_unique<PrefillService>(&engine, agent.get(), regions, "", "",
                                                  &metrics, options);
  grpc::ServerBuilder builder;
  builder.RegisterService(service.get());
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::PrefillWorker::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  // The decode side: registered blocks the pushes write into.
  auto decode_agent = MakeAgent();
  ASSERT_NE(decode_agent, nullptr);
  std::vector<float> decode_k(kBlocks * kBlockSize, -1.0f);
  const transfer::KvRegion decode_region{decode_k.data(), kBlocks, regions[0].block_bytes};
  ASSERT_TRUE(decode_agent->RegisterRegion(decode_k.data(), kBlocks * decode_region.block_bytes)
                  .ok());
  auto decode_desc = decode_agent->Describe({&decode_region, 1});
  ASSERT_TRUE(decode_desc.ok()) << decode_desc.status();

  // Two prompts of 10 tokens (3 blocks each), prefilled and pinned.
  const std::vector<std::vector<int32_t>> prompts = {{3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
                                                     {20, 21, 22, 23, 24, 25, 26, 27, 28, 29}};
  std::vector<v1::PrefillResponse> prefilled(2);
  for (int i = 0; i < 2; ++i) {
    v1::PrefillRequest request;
    request.set_request_id(absl::StrCat("r", i));
    for (int32_t t : prompts[i]) request.add_prompt_token_ids(t);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(4);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Status s = stub->Prefill(&context, request, &prefilled[i]);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(prefilled[i].first_token().token_id(), ChecksumModel::Reference(prompts[i], 1)[0]);
  }
  // Request i's KV goes to decode blocks 10 i + 1 .. 10 i + 3.
  const std::vector<std::vector<int32_t>> destination = {{1, 2, 3}, {11, 12, 13}};
  grpc::Status pushed[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      v1::PushKvRequest request;
      request.set_request_id(absl::StrCat("r", i));
      request.set_transfer_token(prefilled[i].kv().transfer_token());
      v1::KvBlocks* d = request.mutable_destination();
      d->set_kv_descriptor(decode_desc->Serialize());
      transfer::RunsToWire(destination[i], d);
      *d->mutable_layout() = LayoutOf(engine.kv_cache(), /*dtype_bytes=*/4);
      d->set_num_tokens(static_cast<int32_t>(prompts[i].size()));
      request.set_timeout_ms(20000);
      v1::PushKvResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      pushed[i] = stub->PushKv(&context, request, &response);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(pushed[i].ok()) << i << ": " << pushed[i].error_message();
  EXPECT_EQ(inside.load(), 2);
  EXPECT_EQ(gave_up.load(), 0);  // both pushes were in their staged transfers at once
  for (int i = 0; i < 2; ++i) {
    for (size_t p = 0; p < prompts[i].size(); ++p) {
      const int32_t block = destination[i][p / kBlockSize];
      EXPECT_EQ(decode_k[block * kBlockSize + p % kBlockSize], static_cast<float>(prompts[i][p]))
          << "request " << i << " token " << p;
    }
  }
  EXPECT_EQ(decode_k[0], -1.0f);  // blocks outside the destinations untouched
  EXPECT_EQ(decode_k[10 * kBlockSize], -1.0f);
  const transfer::StagedTransferStats stats = (*pool)->stats();
  EXPECT_EQ(stats.bytes_pushed, 2 * 3 * regions[0].block_bytes);
  EXPECT_GT((*pool)->member(0)->stats().bytes_pushed, 0);
  EXPECT_GT((*pool)->member(1)->stats().bytes_pushed, 0);
  // Both pins were freed by their pushes.
  for (int i = 0; i < 1000 && engine.Stats().num_free_blocks != kBlocks; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(engine.Stats().num_free_blocks, kBlocks);

  // A device -> host copy into a staging slot fails: PushKv answers UNAVAILABLE (a transfer
  // failure the decode worker recomputes after, not INTERNAL), and the pin is freed.
  {
    v1::PrefillRequest request;
    request.set_request_id("faulted");
    for (int32_t t : prompts[0]) request.add_prompt_token_ids(t);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(4);
    v1::PrefillResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Prefill(&context, request, &response).ok());
    for (GateCopier* c : copiers) c->fail_next_wait = true;
    v1::PushKvRequest push;
    push.set_request_id("faulted");
    push.set_transfer_token(response.kv().transfer_token());
    v1::KvBlocks* d = push.mutable_destination();
    d->set_kv_descriptor(decode_desc->Serialize());
    transfer::RunsToWire(std::vector<int32_t>{20, 21, 22}, d);
    *d->mutable_layout() = LayoutOf(engine.kv_cache(), /*dtype_bytes=*/4);
    d->set_num_tokens(static_cast<int32_t>(prompts[0].size()));
    push.set_timeout_ms(20000);
    v1::PushKvResponse pushed_response;
    grpc::ClientContext push_context;
    const grpc::Status s = stub->PushKv(&push_context, push, &pushed_response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_EQ(s.error_message(),
              "device -> host copy of a staged KV transfer failed: injected: copy faulted");
    for (int i = 0; i < 1000 && engine.Stats().num_free_blocks != kBlocks; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(engine.Stats().num_free_blocks, kBlocks);
  }
  server->Shutdown();
  engine.Shutdown();
}

}  // namespace
}  // namespace sluice
