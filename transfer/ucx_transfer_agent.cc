#include "transfer/ucx_transfer_agent.h"

#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transfer/transfer_validation.h"
#include "transfer/ucx_transports.h"

namespace sluice::transfer {
namespace {

absl::Status UcsError(absl::StatusCode code, const char* what, ucs_status_t status) {
  return absl::Status(code, absl::StrCat(what, ": ", ucs_status_string(status)));
}

// Maps the completion status of an RMA/flush request to our error contract.
absl::Status FromUcs(const char* what, ucs_status_t status) {
  if (status == UCS_OK) return absl::OkStatus();
  if (status == UCS_ERR_TIMED_OUT)
    return UcsError(absl::StatusCode::kDeadlineExceeded, what, status);
  return UcsError(absl::StatusCode::kUnavailable, what, status);
}

int PollTimeoutMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return left >= absl::Milliseconds(1) ? 1 : 0;
}

}  // namespace

const char* MemoryTypeName(MemoryType type) { return type == MemoryType::kCuda ? "cuda" : "host"; }

bool LinkedUcxIsCudaAware() { return SLUICE_UCX_CUDA != 0; }

absl::StatusOr<std::unique_ptr<KvTransferAgent>> KvTransferAgent::Create(
    const KvTransferOptions& options) {
  auto agent = UcxTransferAgent::Create(options);
  if (!agent.ok()) return agent.status();
  return std::unique_ptr<KvTransferAgent>(std::move(*agent));
}

absl::StatusOr<std::unique_ptr<UcxTransferAgent>> UcxTransferAgent::Create(
    const KvTransferOptions& options) {
  std::unique_ptr<UcxTransferAgent> agent(new UcxTransferAgent(options));
  if (absl::Status s = agent->Init(); !s.ok()) return s;
  return agent;
}

UcxTransferAgent::UcxTransferAgent(const KvTransferOptions& options) : options_(options) {}

absl::Status UcxTransferAgent::Init() {
  if (options_.peer_failure_detection) {
    const char* env = std::getenv("UCX_TLS");
    const std::string tls = !options_.transports.empty() ? options_.transports
                            : env != nullptr             ? env
                                                         : "";
    if (absl::Status s = CheckPeerFailureTransports(tls); !s.ok()) return s;
  }
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcsError(absl::StatusCode::kInternal, "ucp_config_read", st);
  if (!options_.transports.empty()) {
    st = ucp_config_modify(config, "TLS", options_.transports.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return UcsError(absl::StatusCode::kInvalidArgument,
                      absl::StrCat("UCX transports '", options_.transports, "'").c_str(), st);
    }
  }
  // Each KV array is registered once and whole, so UCX's default of widening a CUDA registration
  // to the whole allocation (MEMTYPE_REG_WHOLE_ALLOC_TYPES=cuda) gains nothing here, and it asks
  // the driver for the allocation's range: a host that answers with an empty range makes
  // ucp_mem_map fail ("failed to insert region [0x0..0x0]: Invalid parameter"). The operator's
  // UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES, when set, wins; a UCX without the key keeps its default.
  if (std::getenv("UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES") == nullptr) {
    (void)ucp_config_modify(config, "MEMTYPE_REG_WHOLE_ALLOC_TYPES", "");
  }
  // cuda_ipc turns get_zcopy off by default ("auto") on GPUs without active NVLink (UCX PR
  // #7566: concurrent reads there ran slower than puts), and a pull (ucp_get) of device KV then
  // goes through another protocol: 0.7 GB/s on one H100 of a VM, where the same process pair
  // puts at 92-399 GB/s (bench/results/gpu_h100_20261206/kv_transfer_cuda_ipc_pull_slow.json).
  // Any cuda_ipc get beats that, so it is on unless the operator set
  // UCX_CUDA_IPC_ENABLE_GET_ZCOPY; a UCX without cuda_ipc ignores the key.
  if (std::getenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY") == nullptr) {
    (void)ucp_config_modify(config, "CUDA_IPC_ENABLE_GET_ZCOPY", "y");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcsError(absl::StatusCode::kUnavailable, "ucp_init", st);
  ucp_context_attr_t cattr{};
  cattr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &cattr) == UCS_OK) memory_types_ = cattr.memory_types;

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // All worker calls happen with mu_ held.
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return UcsError(absl::StatusCode::kUnavailable, "ucp_worker_create", st);

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(worker_, &address, &address_length);
  if (st != UCS_OK) return UcsError(absl::StatusCode::kInternal, "ucp_worker_get_address", st);
  worker_address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);

  st = ucp_worker_get_efd(worker_, &event_fd_);
  if (st != UCS_OK) return UcsError(absl::StatusCode::kInternal, "ucp_worker_get_efd", st);
  if (options_.progress_thread) progress_thread_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

