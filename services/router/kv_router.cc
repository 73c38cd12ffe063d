#include "services/router/kv_router.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "sluice/v1/kv_events.grpc.pb.h"

namespace sluice {
namespace {

BlockHash HashFromWire(const v1::KvBlockHash& in) { return BlockHash{in.lo(), in.hi()}; }

std::vector<BlockHash> HashesFromWire(
    const google::protobuf::RepeatedPtrField<v1::KvBlockHash>& in) {
  std::vector<BlockHash> out;
  out.reserve(in.size());
  for (const v1::KvBlockHash& hash : in) out.push_back(HashFromWire(hash));
  return out;
}

// KvEventBatchFromWire: the inverse of the worker's KvEventBatchToWire. An event of an unknown
// type cannot be applied faithfully, so the batch is reported as fell_behind (forces a snapshot).
KvEventBatch KvEventBatchFromWire(const v1::ReadKvEventsResponse& in) {
  KvEventBatch batch;
  batch.log_id = in.log_id();
  batch.fell_behind = in.fell_behind();
  batch.last_seq = in.last_seq();
  for (const v1::KvEventProto& e : in.events()) {
    KvEvent event;
    event.seq = e.seq();
    switch (e.type()) {
      case v1::KV_EVENT_TYPE_STORED:
        event.type = KvEventType::kStored;
        break;
      case v1::KV_EVENT_TYPE_REMOVED:
        event.type = KvEventType::kRemoved;
        break;
      case v1::KV_EVENT_TYPE_ALL_CLEARED:
        event.type = KvEventType::kAllCleared;
        break;
      default:
        batch.events.clear();
        batch.fell_behind = true;
        return batch;
    }
    event.block_hashes = HashesFromWire(e.block_hashes());
    if (e.has_parent_hash()) event.parent_hash = HashFromWire(e.parent_hash());
    batch.events.push_back(std::move(event));
  }
  return batch;
}

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

}  // namespace

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(const std::string& name) {
  if (name == "kv") return RoutingPolicy::kKv;
  if (name == "load") return RoutingPolicy::kLoad;
  if (name == "round_robin") return RoutingPolicy::kRoundRobin;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown routing policy '", name, "' (expected kv, load or round_robin)"));
}

KvRouter::KvRouter(WorkerRegistry* registry, KvRouterOptions options)
    : registry_(registry), options_(options), index_(options.index) {
  // Round-robin and load-only routing never read the index: no polling.
  if (options_.start_poller && options_.policy == RoutingPolicy::kKv) {
    poller_ = std::thread([this] { PollLoop(); });
  }
}

KvRouter::~KvRouter() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
}

void KvRouter::PollLoop() {
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stopping_) {
    lock.unlock();
    PollOnce();
    lock.lock();
    stop_cv_.wait_for(lock, absl::ToChronoMicroseconds(options_.poll_interval),
                      [this] { return stopping_; });
  }
}

std::shared_ptr<grpc::Channel> KvRouter::ChannelTo(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  auto channel = grpc::CreateChannel(address, options_.channel_credentials != nullptr
                                                  ? options_.channel_credentials
                                                  : grpc::InsecureChannelCredentials());
  channels_.emplace(address, channel);
  return channel;
}

void KvRouter::PollOnce() {
  std::lock_guard<std::mutex> poll_lock(poll_mu_);
  const std::vector<WorkerSnapshot> workers = registry_->List();
  std::set<std::string> live;
  std::set<std::string> live_addresses;
  for (const WorkerSnapshot& worker : workers) {
    if (worker.role == WorkerRole::kEncoder) continue;  // no KV cache, no KV events
    live.insert(worker.worker_id);
    live_addresses.insert(worker.address);
    PollWorker(worker);
  }
  for (const std::string& id : index_.Workers()) {
    if (live.count(id) != 0) continue;
    index_.RemoveWorker(id);
    std::lock_guard<std::mutex> lock(mu_);
    workers_.erase(id);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = channels_.begin(); it != channels_.end();) {
    it = live_addresses.count(it->first) != 0 ? std::next(it) : channels_.erase(it);
  }
}

size_t KvRouter::NumChannels() const {
  std::lock_guard<std::mutex> lock(mu_);
  return channels_.size();
}

