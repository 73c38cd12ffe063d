// KV block transfer between workers: one-sided RMA (get = pull, put = push)
// over registered memory, described by a serializable descriptor that rides the
// gRPC control path.
//
// The KV bytes never ride gRPC: prefill registers its KV cache regions once,
// sends a RemoteKvDescriptor (worker address + per-region base address and
// remote key + block geometry) inside a protobuf `bytes` field, and the decode
// worker pulls block runs directly (or prefill pushes into blocks decode
// reserved). See docs/design.md, "KV bytes never ride the RPC path".
//
// Typical use on the CPU backend (KvCache: per layer k and v arrays of
// [num_blocks, block_size, floats_per_token] float32, so one block of one array
// is block_size * floats_per_token * 4 bytes):
//
//   auto agent = KvTransferAgent::Create({});                       // once per
//   process std::vector<KvRegion> regions = {{cache.k(0), n, kb}, {cache.v(0),
//   n, vb}, ...}; for (auto& r : regions) agent->RegisterRegion(r.base,
//   r.num_blocks * r.block_bytes);
//   // prefill side:
//   auto desc = agent->Describe(regions);        // -> desc->Serialize() into
//   the proto
//   // decode side:
//   auto remote = RemoteKvDescriptor::Parse(bytes_from_proto);
//   agent->Pull(*remote, CoalesceBlocks(prefill_block_ids), regions,
//               CoalesceBlocks(my_block_ids), absl::Now() + absl::Seconds(5));
//
// Region i of the local list pairs with region i of the descriptor; both must
// have the same block_bytes. Blocks within a region are contiguous (block b at
// base + b * block_bytes), so a run of consecutive blocks is one RMA operation
// per region.
#ifndef SLUICE_TRANSFER_KV_TRANSFER_H_
#define SLUICE_TRANSFER_KV_TRANSFER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transfer/block_runs.h"

namespace sluice::transfer {

// KvRegion: one local array of equally sized, contiguous KV blocks, e.g. the k
// array of one layer: block b occupies bytes [base + b * block_bytes, base + (b
// + 1) * block_bytes). The memory must lie inside a range registered with
// RegisterRegion on the agent that uses it and must outlive every transfer that
// touches it.
struct KvRegion {
  void* base = nullptr;
  int64_t num_blocks = 0;
  int64_t block_bytes = 0;  // bytes of one block in this region
};

// RemoteRegion: a peer's KvRegion as seen from another process.
struct RemoteRegion {
  uint64_t base_address = 0;  // virtual address of block 0 in the owner's address space
  int64_t num_blocks = 0;
  int64_t block_bytes = 0;
  std::string rkey;  // packed UCX remote key (ucp_rkey_pack) of the
                     // registration covering it
};

// RemoteKvDescriptor: everything a peer needs to read or write our KV blocks.
// Serialize() gives an opaque byte string (versioned, little-endian binary) for
// a protobuf `bytes` field; Parse() validates it fully (truncation, bad
// magic/version, absurd sizes, address overflow) and returns InvalidArgument
// instead of crashing on garbage.
struct RemoteKvDescriptor {
  std::string worker_address;  // ucp_worker_get_address bytes of the owning agent
  std::vector<RemoteRegion> regions;

  std::string Serialize() const;
  static absl::StatusOr<RemoteKvDescriptor> Parse(std::string_view bytes);