UcxTransferAgent::~UcxTransferAgent() {
  if (progress_thread_.joinable()) {
    stop_.store(true);
    ucp_worker_signal(worker_);
    progress_thread_.join();
  }
  absl::MutexLock lock(&mu_);
  if (worker_ != nullptr) {
    std::vector<ucp_ep_h> eps;
    for (const auto& [address, ep] : endpoints_) eps.push_back(ep);
    for (ucp_ep_h ep : eps) CloseEndpoint(ep);
  }
  for (auto& [id, reg] : registrations_) ucp_mem_unmap(context_, reg.memh);
  registrations_.clear();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxTransferAgent::ProgressLoop() {
  while (!stop_.load()) {
    ucs_status_t armed;
    {
      absl::MutexLock lock(&mu_);
      while (ucp_worker_progress(worker_) != 0) {
      }
      armed = ucp_worker_arm(worker_);
    }
    if (armed == UCS_OK) {
      pollfd pfd{event_fd_, POLLIN, 0};
      // Bounded sleep: a missed wakeup costs at most 100 ms, never a hang.
      poll(&pfd, 1, 100);
    } else if (armed != UCS_ERR_BUSY) {
      poll(nullptr, 0, 1);
    }
  }
}

void UcxTransferAgent::OnEndpointError(void* arg, ucp_ep_h ep,
                                       ucs_status_t status) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Runs inside ucp_worker_progress, which is only called with mu_ held.
  static_cast<UcxTransferAgent*>(arg)->failed_endpoints_.insert(ep);
}

bool UcxTransferAgent::SupportsMemoryType(MemoryType type) const {
  if (type == MemoryType::kHost) return true;
  // Debian's UCX 1.13 has no CUDA support at all; a CUDA-aware UCX reports CUDA memory only
  // when its cuda module loaded (libcuda present) and found a device.
  return SLUICE_UCX_CUDA != 0 && (memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

absl::StatusOr<RegionHandle> UcxTransferAgent::RegisterRegion(void* base, int64_t bytes,
                                                              MemoryType type) {
  if (base == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterRegion needs a non-null base and bytes > 0, got bytes=", bytes));
  }
  if (!SupportsMemoryType(type)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this UCX cannot register ", MemoryTypeName(type),
        " memory (", SLUICE_UCX_CUDA != 0 ? "no CUDA device or driver found"
                                          : "built against a UCX without CUDA: see cmake/ucx.cmake",
        "); stage it through host memory (transfer/staged_transfer.h)"));
  }
  return MapRegion(base, bytes, type);
}

absl::StatusOr<RegionHandle> UcxTransferAgent::AllocateRegion(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("AllocateRegion needs bytes > 0, got ", bytes));
  }
  return MapRegion(nullptr, bytes, MemoryType::kHost);
}

