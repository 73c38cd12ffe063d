#include "services/kvstore/kvstore_client.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/rendezvous.h"
#include "sluice/v1/kvstore.grpc.pb.h"
#include "transfer/block_runs.h"

namespace sluice::kvstore {
namespace {

// PageTransfer: the blocks of one call that live in one store page: remote slot i <-> local
// block i, for key index which[i].
struct PageTransfer {
  std::vector<int32_t> remote;
  std::vector<int32_t> local;
  std::vector<size_t> which;
};

// ShardOutcome: what one shard's part of a call produced (written by that shard's task only).
struct ShardOutcome {
  absl::Status error;
  int64_t num_corrupt = 0;
  int64_t num_stored = 0, num_present = 0, num_failed = 0;
};

class GrpcKvStoreClient final : public KvStoreClient {
 public:
  explicit GrpcKvStoreClient(const KvStoreClientOptions& options)
      : options_(options), hrw_(options.shards) {
    for (const std::string& shard : options.shards) {
      grpc::ChannelArguments args;
      // One inline block may be as large as a store page (64 MiB by default).
      args.SetMaxReceiveMessageSize(kMaxMessageBytes);
      args.SetMaxSendMessageSize(kMaxMessageBytes);
      stubs_.push_back(v1::KvStore::NewStub(
          grpc::CreateCustomChannel(shard,
                                    options.credentials != nullptr
                                        ? options.credentials
                                        : grpc::InsecureChannelCredentials(),
                                    args)));
    }
  }

  absl::StatusOr<KvExistsResult> Exists(absl::Span<const BlockKey> keys,
                                        absl::Time deadline) override {
    std::vector<char> found(keys.size(), 0);
    std::vector<ShardOutcome> outcomes = ForEachShard(keys, [&](int shard,
                                                                const std::vector<size_t>& idx,
                                                                ShardOutcome& out) {
      v1::KvExistsRequest req;
      for (size_t i : idx) ToBlockId(keys[i], req.add_blocks());
      v1::KvExistsResponse resp;
      grpc::ClientContext ctx;
      SetDeadline(ctx, deadline);
      absl::Status s = FromGrpc(stubs_[shard]->Exists(&ctx, req, &resp));
      if (s.ok() && resp.tiers_size() != static_cast<int>(idx.size())) {
        s = absl::InternalError("Exists answered the wrong number of blocks");
      }
      if (!s.ok()) {
        out.error = ShardError(shard, s);
        return;
      }
      for (size_t j = 0; j < idx.size(); ++j) found[idx[j]] = resp.tiers(j) != v1::BLOCK_TIER_NONE;
    });
    KvExistsResult result;
    result.found.assign(found.begin(), found.end());
    for (const ShardOutcome& o : outcomes) {
      if (result.error.ok()) result.error = o.error;
    }
    return result;
  }

  absl::StatusOr<KvPutResult> Put(absl::Span<const BlockKey> keys,
                                  const transfer::KvRegion& local,
                                  absl::Span<const int32_t> block_ids,
                                  absl::Time deadline) override {
    if (absl::Status s = Validate(keys, local, block_ids); !s.ok()) return s;
    std::vector<ShardOutcome> outcomes =
        ForEachShard(keys, [&](int shard, const std::vector<size_t>& idx, ShardOutcome& out) {
          const bool inline_path = options_.agent == nullptr;
          // Rounds: keys the store had no free slot for (all leased, e.g. by an earlier chunk
          // of this call) go again once the chunks before them are committed, while that helps.
          std::vector<size_t> pending = idx;
          while (!pending.empty()) {
            std::vector<size_t> retry;
            for (const std::vector<size_t>& chunk :
                 Chunks(pending, local.block_bytes,
                        inline_path ? kInlineBytesPerCall : kUcxBytesPerCall)) {
              if (!out.error.ok()) {  // this shard failed: do not wait on it again in this call
                out.num_failed += static_cast<int64_t>(chunk.size());
              } else if (inline_path) {
                PutInlineShard(shard, chunk, keys, local, block_ids, deadline, out, retry);
              } else {
                PutShard(shard, chunk, keys, local, block_ids, deadline, out, retry);
              }
            }
            if (retry.size() == pending.size()) {  // no progress: no room at all
              out.num_failed += static_cast<int64_t>(retry.size());
              break;
            }
            pending = std::move(retry);
          }
        });
    KvPutResult result;
    for (const ShardOutcome& o : outcomes) {
      result.num_stored += o.num_stored;
      result.num_present += o.num_present;
      result.num_failed += o.num_failed;
      if (result.error.ok()) result.error = o.error;
    }
    return result;
  }