  // SelectRegions: a copy holding only regions [first, first + count), e.g. the
  // k and v regions of one layer for a layer-by-layer push. InvalidArgument if
  // the range is out of bounds.
  absl::StatusOr<RemoteKvDescriptor> SelectRegions(size_t first, size_t count) const;
};

// MemoryType: where a registered range lives. kCuda: CUDA device memory (cudaMalloc); UCX moves
// it with its CUDA transports (cuda_ipc between processes of one host, cuda_copy staging) when
// the linked UCX is CUDA-aware (cmake/ucx.cmake).
enum class MemoryType { kHost, kCuda };
const char* MemoryTypeName(MemoryType type);
// LinkedUcxIsCudaAware: whether this build links a UCX with CUDA support (cmake/ucx.cmake), i.e.
// whether kCuda can work at all (a device and driver are still needed at run time).
bool LinkedUcxIsCudaAware();

// RegionHandle: one registration (RegisterRegion). `rkey` is the packed remote
// key peers use.
struct RegionHandle {
  uint64_t id = 0;  // 0 is never a valid id
  void* base = nullptr;
  int64_t bytes = 0;
  std::string rkey;
};

// KvTransferOptions: how the agent sets up UCX.
struct KvTransferOptions {
  // UCX transports (same syntax as the UCX_TLS environment variable, e.g. "sm",
  // "tcp", "posix,cma,self", "rc,sm"). Empty: the UCX_TLS environment variable
  // if set, else UCX's own choice of everything available.
  std::string transports;
  // Runs a background thread that progresses the UCX worker (sleeping on its
  // event fd when idle). Needed for a peer to pull from / push to us over
  // transports that emulate RMA in software (tcp): the target must progress.
  // Tests turn it off to simulate a stuck peer.
  bool progress_thread = true;
  // Ask UCX to detect failed peers (UCP_ERR_HANDLING_MODE_PEER): a dead peer's
  // transfers end with Unavailable. Debian's UCX 1.13 shared-memory transports
  // (posix, sysv) lack peer failure handling, so with it on, peers on this host
  // are reached over tcp/cma; turn it off to allow posix/sysv (then a peer that
  // dies mid-transfer is only caught by the deadline, and UCX may treat the
  // transport error as fatal). Keep it on for services.
  bool peer_failure_detection = true;
  // Deadline used to tear down endpoints/workers (force close) in the
  // destructor and on errors.
  absl::Duration close_timeout = absl::Seconds(1);
};

// KvTransferStats: cumulative counters since Create (for /metrics).
struct KvTransferStats {
  int64_t bytes_pulled = 0;  // payload bytes read from peers by successful Pulls
  int64_t bytes_pushed = 0;  // payload bytes written to peers by successful Pushes
  int64_t num_rma_ops = 0;   // RMA operations posted (one per run pair per region)
  int64_t num_transfers_ok = 0;
  int64_t num_transfers_failed = 0;  // includes deadline exceeded
  int64_t num_endpoints = 0;         // endpoints currently cached
  int64_t num_cached_rkeys = 0;      // unpacked peer remote keys cached (one per peer registration)
};

// KvTransferAgent: one UCX context + worker; registers memory and moves KV
// block runs.
//
// Thread safety: every method may be called from any thread; an internal mutex
// serializes access to the UCX worker (transfers from several threads run one
// at a time on the worker; create several agents for parallel independent
// transfers). Endpoints: one per peer worker address, created on first use and
// cached, with the peer's unpacked remote keys (unpacking maps the peer's memory
// on shared-memory transports: doing it per transfer cost more than the copy); a
// transfer that fails on a peer drops its endpoint and keys (the next call
// reconnects). Waiting: every wait takes an absolute deadline; on expiry the
// transfer's endpoint is force closed (its operations cancelled, so no RMA
// touches the buffers after the call returns) and DeadlineExceeded is returned.
// A peer that is gone or fails gives Unavailable.
class KvTransferAgent {
 public:
  // Create: a ready agent. Errors: Internal/Unavailable if UCX cannot be
  // initialized with the requested transports (e.g. an unknown transport name).
  static absl::StatusOr<std::unique_ptr<KvTransferAgent>> Create(const KvTransferOptions& options);

  virtual ~KvTransferAgent() = default;

  // worker_address: this agent's UCX worker address bytes (the descriptor's
  // worker_address).
  virtual const std::string& worker_address() const = 0;

