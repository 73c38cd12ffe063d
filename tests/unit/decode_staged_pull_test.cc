// A decode worker's staged pull (--kv-staging, pull mode) and its failures, end to end in one
// process: DecodeService on loopback gRPC around an AsyncEngine with the fake ChecksumModel
// (whose tokens depend on every KV value, so KV that was not moved whole shows in the tokens),
// its KV unregistered and pulled through a StagingPool of host staging slots over a real UCX
// agent (tcp) from a "prefill worker": a second agent holding the prompt's KV in registered
// memory, and a gRPC PrefillWorker that acks every Release. The pool's copier is a host copier
// whose copies can be made to fail (a CUDA copy fault, in a GPU worker). Every failure of the
// staged pull — the device copy out of a slot, the RMA read — recomputes the prompt on the
// decode worker under its own cause (sluice_recomputes_total{cause}), frees the blocks of the
// failed attempt, acks the pin, and streams the same tokens.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/sched/async_engine.h"
#include "engine/sched/llm_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/common/worker_metrics.h"
#include "services/common/worker_wire.h"
#include "services/decode/decode_service.h"
#include "sluice/v1/worker.grpc.pb.h"
#include "tests/util/fake_models.h"
#include "transfer/device_copier.h"
#include "transfer/kv_transfer.h"
#include "transfer/staging_pool.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::ChecksumModel;

constexpr int64_t kBlocks = 32;
constexpr int64_t kBlockSize = 4;
constexpr int kMaxTokens = 4;

std::vector<int32_t> Prompt() { return {3, 4, 5, 6, 7, 8, 9, 10, 11, 12}; }  // 3 blocks

// FaultyCopier: host copies (HostMemcpyCopier) whose next Wait fails with Internal once
// `fail_next_wait` is set, as a device copy that faulted; the lane's copies are over either way.
class FaultyCopier final : public transfer::DeviceCopier {
 public:
  explicit FaultyCopier(int num_lanes) : inner_(num_lanes) {}
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
    absl::Status s = inner_.Wait(lane);
    if (fail_next_wait.exchange(false)) {
      return absl::InternalError("injected: an illegal memory access was encountered");
    }
    return s;
  }
  std::atomic<bool> fail_next_wait{false};

 private:
  transfer::HostMemcpyCopier inner_;
};