  absl::StatusOr<KvGetResult> Get(absl::Span<const BlockKey> keys,
                                  const transfer::KvRegion& local,
                                  absl::Span<const int32_t> block_ids,
                                  absl::Time deadline) override {
    if (absl::Status s = Validate(keys, local, block_ids); !s.ok()) return s;
    std::vector<char> found(keys.size(), 0);
    std::vector<ShardOutcome> outcomes =
        ForEachShard(keys, [&](int shard, const std::vector<size_t>& idx, ShardOutcome& out) {
          const bool inline_path = options_.agent == nullptr;
          // Rounds: blocks the store could not promote from SSD (every DRAM slot leased, e.g.
          // by an earlier chunk of this call) are asked again after those leases are released.
          std::vector<size_t> pending = idx;
          while (!pending.empty()) {
            std::vector<size_t> retry;
            for (const std::vector<size_t>& chunk :
                 Chunks(pending, local.block_bytes,
                        inline_path ? kInlineBytesPerCall : kUcxBytesPerCall)) {
              if (!out.error.ok()) break;  // this shard failed: its remaining keys are misses
              if (inline_path) {
                GetInlineShard(shard, chunk, keys, local, block_ids, deadline, found, out);
              } else {
                GetShard(shard, chunk, keys, local, block_ids, deadline, found, out, retry);
              }
            }
            if (!out.error.ok() || retry.size() == pending.size()) break;
            pending = std::move(retry);
          }
        });
    KvGetResult result;
    result.found.assign(found.begin(), found.end());
    for (const ShardOutcome& o : outcomes) {
      result.num_corrupt += o.num_corrupt;
      if (result.error.ok()) result.error = o.error;
    }
    return result;
  }

 private:
  // Inline calls carry about this many payload bytes each (under gRPC's default 4 MiB message
  // limit, which the store may keep); a larger block goes alone, up to kMaxMessageBytes.
  static constexpr int64_t kInlineBytesPerCall = 3 << 20;
  static constexpr int kMaxMessageBytes = 256 << 20;
  // UCX calls move about this many bytes per PutBegin/PutCommit (or GetBegin/Release) round:
  // the store writes a commit through to SSD (and reads promotions from it) inside the RPC, so
  // a batch's RPC time grows with its bytes and must stay well inside rpc_timeout.
  static constexpr int64_t kUcxBytesPerCall = 32 << 20;

  // Chunks: `idx` split into runs of at most max(1, bytes_per_call / block_bytes) keys.
  static std::vector<std::vector<size_t>> Chunks(const std::vector<size_t>& idx,
                                                 int64_t block_bytes, int64_t bytes_per_call) {
    const size_t per_call =
        static_cast<size_t>(std::max<int64_t>(1, bytes_per_call / block_bytes));
    std::vector<std::vector<size_t>> chunks;
    for (size_t i = 0; i < idx.size(); i += per_call) {
      chunks.emplace_back(idx.begin() + i, idx.begin() + std::min(idx.size(), i + per_call));
    }
    return chunks;
  }

  using ShardFn = std::function<void(int, const std::vector<size_t>&, ShardOutcome&)>;