absl::StatusOr<RegionHandle> UcxTransferAgent::MapRegion(void* base, int64_t bytes,
                                                         MemoryType type) {
  ucp_mem_map_params_t mparams{};
  mparams.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                       UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  mparams.address = base;
  mparams.length = static_cast<size_t>(bytes);
  mparams.flags = base == nullptr ? UCP_MEM_MAP_ALLOCATE : 0;
  // Given, not detected: UCX then registers device memory with its CUDA memory domains
  // (cuda_ipc handles for peers) instead of probing the pointer.
  mparams.memory_type = type == MemoryType::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  absl::MutexLock lock(&mu_);
  Registration reg;
  ucs_status_t st = ucp_mem_map(context_, &mparams, &reg.memh);
  if (st != UCS_OK) {
    return UcsError(st == UCS_ERR_NO_MEMORY ? absl::StatusCode::kResourceExhausted
                                            : absl::StatusCode::kInternal,
                    "ucp_mem_map", st);
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(reg.memh, &attr);
  if (st != UCS_OK || attr.length < static_cast<size_t>(bytes)) {
    ucp_mem_unmap(context_, reg.memh);
    return UcsError(absl::StatusCode::kInternal, "ucp_mem_query", st);
  }
  reg.base = static_cast<char*>(attr.address);
  reg.bytes = bytes;
  void* packed = nullptr;
  size_t packed_size = 0;
  st = ucp_rkey_pack(context_, reg.memh, &packed, &packed_size);
  if (st != UCS_OK) {
    ucp_mem_unmap(context_, reg.memh);
    return UcsError(absl::StatusCode::kInternal, "ucp_rkey_pack", st);
  }
  reg.rkey.assign(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  const uint64_t id = next_region_id_++;
  RegionHandle handle{id, reg.base, bytes, reg.rkey};
  registrations_.emplace(id, std::move(reg));
  return handle;
}

absl::Status UcxTransferAgent::DeregisterRegion(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = registrations_.find(id);
  if (it == registrations_.end()) {
    return absl::NotFoundError(absl::StrCat("no registered region with id ", id));
  }
  ucp_mem_unmap(context_, it->second.memh);
  registrations_.erase(it);
  return absl::OkStatus();
}

const UcxTransferAgent::Registration* UcxTransferAgent::FindRegistration(const void* base,
                                                                         int64_t bytes) const {
  const char* begin = static_cast<const char*>(base);
  for (const auto& [id, reg] : registrations_) {
    if (begin >= reg.base && bytes >= 0 && begin - reg.base <= reg.bytes - bytes) return &reg;
  }
  return nullptr;
}

absl::StatusOr<RemoteKvDescriptor> UcxTransferAgent::Describe(absl::Span<const KvRegion> regions) {
  RemoteKvDescriptor desc;
  desc.worker_address = worker_address_;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < regions.size(); ++i) {
    const KvRegion& r = regions[i];
    if (r.num_blocks < 0 || r.block_bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("region ", i, " has invalid geometry"));
    }
    const Registration* reg = FindRegistration(r.base, r.num_blocks * r.block_bytes);
    if (reg == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("region ", i, " is not inside a registered memory range"));
    }
    desc.regions.push_back(
        {reinterpret_cast<uint64_t>(r.base), r.num_blocks, r.block_bytes, reg->rkey});
  }
  return desc;
}

absl::StatusOr<ucp_ep_h> UcxTransferAgent::GetEndpoint(const std::string& address) {
  if (auto it = endpoints_.find(address); it != endpoints_.end()) return it->second;
  ucp_ep_params_t eparams{};
  eparams.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                       UCP_EP_PARAM_FIELD_ERR_HANDLER;
  eparams.address = reinterpret_cast<const ucp_address_t*>(address.data());
  // PEER mode: UCX detects a dead peer (keepalive / transport errors) and calls
  // us back.
  eparams.err_mode =
      options_.peer_failure_detection ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  eparams.err_handler.cb = &UcxTransferAgent::OnEndpointError;
  eparams.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  ucs_status_t st = ucp_ep_create(worker_, &eparams, &ep);
  if (st != UCS_OK) return UcsError(absl::StatusCode::kUnavailable, "ucp_ep_create", st);
  endpoints_.emplace(address, ep);
  stats_.num_endpoints = static_cast<int64_t>(endpoints_.size());
  return ep;
}

void UcxTransferAgent::CloseEndpoint(ucp_ep_h ep) {
  for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it) {
    if (it->second == ep) {
      endpoints_.erase(it);
      break;
    }
  }
  stats_.num_endpoints = static_cast<int64_t>(endpoints_.size());
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) {
    const absl::Time deadline = absl::Now() + options_.close_timeout;
    while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(request);
  }
  // The force close cancelled every operation, so no RMA uses these keys any more.
  if (auto it = rkeys_.find(ep); it != rkeys_.end()) {
    for (auto& [packed, rkey] : it->second.keys) ucp_rkey_destroy(rkey);
    rkeys_.erase(it);
  }
  failed_endpoints_.erase(ep);
}