void KvRouter::PollWorker(const WorkerSnapshot& worker) {
  auto stub = v1::KvEventSource::NewStub(ChannelTo(worker.address));
  auto remember = [&](const v1::KvCacheIdentity& identity) {
    std::lock_guard<std::mutex> lock(mu_);
    WorkerKv& kv = workers_[worker.worker_id];
    kv.address = worker.address;
    kv.identity = identity.kv_identity();
    kv.block_size = identity.block_size();
    if (kv.block_size > 0 && !kv.identity.empty() && hashers_.count(kv.identity) == 0) {
      hashers_.emplace(kv.identity, std::make_unique<BlockHasher>(kv.identity, kv.block_size));
    }
  };
  auto failed = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.num_poll_errors;
  };
  // Drain the backlog in a few reads; a worker that produces events faster than this is read
  // on the next round (its buffer keeps them, or it falls behind and we resync).
  for (int read = 0; read < 8; ++read) {
    if (index_.WorkerState(worker.worker_id).needs_resync) break;
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(options_.rpc_deadline));
    v1::ReadKvEventsRequest request;
    request.set_after_seq(index_.WorkerState(worker.worker_id).last_seq);
    v1::ReadKvEventsResponse response;
    const grpc::Status status = stub->ReadKvEvents(&context, request, &response);
    if (!status.ok()) {
      failed();
      return;
    }
    remember(response.identity());
    if (index_.ApplyEvents(worker.worker_id, KvEventBatchFromWire(response)) &&
        index_.WorkerState(worker.worker_id).last_seq >= response.last_seq()) {
      return;  // caught up
    }
  }
  if (!index_.WorkerState(worker.worker_id).needs_resync) return;
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(options_.rpc_deadline));
  v1::GetKvSnapshotResponse response;
  const grpc::Status status = stub->GetKvSnapshot(&context, v1::GetKvSnapshotRequest(), &response);
  if (!status.ok()) {
    failed();
    return;
  }
  remember(response.identity());
  index_.ApplySnapshot(worker.worker_id, KvSnapshot{response.log_id(), response.seq(),
                                                    HashesFromWire(response.block_hashes())});
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.num_resyncs;
}

std::optional<WorkerSnapshot> KvRouter::Assign(WorkerRole role, const std::string& id,
                                               int64_t tokens_needed,
                                               const std::vector<WorkerSnapshot>& others,
                                               const std::set<std::string>& excluded) {
  // The registry counts assignments only through Pick: excluding every other candidate, and the
  // workers the caller excluded (never candidates), makes it pick `id` (a worker registered
  // since List() may still win; it is as valid a choice).
  std::set<std::string> exclude = excluded;
  for (const WorkerSnapshot& w : others) {
    if (w.worker_id != id) exclude.insert(w.worker_id);
  }
  return registry_->Pick(role, tokens_needed, exclude);
}