  // ForEachShard: groups key indices by owning shard and runs `fn` once per shard with keys,
  // in parallel; returns every shard's outcome (index = shard).
  std::vector<ShardOutcome> ForEachShard(absl::Span<const BlockKey> keys, const ShardFn& fn) {
    std::vector<std::vector<size_t>> parts(stubs_.size());
    for (size_t i = 0; i < keys.size(); ++i) parts[hrw_.Pick(keys[i])].push_back(i);
    std::vector<ShardOutcome> outcomes(stubs_.size());
    std::vector<std::future<void>> tasks;
    int last = -1;
    for (size_t s = 0; s < parts.size(); ++s) {
      if (parts[s].empty()) continue;
      if (last >= 0) {
        tasks.push_back(std::async(std::launch::async, fn, last, std::cref(parts[last]),
                                   std::ref(outcomes[last])));
      }
      last = static_cast<int>(s);
    }
    if (last >= 0) fn(last, parts[last], outcomes[last]);  // the last shard on this thread
    for (auto& t : tasks) t.get();  // each task is bounded by the call's deadline
    return outcomes;
  }

  void SetDeadline(grpc::ClientContext& ctx, absl::Time deadline) const {
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + options_.rpc_timeout)));
  }

  absl::Status ShardError(int shard, const absl::Status& s) const {
    return absl::Status(s.code(), absl::StrCat("kvstore ", options_.shards[shard], ": ",
                                               s.message()));
  }

  static absl::Status Validate(absl::Span<const BlockKey> keys, const transfer::KvRegion& local,
                               absl::Span<const int32_t> block_ids) {
    if (keys.size() != block_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys but ", block_ids.size(),
                                                     " local blocks"));
    }
    if (local.base == nullptr || local.block_bytes <= 0) {
      return absl::InvalidArgumentError("local region has no memory or block size");
    }
    for (int32_t b : block_ids) {
      if (b < 0 || b >= local.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("local block ", b, " outside [0, ",
                                                       local.num_blocks, ")"));
      }
    }
    absl::flat_hash_set<BlockKey> seen;
    for (const BlockKey& k : keys) {
      if (!seen.insert(k).second) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate block key ", k.ToHex()));
      }
    }
    return absl::OkStatus();
  }

  static uint8_t* Block(const transfer::KvRegion& local, int32_t b) {
    return static_cast<uint8_t*>(local.base) + static_cast<int64_t>(b) * local.block_bytes;
  }

  // Transfer: one UCX push or pull per store page, runs coalesced on both sides.
  absl::Status Transfer(const v1::KvPage& page, PageTransfer& t, const transfer::KvRegion& local,
                        absl::Time deadline, bool push) {
    absl::StatusOr<transfer::RemoteKvDescriptor> remote =
        transfer::RemoteKvDescriptor::Parse(page.kv_descriptor());
    if (!remote.ok()) return remote.status();
    // Ascending store slots make the longest runs (slots are usually allocated in order).
    std::vector<size_t> order(t.remote.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.remote[a] < t.remote[b]; });
    std::vector<int32_t> remote_ids, local_ids;
    for (size_t i : order) {
      remote_ids.push_back(t.remote[i]);
      local_ids.push_back(t.local[i]);
    }
    const std::vector<transfer::BlockRun> remote_runs = transfer::CoalesceBlocks(remote_ids);
    const std::vector<transfer::BlockRun> local_runs = transfer::CoalesceBlocks(local_ids);
    return push ? options_.agent->Push(*remote, remote_runs, {&local, 1}, local_runs, deadline)
                : options_.agent->Pull(*remote, remote_runs, {&local, 1}, local_runs, deadline);
  }

  // TransferDeadline: the call's deadline, the transfer timeout, and the lease (a transfer must
  // end before the store may reuse the slots), whichever comes first.
  absl::Time TransferDeadline(absl::Time deadline, int64_t lease_ms) const {
    const absl::Time now = absl::Now();
    // Keep a margin for clock skew between the lease grant and now.
    const absl::Time lease_end = now + absl::Milliseconds(lease_ms * 9 / 10);
    return std::min({deadline, now + options_.transfer_timeout, lease_end});
  }

  // PageGroups: groups key positions j (into idx) with a granted slot by store page; fails on
  // a malformed slot.
  template <typename Resp>
  static absl::StatusOr<std::map<int32_t, PageTransfer>> PageGroups(
      const Resp& resp, const std::vector<size_t>& idx, absl::Span<const int32_t> block_ids,
      const std::function<bool(size_t)>& granted) {
    std::map<int32_t, PageTransfer> groups;
    for (size_t j = 0; j < idx.size(); ++j) {
      if (!granted(j)) continue;
      const v1::KvPageSlot& s = resp.slots(static_cast<int>(j));
      if (s.page() < 0 || s.page() >= resp.pages_size() || s.slot() < 0) {
        return absl::InternalError("kvstore answered a slot outside its pages");
      }
      PageTransfer& t = groups[s.page()];
      t.remote.push_back(s.slot());
      t.local.push_back(block_ids[idx[j]]);
      t.which.push_back(j);
    }
    return groups;
  }

  void PutShard(int shard, const std::vector<size_t>& idx, absl::Span<const BlockKey> keys,
                const transfer::KvRegion& local, absl::Span<const int32_t> block_ids,
                absl::Time deadline, ShardOutcome& out, std::vector<size_t>& no_space) {
    v1::KvPutBeginRequest req;
    for (size_t i : idx) ToBlockId(keys[i], req.add_blocks());
    req.set_block_bytes(local.block_bytes);
    req.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
    v1::KvPutBeginResponse grant;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, deadline);
      absl::Status s = FromGrpc(stubs_[shard]->PutBegin(&ctx, req, &grant));
      const int n = static_cast<int>(idx.size());
      if (s.ok() && (grant.outcomes_size() != n || grant.slots_size() != n)) {
        s = absl::InternalError("PutBegin answered the wrong number of blocks");
      }
      if (!s.ok()) {
        if (out.error.ok()) out.error = ShardError(shard, s);
        out.num_failed += n;
        return;
      }
    }
    auto stored = [&](size_t j) { return grant.outcomes(static_cast<int>(j)) == v1::KV_PUT_STORED; };
    for (size_t j = 0; j < idx.size(); ++j) {
      if (grant.outcomes(static_cast<int>(j)) == v1::KV_PUT_PRESENT) out.num_present++;
      if (grant.outcomes(static_cast<int>(j)) == v1::KV_PUT_NO_SPACE) {
        no_space.push_back(idx[j]);
      } else if (!stored(j) && grant.outcomes(static_cast<int>(j)) != v1::KV_PUT_PRESENT) {
        out.num_failed++;
      }
    }
    if (grant.lease_id() == 0) return;
    // Checksums first: they describe what the client meant to store, whatever the wire does.
    v1::KvPutCommitRequest commit;
    commit.set_lease_id(grant.lease_id());
    commit.set_lease_token(grant.lease_token());
    for (size_t j = 0; j < idx.size(); ++j) {
      commit.add_checksums(
          stored(j) ? BlockChecksum(Block(local, block_ids[idx[j]]), local.block_bytes) : 0);
    }
    absl::StatusOr<std::map<int32_t, PageTransfer>> groups =
        PageGroups(grant, idx, block_ids, stored);
    absl::Status transfer_error = groups.status();
    const absl::Time transfer_deadline = TransferDeadline(deadline, grant.lease_ms());
    if (groups.ok()) {
      for (auto& [page, t] : *groups) {
        absl::Status s = Transfer(grant.pages(page), t, local, transfer_deadline, /*push=*/true);
        if (s.ok()) continue;
        if (transfer_error.ok()) transfer_error = s;
        // A wrong checksum makes the store drop these slots now instead of at lease expiry.
        for (size_t j : t.which) commit.set_checksums(static_cast<int>(j), ~commit.checksums(j));
      }
    } else {
      for (size_t j = 0; j < idx.size(); ++j) commit.set_checksums(j, ~commit.checksums(j));
    }
    if (!transfer_error.ok() && out.error.ok()) out.error = ShardError(shard, transfer_error);
    v1::KvPutCommitResponse done;
    grpc::ClientContext ctx;
    SetDeadline(ctx, deadline);
    absl::Status s = FromGrpc(stubs_[shard]->PutCommit(&ctx, commit, &done));
    if (s.ok() && done.outcomes_size() != static_cast<int>(idx.size())) {
      s = absl::InternalError("PutCommit answered the wrong number of blocks");
    }
    for (size_t j = 0; j < idx.size(); ++j) {
      if (!stored(j)) continue;
      const bool ok = s.ok() && (done.outcomes(static_cast<int>(j)) == v1::KV_PUT_STORED ||
                                 done.outcomes(static_cast<int>(j)) == v1::KV_PUT_SSD_FAILED);
      const bool present = s.ok() && done.outcomes(static_cast<int>(j)) == v1::KV_PUT_PRESENT;
      (ok ? out.num_stored : present ? out.num_present : out.num_failed)++;
    }
    if (!s.ok() && out.error.ok()) out.error = ShardError(shard, s);
  }

  void GetShard(int shard, const std::vector<size_t>& idx, absl::Span<const BlockKey> keys,
                const transfer::KvRegion& local, absl::Span<const int32_t> block_ids,
                absl::Time deadline, std::vector<char>& found, ShardOutcome& out,
                std::vector<size_t>& busy) {
    v1::KvGetBeginRequest req;
    for (size_t i : idx) ToBlockId(keys[i], req.add_blocks());
    req.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
    v1::KvGetBeginResponse grant;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, deadline);
      absl::Status s = FromGrpc(stubs_[shard]->GetBegin(&ctx, req, &grant));
      const int n = static_cast<int>(idx.size());
      if (s.ok() && (grant.found_size() != n || grant.slots_size() != n ||
                     grant.checksums_size() != n || grant.block_bytes_size() != n ||
                     grant.busy_size() != n)) {
        s = absl::InternalError("GetBegin answered the wrong number of blocks");
      }
      if (!s.ok()) {
        if (out.error.ok()) out.error = ShardError(shard, s);
        return;
      }
    }
    for (size_t j = 0; j < idx.size(); ++j) {
      if (grant.busy(static_cast<int>(j))) busy.push_back(idx[j]);
    }
    if (grant.lease_id() == 0) return;
    // A block of another size would not fit the local block: a miss (and a caller bug to report).
    auto usable = [&](size_t j) {
      return grant.found(static_cast<int>(j)) &&
             grant.block_bytes(static_cast<int>(j)) == local.block_bytes;
    };
    for (size_t j = 0; j < idx.size(); ++j) {
      if (grant.found(static_cast<int>(j)) && !usable(j) && out.error.ok()) {
        out.error = absl::InvalidArgumentError(absl::StrCat(
            "kvstore block ", keys[idx[j]].ToHex(), " has ", grant.block_bytes(j),
            " bytes, local blocks ", local.block_bytes));
      }
    }
    absl::StatusOr<std::map<int32_t, PageTransfer>> groups =
        PageGroups(grant, idx, block_ids, usable);
    if (!groups.ok() && out.error.ok()) out.error = ShardError(shard, groups.status());
    const absl::Time transfer_deadline = TransferDeadline(deadline, grant.lease_ms());
    if (groups.ok()) {
      for (auto& [page, t] : *groups) {
        absl::Status s = Transfer(grant.pages(page), t, local, transfer_deadline, /*push=*/false);
        if (!s.ok()) {
          if (out.error.ok()) out.error = ShardError(shard, s);
          continue;
        }
        for (size_t k = 0; k < t.which.size(); ++k) {
          const size_t j = t.which[k];
          if (BlockChecksum(Block(local, t.local[k]), local.block_bytes) ==
              grant.checksums(static_cast<int>(j))) {
            found[idx[j]] = 1;
          } else {
            out.num_corrupt++;
          }
        }
      }
    }
    // Release early so the slots can be evicted again; the lease would expire anyway.
    v1::KvReleaseRequest release;
    release.set_lease_id(grant.lease_id());
    release.set_lease_token(grant.lease_token());
    v1::KvReleaseResponse ignored;
    grpc::ClientContext ctx;
    SetDeadline(ctx, std::max(deadline, absl::Now() + absl::Milliseconds(200)));
    (void)stubs_[shard]->Release(&ctx, release, &ignored);
  }

  void PutInlineShard(int shard, const std::vector<size_t>& idx, absl::Span<const BlockKey> keys,
                      const transfer::KvRegion& local, absl::Span<const int32_t> block_ids,
                      absl::Time deadline, ShardOutcome& out, std::vector<size_t>& no_space) {
    v1::KvPutInlineRequest req;
    for (size_t i : idx) {
      ToBlockId(keys[i], req.add_blocks());
      req.add_payloads(reinterpret_cast<const char*>(Block(local, block_ids[i])),
                       static_cast<size_t>(local.block_bytes));
    }
    v1::KvPutInlineResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, deadline);
    absl::Status s = FromGrpc(stubs_[shard]->PutInline(&ctx, req, &resp));
    if (s.ok() && resp.outcomes_size() != static_cast<int>(idx.size())) {
      s = absl::InternalError("PutInline answered the wrong number of blocks");
    }
    if (!s.ok()) {
      if (out.error.ok()) out.error = ShardError(shard, s);
      out.num_failed += static_cast<int64_t>(idx.size());
      return;
    }
    for (int j = 0; j < resp.outcomes_size(); ++j) {
      const v1::KvPutOutcome o = resp.outcomes(j);
      if (o == v1::KV_PUT_NO_SPACE) {
        no_space.push_back(idx[j]);
        continue;
      }
      (o == v1::KV_PUT_STORED || o == v1::KV_PUT_SSD_FAILED ? out.num_stored
       : o == v1::KV_PUT_PRESENT                             ? out.num_present
                                                             : out.num_failed)++;
    }
  }

  void GetInlineShard(int shard, const std::vector<size_t>& idx, absl::Span<const BlockKey> keys,
                      const transfer::KvRegion& local, absl::Span<const int32_t> block_ids,
                      absl::Time deadline, std::vector<char>& found, ShardOutcome& out) {
    v1::KvGetInlineRequest req;
    for (size_t i : idx) ToBlockId(keys[i], req.add_blocks());
    v1::KvGetInlineResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, deadline);
    absl::Status s = FromGrpc(stubs_[shard]->GetInline(&ctx, req, &resp));
    const int n = static_cast<int>(idx.size());
    if (s.ok() && (resp.found_size() != n || resp.payloads_size() != n)) {
      s = absl::InternalError("GetInline answered the wrong number of blocks");
    }
    if (!s.ok()) {
      if (out.error.ok()) out.error = ShardError(shard, s);
      return;
    }
    for (int j = 0; j < n; ++j) {
      const std::string& p = resp.payloads(j);
      if (!resp.found(j) || static_cast<int64_t>(p.size()) != local.block_bytes) continue;
      std::memcpy(Block(local, block_ids[idx[j]]), p.data(), p.size());
      found[idx[j]] = 1;
    }
  }

  const KvStoreClientOptions options_;
  const RendezvousHash hrw_;
  std::vector<std::unique_ptr<v1::KvStore::Stub>> stubs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvStoreClient>> CreateKvStoreClient(
    const KvStoreClientOptions& options) {
  if (options.shards.empty()) return absl::InvalidArgumentError("no kvstore shards");
  absl::flat_hash_set<std::string> names(options.shards.begin(), options.shards.end());
  if (names.size() != options.shards.size()) {
    return absl::InvalidArgumentError("duplicate kvstore shard names");
  }
  if (options.rpc_timeout <= absl::ZeroDuration() ||
      options.transfer_timeout <= absl::ZeroDuration() || options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kvstore client timeouts and lease must be > 0");
  }
  return std::unique_ptr<KvStoreClient>(new GrpcKvStoreClient(options));
}

}  // namespace sluice::kvstore
