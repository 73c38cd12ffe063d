// InProcessKvStore: one kvstore shard in the test process — a BlockStore over a DRAM arena and a
// temporary SSD folder, served by KvStoreService on a free 127.0.0.1 port. Without UCX (the
// default) the arena is heap memory and clients use the inline gRPC calls; with_ucx: the arena
// is allocated and registered by the shard's own UCX agent, as `sluice kvstore` does, so clients
// move block bytes by RMA. Header-only: a test target that includes it links sluice_kvstore.
#ifndef SLUICE_TESTS_UTIL_INPROCESS_KVSTORE_H_
#define SLUICE_TESTS_UTIL_INPROCESS_KVSTORE_H_

#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "services/kvstore/block_store.h"
#include "services/kvstore/kvstore_service.h"
#include "transfer/kv_transfer.h"

namespace sluice::testing {

class InProcessKvStore {
 public:
  // `dram_bytes` of DRAM tier in pages of `page_bytes` (the largest block it accepts).
  explicit InProcessKvStore(int64_t dram_bytes = 16 << 20, int64_t page_bytes = 4 << 20,
                            bool with_ucx = false) {
    char tmpl[] = "/tmp/inprocess_kvstore_XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (dir == nullptr) {
      error_ = absl::InternalError("mkdtemp failed");
      return;
    }
    dir_ = dir;
    uint8_t* arena = nullptr;
    if (with_ucx) {
      auto agent = transfer::KvTransferAgent::Create({});
      if (!agent.ok()) {
        error_ = agent.status();
        return;
      }
      agent_ = *std::move(agent);
      auto region = agent_->AllocateRegion(dram_bytes);
      if (!region.ok()) {
        error_ = region.status();
        return;
      }
      arena = static_cast<uint8_t*>(region->base);
    } else {
      arena_.resize(static_cast<size_t>(dram_bytes));
      arena = arena_.data();
    }
    kvstore::BlockStoreOptions o;
    o.dram_arena = arena;
    o.dram_bytes = dram_bytes;
    o.dram_page_bytes = page_bytes;
    o.ssd_dir = dir_;
    o.ssd_bytes = 4 * dram_bytes;
    auto store = kvstore::BlockStore::Open(o);
    if (!store.ok()) {
      error_ = store.status();
      return;
    }
    store_ = *std::move(store);
    service_ = std::make_unique<kvstore::KvStoreService>(store_.get(), agent_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      error_ = absl::InternalError("kvstore test server did not start");
      return;
    }
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~InProcessKvStore() {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    }
    server_.reset();
    service_.reset();
    store_.reset();
    agent_.reset();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  InProcessKvStore(const InProcessKvStore&) = delete;
  InProcessKvStore& operator=(const InProcessKvStore&) = delete;

  const absl::Status& status() const { return error_; }  // OK when serving
  const std::string& address() const { return address_; }
  kvstore::BlockStore& store() { return *store_; }

 private:
  absl::Status error_;
  std::string dir_;
  std::unique_ptr<transfer::KvTransferAgent> agent_;  // with_ucx: owns the arena
  std::vector<uint8_t> arena_;
  std::unique_ptr<kvstore::BlockStore> store_;
  std::unique_ptr<kvstore::KvStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UTIL_INPROCESS_KVSTORE_H_