absl::StatusOr<ucp_rkey_h> UcxTransferAgent::GetRkey(ucp_ep_h ep, const std::string& rkey) {
  RkeyCache& cache = rkeys_[ep];
  if (auto it = cache.keys.find(rkey); it != cache.keys.end()) return it->second;
  ucp_rkey_h handle = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(ep, rkey.data(), &handle);
  if (st != UCS_OK) return UcsError(absl::StatusCode::kInvalidArgument, "ucp_ep_rkey_unpack", st);
  cache.keys.emplace(rkey, handle);
  cache.order.push_back(rkey);
  return handle;
}

void UcxTransferAgent::TrimRkeys(ucp_ep_h ep) {
  auto it = rkeys_.find(ep);
  if (it == rkeys_.end()) return;
  RkeyCache& cache = it->second;
  while (cache.order.size() > kMaxRkeysPerEndpoint) {
    auto key = cache.keys.find(cache.order.front());
    ucp_rkey_destroy(key->second);
    cache.keys.erase(key);
    cache.order.pop_front();
  }
}

void UcxTransferAgent::DropPeer(const std::string& worker_address) {
  absl::MutexLock lock(&mu_);
  if (auto it = endpoints_.find(worker_address); it != endpoints_.end()) CloseEndpoint(it->second);
}

template <typename Done>
absl::Status UcxTransferAgent::WaitLocked(ucp_ep_h ep, absl::Time deadline, Done done) {
  int idle_spins = 0;
  while (true) {
    const unsigned progressed = ucp_worker_progress(worker_);
    if (failed_endpoints_.contains(ep)) {
      return absl::UnavailableError("KV transfer peer failed or is unreachable");
    }
    if (done()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("KV transfer did not complete before its deadline");
    }
    if (progressed != 0) {
      idle_spins = 0;
      continue;
    }
    // Nothing to do right now: spin a little (shared-memory completions are
    // fast), then sleep on the event fd so a software-RMA peer (tcp) on this
    // host gets the CPU.
    if (++idle_spins < 256) continue;
    if (ucp_worker_arm(worker_) == UCS_OK) {
      pollfd pfd{event_fd_, POLLIN, 0};
      poll(&pfd, 1, PollTimeoutMs(deadline));
    }
  }
}

absl::Status UcxTransferAgent::Pull(const RemoteKvDescriptor& remote,
                                    absl::Span<const BlockRun> remote_runs,
                                    absl::Span<const KvRegion> local_regions,
                                    absl::Span<const BlockRun> local_runs, absl::Time deadline) {
  return Transfer(remote, remote_runs, local_regions, local_runs, deadline,
                  /*is_put=*/false);
}

absl::Status UcxTransferAgent::Push(const RemoteKvDescriptor& remote,
                                    absl::Span<const BlockRun> remote_runs,
                                    absl::Span<const KvRegion> local_regions,
                                    absl::Span<const BlockRun> local_runs, absl::Time deadline) {
  return Transfer(remote, remote_runs, local_regions, local_runs, deadline,
                  /*is_put=*/true);
}

