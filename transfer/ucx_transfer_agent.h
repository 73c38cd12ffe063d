// UcxTransferAgent: the UCX (UCP) implementation of KvTransferAgent (see
// kv_transfer.h).
//
// One ucp_context (features RMA + WAKEUP) and one ucp_worker per agent. Memory
// is registered with ucp_mem_map and exported with ucp_rkey_pack; transfers
// post one ucp_get_nbx / ucp_put_nbx per (region, run pair), then progress the
// worker until every operation (and, for puts, an endpoint flush) completes,
// the endpoint fails, or the deadline passes. UCP API reference:
// https://openucx.readthedocs.io/en/master/api/file/ucp_8h.html
#ifndef SLUICE_TRANSFER_UCX_TRANSFER_AGENT_H_
#define SLUICE_TRANSFER_UCX_TRANSFER_AGENT_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "transfer/kv_transfer.h"

namespace sluice::transfer {

class UcxTransferAgent final : public KvTransferAgent {
 public:
  // Create: see KvTransferAgent::Create.
  static absl::StatusOr<std::unique_ptr<UcxTransferAgent>> Create(const KvTransferOptions& options);

  // Stops the progress thread, force-closes endpoints, unregisters memory,
  // destroys the worker and context. No transfer may be running.
  ~UcxTransferAgent() override;

  UcxTransferAgent(const UcxTransferAgent&) = delete;
  UcxTransferAgent& operator=(const UcxTransferAgent&) = delete;

  const std::string& worker_address() const override { return worker_address_; }
  using KvTransferAgent::RegisterRegion;
  absl::StatusOr<RegionHandle> RegisterRegion(void* base, int64_t bytes,
                                              MemoryType type) override;
  bool SupportsMemoryType(MemoryType type) const override;
  absl::StatusOr<RegionHandle> AllocateRegion(int64_t bytes) override;
  absl::Status DeregisterRegion(uint64_t id) override;
  absl::StatusOr<RemoteKvDescriptor> Describe(absl::Span<const KvRegion> regions) override;
  absl::Status Pull(const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
                    absl::Span<const KvRegion> local_regions, absl::Span<const BlockRun> local_runs,
                    absl::Time deadline) override;
  absl::Status Push(const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
                    absl::Span<const KvRegion> local_regions, absl::Span<const BlockRun> local_runs,
                    absl::Time deadline) override;
  void DropPeer(const std::string& worker_address) override;
  KvTransferStats stats() const override;

 private:
  struct Registration {
    char* base = nullptr;
    int64_t bytes = 0;
    ucp_mem_h memh = nullptr;
    std::string rkey;
  };

  explicit UcxTransferAgent(const KvTransferOptions& options);
  absl::Status Init();
  // Maps (base != nullptr: registers; base == nullptr: allocates) and records a region.
  absl::StatusOr<RegionHandle> MapRegion(void* base, int64_t bytes, MemoryType type);

  // Shared body of Pull (is_put = false) and Push (is_put = true).
  absl::Status Transfer(const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
                        absl::Span<const KvRegion> local_regions,
                        absl::Span<const BlockRun> local_runs, absl::Time deadline, bool is_put);

  // The registration containing [base, base + bytes), or nullptr.
  const Registration* FindRegistration(const void* base, int64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ucp_ep_h> GetEndpoint(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Force-closes `ep` (cancelling its operations), waiting at most
  // close_timeout, and forgets it and its cached remote keys.
  void CloseEndpoint(ucp_ep_h ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The unpacked remote key for packed `rkey` on `ep`, from the cache or unpacked now. Unpacking
  // is the expensive part of a small transfer: on shared memory it attaches (maps) the peer's
  // segment, and a fresh mapping page-faults on every page the RMA touches.
  absl::StatusOr<ucp_rkey_h> GetRkey(ucp_ep_h ep, const std::string& rkey)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys the oldest cached keys of `ep` beyond kMaxRkeysPerEndpoint (none in flight: called
  // after a transfer completes).
  void TrimRkeys(ucp_ep_h ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Progresses the worker until `done()` or `ep` fails or `deadline`; spins
  // briefly, then sleeps on the worker's event fd in slices of at most 1 ms.
  template <typename Done>
  absl::Status WaitLocked(ucp_ep_h ep, absl::Time deadline, Done done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ProgressLoop();
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  const KvTransferOptions options_;
  ucp_context_h context_ = nullptr;
  uint64_t memory_types_ = 0;  // UCS_BIT(ucs_memory_type_t) the context supports
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::string worker_address_;
  std::thread progress_thread_;
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mu_;
  uint64_t next_region_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Registration> registrations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ucp_ep_h> endpoints_ ABSL_GUARDED_BY(mu_);
  // Unpacked remote keys per endpoint, by packed bytes, kept until the endpoint closes (a peer's
  // KV registrations live as long as its cache). Bounded, oldest first out, so a peer that
  // re-registers often cannot pin its old segments here forever.
  struct RkeyCache {
    absl::flat_hash_map<std::string, ucp_rkey_h> keys;
    std::deque<std::string> order;  // insertion order of `keys`
  };
  static constexpr size_t kMaxRkeysPerEndpoint = 256;
  absl::flat_hash_map<ucp_ep_h, RkeyCache> rkeys_ ABSL_GUARDED_BY(mu_);
  // Endpoints UCX reported as failed (set from OnEndpointError, which runs
  // inside ucp_worker_progress, i.e. with mu_ held).
  absl::flat_hash_set<ucp_ep_h> failed_endpoints_ ABSL_GUARDED_BY(mu_);
  KvTransferStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_UCX_TRANSFER_AGENT_H_
