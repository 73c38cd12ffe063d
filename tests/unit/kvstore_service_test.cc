// The kvstore's gRPC service and client in one process: puts and gets over UCX (client push,
// client pull) and over the inline fallback, sharding over two stores, a dead shard (misses and
// an error, within the deadline), lease bookkeeping, and bad requests.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "services/kvstore/block_store.h"
#include "services/kvstore/kvstore_client.h"
#include "services/kvstore/kvstore_metrics.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/rendezvous.h"
#include "transfer/kv_transfer.h"

namespace sluice::kvstore {
namespace {

constexpr int64_t kBlockBytes = 8192;

// TestStore: a BlockStore over a UCX-allocated arena, served by KvStoreService on a free port.
class TestStore {
 public:
  explicit TestStore(bool with_ucx = true) {
    char tmpl[] = "/tmp/kvstore_service_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    const int64_t arena_bytes = 4 << 20;
    if (with_ucx) {
      auto agent = transfer::KvTransferAgent::Create({});
      EXPECT_TRUE(agent.ok()) << agent.status();
      agent_ = std::move(*agent);
      auto region = agent_->AllocateRegion(arena_bytes);
      EXPECT_TRUE(region.ok()) << region.status();
      arena_ = static_cast<uint8_t*>(region->base);
    } else {
      heap_.resize(arena_bytes);
      arena_ = heap_.data();
    }
    BlockStoreOptions o;
    o.dram_arena = arena_;
    o.dram_bytes = arena_bytes;
    o.dram_page_bytes = 1 << 20;
    o.ssd_dir = dir_;
    o.ssd_bytes = 64 << 20;
    auto store = BlockStore::Open(o);
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    service_ = std::make_unique<KvStoreService>(store_.get(), agent_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~TestStore() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
    service_.reset();
    store_.reset();
    agent_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& address() const { return address_; }
  BlockStore& store() { return *store_; }
  KvStoreService& service() { return *service_; }

 private:
  std::string dir_;
  std::unique_ptr<transfer::KvTransferAgent> agent_;
  std::vector<uint8_t> heap_;
  uint8_t* arena_ = nullptr;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// ClientSide: a client agent with a registered buffer of `n` blocks.
class ClientSide {
 public:
  explicit ClientSide(int n, bool with_ucx = true) {
    if (with_ucx) {
      agent_ = std::move(*transfer::KvTransferAgent::Create({}));
      auto region = agent_->AllocateRegion(n * kBlockBytes);
      EXPECT_TRUE(region.ok()) << region.status();
      base_ = static_cast<uint8_t*>(region->base);
    } else {
      heap_.resize(n * kBlockBytes);
      base_ = heap_.data();
    }
    region_ = transfer::KvRegion{base_, n, kBlockBytes};
  }
  transfer::KvTransferAgent* agent() { return agent_.get(); }
  const transfer::KvRegion& region() const { return region_; }
  uint8_t* block(int b) { return base_ + b * kBlockBytes; }
  void Fill(int b, uint64_t seed) {
    for (int64_t i = 0; i < kBlockBytes; ++i) block(b)[i] = static_cast<uint8_t>((seed * 131 + i * 7) >> 1);
  }
  bool Holds(int b, uint64_t seed) {
    for (int64_t i = 0; i < kBlockBytes; ++i) {
      if (block(b)[i] != static_cast<uint8_t>((seed * 131 + i * 7) >> 1)) return false;
    }
    return true;
  }

 private:
  std::unique_ptr<transfer::KvTransferAgent> agent_;
  std::vector<uint8_t> heap_;
  uint8_t* base_ = nullptr;
  transfer::KvRegion region_;
};

std::vector<BlockKey> Keys(int n, uint64_t layout = 5, int first = 0) {
  std::vector<BlockKey> keys;
  for (int i = first; i < first + n; ++i) keys.push_back(BlockKey{layout, uint64_t(i) << 32, uint64_t(i)});
  return keys;
}

std::vector<int32_t> Iota(int n, int first = 0) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = first + i;
  return ids;
}

std::unique_ptr<KvStoreClient> Client(std::vector<std::string> shards,
                                      transfer::KvTransferAgent* agent) {
  KvStoreClientOptions o;
  o.shards = std::move(shards);
  o.agent = agent;
  // As long as the calls' own deadline (Soon()): these tests check bytes and bookkeeping, and
  // under the sanitizers on a loaded machine one control RPC (the first UCX put's wire-up)
  // took more than the default 2 s (TSan, load average 17).
  o.rpc_timeout = absl::Seconds(10);
  auto c = CreateKvStoreClient(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(KvstoreService, PutThenGetOverUcxIsByteExact) {
  TestStore store;
  ClientSide writer(16), reader(16);
  auto client = Client({store.address()}, writer.agent());
  const std::vector<BlockKey> keys = Keys(12);
  // Scattered local blocks: runs on both sides are coalesced differently.
  const std::vector<int32_t> src = {0, 1, 2, 5, 6, 9, 10, 11, 12, 13, 14, 15};
  for (size_t i = 0; i < keys.size(); ++i) writer.Fill(src[i], i);
  auto put = client->Put(keys, writer.region(), src, Soon());
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(put->error.ok()) << put->error;
  EXPECT_EQ(put->num_stored, 12);
  EXPECT_EQ(put->num_failed, 0);

  auto again = client->Put(keys, writer.region(), src, Soon());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->num_present, 12);
  EXPECT_EQ(again->num_stored, 0);

  auto reader_client = Client({store.address()}, reader.agent());
  std::vector<BlockKey> asked = keys;
  asked.push_back(Keys(1, 5, 100)[0]);  // never put
  const std::vector<int32_t> dst = Iota(13, 0);
  auto got = reader_client->Get(asked, reader.region(), dst, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->error.ok()) << got->error;
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(got->found[i]) << i;
    EXPECT_TRUE(reader.Holds(dst[i], i)) << i;
  }
  EXPECT_FALSE(got->found[12]);
  const BlockStoreStats s = store.store().stats();
  EXPECT_EQ(s.blocks_stored, 12);
  EXPECT_EQ(s.hits_dram, 12);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.active_leases, 0);  // released by the client

  auto exists = reader_client->Exists(asked, Soon());
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(std::count(exists->found.begin(), exists->found.end(), true), 12);
  EXPECT_FALSE(exists->found[12]);
}

TEST(KvstoreService, OneCallLargerThanTheDramTierGoesInRounds) {
  TestStore store;  // 4 MiB of DRAM: 512 slots of 8 KiB
  constexpr int kN = 1200;
  ClientSide side(kN);
  auto client = Client({store.address()}, side.agent());
  const std::vector<BlockKey> keys = Keys(kN, 12);
  for (int i = 0; i < kN; ++i) side.Fill(i, 7000 + i);
  auto put = client->Put(keys, side.region(), Iota(kN), Soon());
  ASSERT_TRUE(put.ok());
  EXPECT_TRUE(put->error.ok()) << put->error;
  EXPECT_EQ(put->num_stored, kN);
  EXPECT_EQ(put->num_failed, 0);
  std::memset(side.block(0), 0, kN * kBlockBytes);
  auto got = client->Get(keys, side.region(), Iota(kN), Soon());
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->error.ok()) << got->error;
  int found = 0, exact = 0;
  for (int i = 0; i < kN; ++i) {
    found += got->found[i];
    exact += got->found[i] && side.Holds(i, 7000 + i);
  }
  EXPECT_EQ(found, kN);
  EXPECT_EQ(exact, kN);
  const BlockStoreStats s = store.store().stats();
  EXPECT_EQ(s.ssd_blocks, kN);
  EXPECT_GT(s.hits_ssd, 0);
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.active_leases, 0);
}

TEST(KvstoreService, InlineFallbackWithoutUcx) {
  TestStore store(/*with_ucx=*/false);
  // 400 blocks of 8 KiB = 3.2 MiB: more than one inline call's worth, so the client splits it.
  constexpr int kN = 400;
  ClientSide side(kN, /*with_ucx=*/false);
  auto client = Client({store.address()}, nullptr);
  const std::vector<BlockKey> keys = Keys(kN, 6);
  for (int i = 0; i < kN; ++i) side.Fill(i, 40 + i);
  auto put = client->Put(keys, side.region(), Iota(kN), Soon());
  ASSERT_TRUE(put.ok());
  EXPECT_TRUE(put->error.ok()) << put->error;
  EXPECT_EQ(put->num_stored, kN);
  std::memset(side.block(0), 0, kN * kBlockBytes);
  std::vector<int32_t> reversed(kN);
  for (int i = 0; i < kN; ++i) reversed[i] = kN - 1 - i;
  auto got = client->Get(keys, side.region(), reversed, Soon());
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->error.ok()) << got->error;
  for (int i = 0; i < kN; ++i) {
    EXPECT_TRUE(got->found[i]) << i;
    EXPECT_TRUE(side.Holds(kN - 1 - i, 40 + i)) << i;
  }
  // A UCX call against a store without UCX: refused, nothing stored, no hang.
  ClientSide ucx_side(2);
  auto ucx_client = Client({store.address()}, ucx_side.agent());
  auto refused = ucx_client->Put(Keys(2, 6, 1000), ucx_side.region(), Iota(2), Soon());
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->num_failed, 2);
  EXPECT_EQ(refused->error.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KvstoreService, ShardsSplitTheKeysAndADeadShardMeansMissesNotHangs) {
  TestStore a, b;
  ClientSide side(64);
  // A port nobody listens on: connections are refused at once.
  const std::string dead = "127.0.0.1:1";
  const std::vector<std::string> names = {a.address(), b.address(), dead};
  auto client = Client(names, side.agent());
  const std::vector<BlockKey> keys = Keys(64, 8);
  for (int i = 0; i < 64; ++i) side.Fill(i, 1000 + i);
  const absl::Time start = absl::Now();
  auto put = client->Put(keys, side.region(), Iota(64), start + absl::Seconds(5));
  ASSERT_TRUE(put.ok());
  const RendezvousHash hrw(names);
  int on_dead = 0;
  for (const BlockKey& k : keys) on_dead += hrw.Pick(k) == 2;
  ASSERT_GT(on_dead, 0);
  EXPECT_EQ(put->num_stored, 64 - on_dead);
  EXPECT_EQ(put->num_failed, on_dead);
  EXPECT_EQ(put->error.code(), absl::StatusCode::kUnavailable) << put->error;
  EXPECT_EQ(a.store().stats().blocks_stored + b.store().stats().blocks_stored, 64 - on_dead);
  EXPECT_GT(a.store().stats().blocks_stored, 0);
  EXPECT_GT(b.store().stats().blocks_stored, 0);

  std::memset(side.block(0), 0, 64 * kBlockBytes);
  auto got = client->Get(keys, side.region(), Iota(64), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok());
  for (int i = 0; i < 64; ++i) {
    const bool live = hrw.Pick(keys[i]) != 2;
    EXPECT_EQ(got->found[i], live) << i;
    if (live) {
      EXPECT_TRUE(side.Holds(i, 1000 + i)) << i;
    }
  }
  EXPECT_FALSE(got->error.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
}

TEST(KvstoreService, DrainingRefusesNewReadsAndWritesAsMisses) {
  TestStore store(/*with_ucx=*/false);
  ClientSide side(4, /*with_ucx=*/false);
  auto client = Client({store.address()}, nullptr);
  const std::vector<BlockKey> keys = Keys(4, 9);
  for (int i = 0; i < 4; ++i) side.Fill(i, 70 + i);
  auto put = client->Put(keys, side.region(), Iota(4), Soon());
  ASSERT_TRUE(put.ok());
  ASSERT_EQ(put->num_stored, 4);

  store.service().set_draining(true);
  auto got = client->Get(keys, side.region(), Iota(4), Soon());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->error.code(), absl::StatusCode::kUnavailable) << got->error;
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(got->found[i]) << i;  // a miss: the engine computes
  auto refused = client->Put(Keys(4, 9, 500), side.region(), Iota(4), Soon());
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->num_stored, 0);
  EXPECT_EQ(refused->num_failed, 4);
  EXPECT_EQ(refused->error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store.store().stats().blocks_stored, 4);
  {
    auto stub = v1::KvStore::NewStub(
        grpc::CreateChannel(store.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::KvHealthResponse health;
    ASSERT_TRUE(stub->Health(&context, v1::KvHealthRequest(), &health).ok());
    EXPECT_FALSE(health.serving());
  }

  store.service().set_draining(false);
  std::memset(side.block(0), 0, 4 * kBlockBytes);
  got = client->Get(keys, side.region(), Iota(4), Soon());
  ASSERT_TRUE(got.ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(got->found[i]) << i;
    EXPECT_TRUE(side.Holds(i, 70 + i)) << i;
  }
}

TEST(KvstoreService, CallerErrorsAreInvalidArgument) {
  TestStore store;
  ClientSide side(4);
  auto client = Client({store.address()}, side.agent());
  const std::vector<BlockKey> keys = Keys(2);
  EXPECT_EQ(client->Put(keys, side.region(), {0}, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Get(keys, side.region(), {0, 4}, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<BlockKey> dup = {keys[0], keys[0]};
  EXPECT_EQ(client->Get(dup, side.region(), {0, 1}, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  KvStoreClientOptions none;
  EXPECT_EQ(CreateKvStoreClient(none).status().code(), absl::StatusCode::kInvalidArgument);
  KvStoreClientOptions twice;
  twice.shards = {"a:1", "a:1"};
  EXPECT_EQ(CreateKvStoreClient(twice).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvstoreService, CommitOfAnUnknownLeaseIsNotFound) {
  TestStore store;
  auto channel = grpc::CreateChannel(store.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::KvStore::NewStub(channel);
  grpc::ClientContext ctx;
  v1::KvPutCommitRequest req;
  req.set_lease_id(12345);
  req.set_lease_token(store.service().LeaseToken(12345));
  v1::KvPutCommitResponse resp;
  EXPECT_EQ(stub->PutCommit(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext ctx2;
  v1::KvPutBeginRequest begin;
  begin.set_block_bytes(0);
  begin.add_blocks()->set_hash_lo(1);
  v1::KvPutBeginResponse begun;
  EXPECT_EQ(stub->PutBegin(&ctx2, begin, &begun).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A lease is committed or released only with the token its Begin handed out: a forged or
// missing one is PERMISSION_DENIED and leaves the lease and its slots as they were (the real
// holder still commits, the block is stored once).
TEST(KvstoreService, ForgedLeaseTokenIsRefusedWithoutTouchingTheLease) {
  TestStore store;
  auto stub = v1::KvStore::NewStub(
      grpc::CreateChannel(store.address(), grpc::InsecureChannelCredentials()));
  v1::KvPutBeginRequest begin;
  begin.set_block_bytes(kBlockBytes);
  ToBlockId(Keys(1)[0], begin.add_blocks());
  v1::KvPutBeginResponse granted;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->PutBegin(&ctx, begin, &granted).ok());
  }
  ASSERT_NE(granted.lease_id(), 0u);
  ASSERT_EQ(granted.lease_token().size(), 16u);
  ASSERT_EQ(granted.outcomes(0), v1::KV_PUT_STORED);
  EXPECT_EQ(store.store().stats().active_leases, 1);
  // The slot holds the bytes the real holder wrote (by RMA in production).
  std::vector<uint8_t> bytes(kBlockBytes, 0x5a);
  const DramTier::Page page = store.store().page(granted.slots(0).page());
  std::memcpy(page.base + granted.slots(0).slot() * page.block_bytes, bytes.data(), bytes.size());

  std::string forged = granted.lease_token();
  forged[0] ^= 1;
  for (const std::string& token : {forged, std::string()}) {
    grpc::ClientContext ctx;
    v1::KvPutCommitRequest commit;
    commit.set_lease_id(granted.lease_id());
    commit.set_lease_token(token);
    commit.add_checksums(BlockChecksum(bytes.data(), kBlockBytes));
    v1::KvPutCommitResponse committed;
    const grpc::Status status = stub->PutCommit(&ctx, commit, &committed);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
    EXPECT_TRUE(committed.outcomes().empty());
    grpc::ClientContext release_ctx;
    v1::KvReleaseRequest release;
    release.set_lease_id(granted.lease_id());
    release.set_lease_token(token);
    v1::KvReleaseResponse released;
    EXPECT_EQ(stub->Release(&release_ctx, release, &released).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(store.store().stats().active_leases, 1);
  EXPECT_EQ(store.store().stats().blocks_stored, 0);

  grpc::ClientContext ctx;
  v1::KvPutCommitRequest commit;
  commit.set_lease_id(granted.lease_id());
  commit.set_lease_token(granted.lease_token());
  commit.add_checksums(BlockChecksum(bytes.data(), kBlockBytes));
  v1::KvPutCommitResponse committed;
  ASSERT_TRUE(stub->PutCommit(&ctx, commit, &committed).ok());
  ASSERT_EQ(committed.outcomes_size(), 1);
  EXPECT_EQ(committed.outcomes(0), v1::KV_PUT_STORED);
  EXPECT_EQ(store.store().stats().active_leases, 0);
  EXPECT_EQ(store.store().stats().blocks_stored, 1);
}

TEST(KvstoreService, KeysComeFromTheEngineBlockHashScheme) {
  const std::string identity = KvLayoutIdentity("sluice-mini-moe", 16, "f32", 4, 128, 128);
  const BlockHasher a(identity, 16), b(identity, 16);
  const BlockHasher other(KvLayoutIdentity("sluice-mini-moe", 32, "f32", 4, 128, 128), 32);
  std::vector<int32_t> tokens(16);
  for (int i = 0; i < 16; ++i) tokens[i] = 100 + i;
  const BlockHash h = a.HashBlock(a.RootHash(""), tokens);
  const BlockKey ka = KvStoreKey(a, h);
  EXPECT_EQ(ka, KvStoreKey(b, b.HashBlock(b.RootHash(""), tokens)));
  EXPECT_EQ(ka.layout_id, a.seed());
  EXPECT_EQ(ka.hash_hi, h.hi);
  EXPECT_EQ(ka.hash_lo, h.lo);
  EXPECT_NE(KvStoreKey(other, h).layout_id, ka.layout_id);
}

TEST(KvstoreMetrics, RendersTierLabelsAndCounters) {
  BlockStoreStats s;
  s.dram_blocks = 3;
  s.ssd_blocks = 7;
  s.hits_ssd = 2;
  s.corrupt_blocks = 1;
  const std::string text = RenderKvStoreMetrics(s, nullptr);
  EXPECT_NE(text.find("sluice_kvstore_blocks{tier=\"dram\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_kvstore_blocks{tier=\"ssd\"} 7\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_kvstore_hits_total{tier=\"ssd\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_kvstore_corrupt_blocks_total 1\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE sluice_kvstore_misses_total counter\n"), std::string::npos);
  EXPECT_EQ(text.find("ucx"), std::string::npos);
}

}  // namespace
}  // namespace sluice::kvstore