std::optional<WorkerSnapshot> KvRouter::Pick(WorkerRole role, const std::string& request_id,
                                             const std::vector<int32_t>& prompt,
                                             const std::string& cache_salt,
                                             int64_t tokens_needed,
                                             const std::set<std::string>& exclude,
                                             absl::Span<const BlockExtraKeySpan> image_keys) {
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  const bool decode_prefills_remotely =
      role == WorkerRole::kDecode && prompt_len >= options_.min_remote_prefill_tokens &&
      registry_->CountLive(WorkerRole::kPrefill) > 0;
  if (options_.policy == RoutingPolicy::kLoad ||
      (options_.policy == RoutingPolicy::kKv && decode_prefills_remotely)) {
    return registry_->Pick(role, tokens_needed, exclude);
  }
  std::vector<WorkerSnapshot> candidates;
  for (WorkerSnapshot& w : registry_->List()) {
    if (w.role == role && !w.draining && !w.suspect && exclude.count(w.worker_id) == 0) {
      candidates.push_back(std::move(w));
    }
  }
  if (candidates.empty()) return std::nullopt;

  if (options_.policy == RoutingPolicy::kRoundRobin) {
    size_t next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // One cycle per role: a shared counter would alternate roles and skip workers.
      next = static_cast<size_t>(round_robin_next_[static_cast<int>(role)]++ % candidates.size());
    }
    return Assign(role, candidates[next].worker_id, tokens_needed, candidates, exclude);
  }

  // Hash the prompt once per block-hash identity among the candidates (normally one), under the
  // request's cache salt as the engine does (a worker that is not sent the salt hashes under the
  // shared root: salted prompts then just match nothing there).
  std::map<std::string, std::vector<BlockHash>> hashes_by_identity;
  std::vector<KvCandidate> scored;
  std::vector<const std::vector<BlockHash>*> hashes_of;  // per candidate; may be null
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const WorkerSnapshot& w : candidates) {
      KvCandidate c;
      c.worker_id = w.worker_id;
      c.running_requests = w.load.num_waiting_requests + w.load.num_running_requests;
      c.free_blocks = w.load.num_free_blocks;
      c.total_blocks = w.load.num_total_blocks;
      c.block_size = w.load.block_size;
      c.picked_total = w.num_picked_total;
      c.assigned_requests = w.num_assigned;
      auto out = outstanding_.find(w.worker_id);
      if (out != outstanding_.end()) c.assigned_new_tokens = out->second.new_tokens;
      const std::vector<BlockHash>* hashes = nullptr;
      auto kv = workers_.find(w.worker_id);
      if (kv != workers_.end() && hashers_.count(kv->second.identity) != 0) {
        auto [it, inserted] = hashes_by_identity.try_emplace(kv->second.identity);
        if (inserted) {
          const BlockHasher& hasher = *hashers_.at(kv->second.identity);
          hasher.ExtendFullBlockHashes(hasher.RootHash(cache_salt), prompt, image_keys,
                                       it->second);
        }
        hashes = &it->second;
        c.block_size = kv->second.block_size;
      }
      scored.push_back(std::move(c));
      hashes_of.push_back(hashes);
    }
  }
  std::map<const std::vector<BlockHash>*, std::map<std::string, int64_t>> matches;
  for (size_t i = 0; i < scored.size(); ++i) {
    if (hashes_of[i] == nullptr) continue;
    auto [it, inserted] = matches.try_emplace(hashes_of[i]);
    if (inserted) it->second = index_.MatchPrefix(*hashes_of[i]);
    auto m = it->second.find(scored[i].worker_id);
    if (m != it->second.end()) scored[i].cached_blocks = m->second;
  }
  const std::optional<KvChoice> choice =
      ChooseKvWorker(options_.weights, scored, std::max<int64_t>(prompt_len, 1));
  if (!choice) return std::nullopt;
  std::optional<WorkerSnapshot> picked =
      Assign(role, choice->worker_id, tokens_needed, candidates, exclude);
  if (!picked) return std::nullopt;
  int64_t new_tokens = prompt_len;
  int64_t cached_tokens = 0;
  for (size_t i = 0; i < scored.size(); ++i) {
    if (scored[i].worker_id != picked->worker_id) continue;
    if (hashes_of[i] != nullptr) index_.RecordRouting(picked->worker_id, *hashes_of[i]);
    if (picked->worker_id == choice->worker_id) {
      new_tokens = choice->new_tokens;
      cached_tokens = choice->cached_tokens;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [slot, inserted] = assigned_.try_emplace({picked->worker_id, request_id}, new_tokens);
  if (inserted) {
    Outstanding& out = outstanding_[picked->worker_id];
    ++out.requests;
    out.new_tokens += new_tokens;
  }
  ++counters_.num_picks;
  if (cached_tokens > 0) ++counters_.num_picks_with_overlap;
  counters_.predicted_cached_tokens += cached_tokens;
  return picked;
}

void KvRouter::Release(const std::string& worker_id, const std::string& request_id) {
  registry_->Release(worker_id);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = assigned_.find({worker_id, request_id});
  if (it == assigned_.end()) return;
  auto out = outstanding_.find(worker_id);
  if (out != outstanding_.end()) {
    --out->second.requests;
    out->second.new_tokens -= it->second;
    if (out->second.requests <= 0) outstanding_.erase(out);
  }
  assigned_.erase(it);
}

KvRouterCounters KvRouter::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace sluice