// AckingPrefill: a prefill worker's Release, answering that the pin was there.
class AckingPrefill final : public v1::PrefillWorker::CallbackService {
 public:
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest*,
                                    v1::ReleaseResponse* response) override {
    ++num_releases_;
    response->set_released(true);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  int num_releases() const { return num_releases_.load(); }

 private:
  std::atomic<int> num_releases_{0};
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
  options.kv_reserve_timeout_ms = 120000;
  options.enable_prefix_caching = false;  // block counts below are exact
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

// StagedDecodeWorker: the engine, its KV pulled through a one-member staging pool (slots of
// one block: a prompt of 3 blocks takes 3 slot fills), the service and its gRPC server.
class StagedDecodeWorker {
 public:
  StagedDecodeWorker() : engine_(MakeEngine()), metrics_("decode", "checksum") {
    agent_ = MakeAgent();
    const std::vector<transfer::KvRegion> regions = KvRegionsOf(engine_.kv_cache());
    auto pool = transfer::StagingPool::Create(
        agent_.get(), 1,
        [this]() -> absl::StatusOr<std::unique_ptr<transfer::DeviceCopier>> {
          auto copier = std::make_unique<FaultyCopier>(2);
          copier_ = copier.get();
          return std::unique_ptr<transfer::DeviceCopier>(std::move(copier));
        },
        transfer::StagingOptions{regions[0].block_bytes, 2});
    EXPECT_TRUE(pool.ok()) << pool.status();
    staging_ = std::move(*pool);
    DecodeServiceOptions options;
    options.transfer_mode = v1::KV_TRANSFER_MODE_PULL;
    options.transfer_timeout = absl::Seconds(3);
    options.release_timeout = absl::Seconds(2);
    options.staging = staging_.get();
    // The KV stays unregistered: only the staging slots are (an empty descriptor).
    service_ = std::make_unique<DecodeService>(&engine_, agent_.get(), regions, "", &metrics_,
                                               options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    server_ = builder.BuildAndStart();
    stub_ = v1::DecodeWorker::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                          grpc::InsecureChannelCredentials()));
  }
  ~StagedDecodeWorker() {
    server_->Shutdown();
    engine_.Shutdown();  // before the service: its final outputs reach the sessions
    service_.reset();
  }

  v1::DecodeWorker::Stub* stub() { return stub_.get(); }
  FaultyCopier* copier() { return copier_; }
  const KvCache& kv_cache() { return engine_.kv_cache(); }
  std::string metrics() {
    WorkerMetrics::ServiceGauges gauges;
    gauges.staging = staging_->stats();
    return metrics_.Render(engine_.Stats(), agent_->stats(), gauges);
  }
  // Waits (up to 10 s) until nothing is reserved and every block is free.
  bool WaitAllBlocksFree() {
    for (int i = 0; i < 1000; ++i) {
      const AsyncEngineStats s = engine_.Stats();
      if (s.num_reserved == 0 && s.num_free_blocks == kBlocks) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

 private:
  AsyncEngine engine_;
  WorkerMetrics metrics_;
  std::unique_ptr<transfer::KvTransferAgent> agent_;
  FaultyCopier* copier_ = nullptr;  // owned by staging_
  std::unique_ptr<transfer::StagingPool> staging_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DecodeWorker::Stub> stub_;
};

// PrefillKv: the prompt's KV as a prefill worker of the ChecksumModel holds it (k(0) = the token
// id, one float per token) in blocks 0..2 of registered memory shaped like the decode worker's.
struct PrefillKv {
  std::unique_ptr<transfer::KvTransferAgent> agent = MakeAgent();
  std::vector<float> k = std::vector<float>(kBlocks * kBlockSize, -1.0f);
  std::string descriptor;
  PrefillKv() {
    const std::vector<int32_t> prompt = Prompt();
    for (size_t i = 0; i < prompt.size(); ++i) k[i] = static_cast<float>(prompt[i]);
    const int64_t block_bytes = kBlockSize * static_cast<int64_t>(sizeof(float));
    EXPECT_TRUE(agent->RegisterRegion(k.data(), kBlocks * block_bytes).ok());
    const transfer::KvRegion region{k.data(), kBlocks, block_bytes};
    auto d = agent->Describe({&region, 1});
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) descriptor = d->Serialize();
  }
};

// A Decode after a remote prefill of Prompt(): first token from the prefill (the reference's),
// KV pinned in the prefill worker's blocks 0..2.
v1::DecodeRequest RemoteDecode(const std::string& id, const KvCache& cache,
                               const std::string& descriptor, const std::string& prefill_address) {
  v1::DecodeRequest request;
  request.set_request_id(id);
  for (int32_t t : Prompt()) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(kMaxTokens);
  v1::PrefillResponse* prefill = request.mutable_prefill();
  prefill->set_request_id(id);
  prefill->mutable_first_token()->set_token_id(ChecksumModel::Reference(Prompt(), 1)[0]);
  prefill->set_num_prompt_tokens(static_cast<int32_t>(Prompt().size()));
  prefill->set_kv_transfer_mode(v1::KV_TRANSFER_MODE_PULL);
  prefill->set_prefill_worker_address(prefill_address);
  v1::KvBlocks* kv = prefill->mutable_kv();
  v1::BlockRun* run = kv->add_runs();
  run->set_first_block(0);
  run->set_num_blocks(3);
  kv->set_num_tokens(static_cast<int32_t>(Prompt().size()));
  kv->set_kv_descriptor(descriptor);
  *kv->mutable_layout() = LayoutOf(cache, /*dtype_bytes=*/4);
  return request;
}

struct DecodeResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  std::string error;  // the final message's, when it ended with an error
};
DecodeResult Decode(StagedDecodeWorker& w, const v1::DecodeRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = w.stub()->Decode(&context, request);
  DecodeResult result;
  v1::TokenOutput message;
  while (reader->Read(&message)) {
    for (const v1::SampledToken& t : message.tokens()) result.tokens.push_back(t.token_id());
    if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      result.finish = message.finish_reason();
      result.error = message.error().message();
    }
  }
  result.status = reader->Finish();
  return result;
}

// The tokens streamed after the prefill's first one.
std::vector<int32_t> Expected() {
  std::vector<int32_t> all = ChecksumModel::Reference(Prompt(), kMaxTokens);
  return std::vector<int32_t>(all.begin() + 1, all.end());
}

class StagedPullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&prefill_);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    prefill_server_ = builder.BuildAndStart();
    ASSERT_NE(prefill_server_, nullptr);
    prefill_address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { prefill_server_->Shutdown(); }

  AckingPrefill prefill_;
  std::unique_ptr<grpc::Server> prefill_server_;
  std::string prefill_address_;
};