  // RegisterRegion: registers [base, base + bytes) of memory `type` for RMA by
  // peers and as a local source or destination. Returns its handle with the
  // packed remote key. The memory must stay valid until DeregisterRegion or the
  // agent's destruction. Errors: InvalidArgument for a null base or bytes <= 0;
  // FailedPrecondition for a type this agent cannot move (SupportsMemoryType);
  // Internal if UCX fails to map/pack.
  virtual absl::StatusOr<RegionHandle> RegisterRegion(void* base, int64_t bytes,
                                                      MemoryType type) = 0;
  absl::StatusOr<RegionHandle> RegisterRegion(void* base, int64_t bytes) {
    return RegisterRegion(base, bytes, MemoryType::kHost);
  }

  // SupportsMemoryType: whether this agent's UCX context can register and move
  // memory of `type` (kHost: always; kCuda: a CUDA-aware UCX that found a CUDA
  // device).
  virtual bool SupportsMemoryType(MemoryType type) const = 0;

  // AllocateRegion: allocates `bytes` of host memory through UCX (ucp_mem_map with
  // UCP_MEM_MAP_ALLOCATE) and registers it; `base` of the handle is the memory (contents
  // unspecified). UCX places it where its transports reach it fastest: on one host, a shared-memory
  // segment that posix/sysv map directly into the peer, so RMA is a memcpy instead of emulated
  // messages (Debian's UCX 1.13 has no usable cma RMA lane for user memory). DeregisterRegion frees
  // it. Errors: InvalidArgument for bytes <= 0; ResourceExhausted/Internal if UCX cannot allocate.
  virtual absl::StatusOr<RegionHandle> AllocateRegion(int64_t bytes) = 0;

  // DeregisterRegion: unregisters a handle's memory. The caller must ensure no
  // transfer uses it. Errors: NotFound for an unknown id.
  virtual absl::Status DeregisterRegion(uint64_t id) = 0;

  // Describe: the descriptor a peer needs for `regions` (each must lie inside a
  // registration: otherwise FailedPrecondition).
  virtual absl::StatusOr<RemoteKvDescriptor> Describe(absl::Span<const KvRegion> regions) = 0;

  // Pull: RMA-reads remote blocks into local blocks: for every region index i
  // and every paired run (PairRuns(remote_runs, local_runs)), one get of
  // num_blocks * block_bytes bytes from remote.regions[i] block remote_first to
  // local_regions[i] block local_first. Returns when all bytes are in local
  // memory. Errors: InvalidArgument (region count or block_bytes mismatch, runs
  // out of range, runs of different totals, unparsable remote key/address);
  // FailedPrecondition (local region not registered); DeadlineExceeded (not
  // done by `deadline`; operations are cancelled); Unavailable (peer
  // unreachable or failed). Local blocks are unspecified after an error.
  virtual absl::Status Pull(const RemoteKvDescriptor& remote,
                            absl::Span<const BlockRun> remote_runs,
                            absl::Span<const KvRegion> local_regions,
                            absl::Span<const BlockRun> local_runs, absl::Time deadline) = 0;

  // Push: the mirror of Pull: RMA-writes local blocks into remote blocks and
  // returns when they are complete at the target (endpoint flushed). Same
  // errors; remote blocks are unspecified after an error.
  virtual absl::Status Push(const RemoteKvDescriptor& remote,
                            absl::Span<const BlockRun> remote_runs,
                            absl::Span<const KvRegion> local_regions,
                            absl::Span<const BlockRun> local_runs, absl::Time deadline) = 0;

  // DropPeer: closes and forgets the cached endpoint to `worker_address` (no-op
  // if none), e.g. when the router reports the peer dead.
  virtual void DropPeer(const std::string& worker_address) = 0;

  // stats: a snapshot of the counters.
  virtual KvTransferStats stats() const = 0;
};

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_KV_TRANSFER_H_