absl::Status UcxTransferAgent::Transfer(const RemoteKvDescriptor& remote,
                                        absl::Span<const BlockRun> remote_runs,
                                        absl::Span<const KvRegion> local_regions,
                                        absl::Span<const BlockRun> local_runs, absl::Time deadline,
                                        bool is_put) {
  // Validate everything before touching UCX: a bad descriptor is an error,
  // never a crash.
  auto pairs = ValidateTransfer(remote, remote_runs, local_regions, local_runs);
  if (!pairs.ok()) return pairs.status();
  if (remote.worker_address.empty()) {
    return absl::InvalidArgumentError("descriptor has an empty worker address");
  }
  for (size_t i = 0; i < remote.regions.size(); ++i) {
    if (remote.regions[i].rkey.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("region ", i, " has an empty remote key"));
    }
  }
  if (pairs->empty() || local_regions.empty()) return absl::OkStatus();

  absl::MutexLock lock(&mu_);
  std::vector<ucp_mem_h> memhs(local_regions.size());
  for (size_t i = 0; i < local_regions.size(); ++i) {
    const KvRegion& lr = local_regions[i];
    const Registration* reg = FindRegistration(lr.base, lr.num_blocks * lr.block_bytes);
    if (reg == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("local region ", i, " is not inside a registered memory range"));
    }
    memhs[i] = reg->memh;
  }
  auto ep_or = GetEndpoint(remote.worker_address);
  if (!ep_or.ok()) {
    ++stats_.num_transfers_failed;
    return ep_or.status();
  }
  ucp_ep_h ep = *ep_or;

  std::vector<ucp_rkey_h> rkeys;
  std::vector<void*> requests;
  absl::Status status;
  for (size_t i = 0; i < remote.regions.size() && status.ok(); ++i) {
    absl::StatusOr<ucp_rkey_h> rkey = GetRkey(ep, remote.regions[i].rkey);
    if (rkey.ok()) {
      rkeys.push_back(*rkey);
    } else {
      status = rkey.status();
    }
  }

  int64_t bytes = 0;
  for (size_t i = 0; i < local_regions.size() && status.ok(); ++i) {
    const RemoteRegion& rr = remote.regions[i];
    char* local_base = static_cast<char*>(local_regions[i].base);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    param.memh = memhs[i];
    for (const RunPair& p : *pairs) {
      const size_t length = static_cast<size_t>(p.num_blocks) * rr.block_bytes;
      char* local = local_base + static_cast<int64_t>(p.local_first) * rr.block_bytes;
      const uint64_t remote_address =
          rr.base_address + static_cast<uint64_t>(p.remote_first) * rr.block_bytes;
      void* request = is_put ? ucp_put_nbx(ep, local, length, remote_address, rkeys[i], &param)
                             : ucp_get_nbx(ep, local, length, remote_address, rkeys[i], &param);
      ++stats_.num_rma_ops;
      if (UCS_PTR_IS_ERR(request)) {
        status = FromUcs(is_put ? "ucp_put_nbx" : "ucp_get_nbx", UCS_PTR_STATUS(request));
        break;
      }
      if (request != nullptr) requests.push_back(request);
      bytes += static_cast<int64_t>(length);
    }
  }
  // A put is complete locally when its request completes; the flush makes it
  // complete at the target (its memory holds the bytes) before we report
  // success.
  if (status.ok() && is_put) {
    ucp_request_param_t param{};
    void* flush = ucp_ep_flush_nbx(ep, &param);
    if (UCS_PTR_IS_ERR(flush)) {
      status = FromUcs("ucp_ep_flush_nbx", UCS_PTR_STATUS(flush));
    } else if (flush != nullptr) {
      requests.push_back(flush);
    }
  }
  if (status.ok()) {
    status = WaitLocked(ep, deadline, [&] {
      for (void* r : requests) {
        if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      }
      return true;
    });
  }
  if (status.ok()) {
    for (void* r : requests) {
      ucs_status_t st = ucp_request_check_status(r);
      if (st != UCS_OK && status.ok()) status = FromUcs("KV RMA operation", st);
    }
  }
  if (!status.ok()) {
    // Cancels whatever is still in flight, so no RMA touches the buffers after
    // we return (and drops the endpoint's cached keys).
    CloseEndpoint(ep);
  }
  for (void* r : requests) ucp_request_free(r);
  if (status.ok()) TrimRkeys(ep);
  if (status.ok()) {
    (is_put ? stats_.bytes_pushed : stats_.bytes_pulled) += bytes;
    ++stats_.num_transfers_ok;
  } else {
    ++stats_.num_transfers_failed;
  }
  return status;
}

KvTransferStats UcxTransferAgent::stats() const {
  absl::MutexLock lock(&mu_);
  KvTransferStats stats = stats_;
  for (const auto& [ep, cache] : rkeys_) stats.num_cached_rkeys += cache.keys.size();
  return stats;
}

}  // namespace sluice::transfer