// The pulled KV is used as it is: tokens that depend on every value, nothing recomputed.
TEST_F(StagedPullTest, PulledKvIsUsed) {
  StagedDecodeWorker w;
  PrefillKv kv;
  DecodeResult d = Decode(w, RemoteDecode("ok", w.kv_cache(), kv.descriptor, prefill_address_));
  ASSERT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_EQ(d.finish, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(d.tokens, Expected());
  EXPECT_EQ(prefill_.num_releases(), 1);
  EXPECT_TRUE(w.WaitAllBlocksFree());
  const std::string m = w.metrics();
  EXPECT_THAT(m, HasSubstr("sluice_kv_staging_bytes_total 48\n"));  // 3 blocks of 16 bytes
  EXPECT_THAT(m, HasSubstr("sluice_kv_transfers_total{result=\"ok\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_decode_transfers_recomputed_total 0\n"));

  // Control: KV that is not the prompt's changes the tokens (so a used pull shows in them).
  kv.k[5] += 1.0f;
  d = Decode(w, RemoteDecode("wrong-kv", w.kv_cache(), kv.descriptor, prefill_address_));
  ASSERT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_NE(d.tokens, Expected());
}

// The host -> device copy out of a staging slot fails after two of the prompt's three blocks
// were read: the request is recomputed on the decode worker (same tokens), counted under
// staging_copy_failed, the pin acked and every block of the failed attempt freed.
TEST_F(StagedPullTest, DeviceCopyFailureRecomputesThePrompt) {
  StagedDecodeWorker w;
  PrefillKv kv;
  w.copier()->fail_next_wait = true;  // the first slot's copy, before the third block's read
  DecodeResult d = Decode(w, RemoteDecode("copy", w.kv_cache(), kv.descriptor, prefill_address_));
  ASSERT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_EQ(d.finish, v1::FINISH_REASON_LENGTH) << d.error;
  EXPECT_EQ(d.tokens, Expected());
  EXPECT_FALSE(w.copier()->fail_next_wait);  // the failure happened
  EXPECT_EQ(prefill_.num_releases(), 1);     // the pin is freed now, not at its timeout
  EXPECT_TRUE(w.WaitAllBlocksFree());
  const std::string m = w.metrics();
  EXPECT_THAT(m, HasSubstr("sluice_recomputes_total{cause=\"staging_copy_failed\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_decode_recomputes_total{reason=\"staging_copy_failed\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_recomputes_total{cause=\"transfer_failed\"} 0\n"));
  EXPECT_THAT(m, HasSubstr("sluice_decode_transfers_recomputed_total 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_kv_transfers_total{result=\"failed\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_kv_staging_bytes_total 0\n"));

  // The same staging serves the next pull, whose KV is used.
  d = Decode(w, RemoteDecode("next", w.kv_cache(), kv.descriptor, prefill_address_));
  ASSERT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_EQ(d.tokens, Expected());
  EXPECT_TRUE(w.WaitAllBlocksFree());
  EXPECT_THAT(w.metrics(), HasSubstr("sluice_kv_staging_bytes_total 48\n"));
  EXPECT_THAT(w.metrics(), HasSubstr("sluice_decode_transfers_recomputed_total 1\n"));
}

// The RMA read fails (the prefill worker's UCX side is gone): recomputed as transfer_failed or
// transfer_timeout, same tokens, blocks freed.
TEST_F(StagedPullTest, RmaFailureRecomputesThePrompt) {
  StagedDecodeWorker w;
  std::string gone_descriptor;
  {
    PrefillKv gone;
    gone_descriptor = gone.descriptor;
  }
  DecodeResult d = Decode(w, RemoteDecode("rma", w.kv_cache(), gone_descriptor, prefill_address_));
  ASSERT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_EQ(d.tokens, Expected());
  EXPECT_EQ(prefill_.num_releases(), 1);
  EXPECT_TRUE(w.WaitAllBlocksFree());
  const std::string m = w.metrics();
  EXPECT_THAT(m, HasSubstr("sluice_decode_transfers_recomputed_total 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_recomputes_total{cause=\"staging_copy_failed\"} 0\n"));
  const bool failed =
      m.find("sluice_recomputes_total{cause=\"transfer_failed\"} 1\n") != std::string::npos;
  const bool timeout =
      m.find("sluice_recomputes_total{cause=\"transfer_timeout\"} 1\n") != std::string::npos;
  EXPECT_TRUE(failed != timeout) << m;
}

}  // namespace
}  // namespace sluice
