#include "engine/sched/async_engine.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"

namespace sluice {

// The engine thread owns the LLMEngine. Front ends enqueue submits and aborts (in order) under
// mu_; the thread drains the queue between steps and delivers outputs to the callbacks.
class AsyncEngine::Impl {
 public:
  explicit Impl(std::unique_ptr<LLMEngine> engine)
      : engine_(std::move(engine)), kv_events_(engine_->kv_events()) {
    max_model_len_ = engine_->max_model_len();
    PublishStats();
    thread_ = std::thread([this] { Loop(); });
  }

  ~Impl() { Shutdown(); }

  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Submit(EngineRequest request, OutputCallback on_output) {
    if (absl::Status s = engine_->ValidateRequest(request); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("engine is shutting down");
    if (in_flight_.contains(request.request_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("request id '", request.request_id, "' is already in flight"));
    }
    if (num_queued_submits_ + stats_.num_waiting_requests >= kMaxQueued) {
      return absl::ResourceExhaustedError("engine queue is full; retry later");
    }
    in_flight_.insert(request.request_id);
    ++num_queued_submits_;
    ops_.push_back(SubmitOp{std::move(request), std::move(on_output)});
    cv_.notify_one();
    return absl::OkStatus();
  }

  void Abort(const std::string& request_id) {
    // Not only in-flight ids: a finished prefill request may still hold KV blocks.
    Enqueue(AbortOp{request_id});
  }

  void ReleaseHeldBlocks(const std::string& request_id, std::function<void(absl::Status)> done) {
    if (!Enqueue(ReleaseOp{request_id, done}) && done) {
      done(absl::UnavailableError("engine is shutting down"));
    }
  }

  void ReserveForTransfer(EngineRequest request, std::optional<SampledToken> first_token,
                          absl::Time deadline,
                          std::function<void(absl::StatusOr<std::vector<int32_t>>)> on_reserved,
                          OutputCallback on_output) {
    absl::Status s = engine_->ValidateRequest(request);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) {
        s = absl::UnavailableError("engine is shutting down");
      } else if (in_flight_.contains(request.request_id)) {
        s = absl::AlreadyExistsError(
            absl::StrCat("request id '", request.request_id, "' is already in flight"));
      } else {
        in_flight_.insert(request.request_id);
        ops_.push_back(ReserveOp{std::move(request), std::move(first_token), deadline,
                                 std::move(on_reserved), std::move(on_output)});
        cv_.notify_one();
        return;
      }
    }
    on_reserved(s);
  }

  void CompleteTransfer(const std::string& request_id, absl::Status status,
                        std::optional<SampledToken> first_token,
                        std::function<void(absl::Status)> done) {
    if (!Enqueue(CompleteOp{request_id, std::move(status), std::move(first_token), done}) &&
        done) {
      done(absl::UnavailableError("engine is shutting down"));
    }
  }

  KvCache& kv_cache() { return engine_->kv_cache(); }
  int64_t block_size() const { return engine_->block_size(); }

  AsyncEngineStats Stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  KvEventBatch ReadKvEvents(uint64_t after_seq, size_t max_events) const {
    return kv_events_->Read(after_seq, max_events);
  }
  KvSnapshot KvCacheSnapshot() const { return kv_events_->Snapshot(); }
  const std::string& kv_identity() const { return engine_->kv_identity(); }
  int32_t max_model_len() const { return max_model_len_; }
  const Model& model() const { return engine_->model(); }

 private:
  static constexpr int64_t kMaxQueued = 8192;
  struct SubmitOp {
    EngineRequest request;
    OutputCallback callback;
  };
  struct AbortOp {
    std::string request_id;
  };
  struct ReleaseOp {
    std::string request_id;
    std::function<void(absl::Status)> done;
  };
  struct ReserveOp {
    EngineRequest request;
    std::optional<SampledToken> first_token;
    absl::Time deadline;
    std::function<void(absl::StatusOr<std::vector<int32_t>>)> on_reserved;
    OutputCallback on_output;
  };
  struct CompleteOp {
    std::string request_id;
    absl::Status status;
    std::optional<SampledToken> first_token;
    std::function<void(absl::Status)> done;
  };
  using Op = std::variant<SubmitOp, AbortOp, ReleaseOp, ReserveOp, CompleteOp>;

  // While timers (held blocks, reservations, queued reserves) exist the loop wakes this often.
  static constexpr std::chrono::milliseconds kTimerPoll{10};

  // Enqueue: false (op dropped) once shutting down.
  bool Enqueue(Op op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    ops_.push_back(std::move(op));
    cv_.notify_one();
    return true;
  }

  // TryReserve: reserves now; true when done (reserved or failed for good), false when blocks
  // are short and the op should wait for the next step.
  bool TryReserve(ReserveOp& op) {
    const std::string id = op.request.request_id;
    absl::StatusOr<std::vector<int32_t>> blocks =
        engine_->ReserveForTransfer(op.request, op.first_token);
    if (blocks.ok()) {
      callbacks_.emplace(id, std::move(op.on_output));
      // Whoever learns of the reservation may read Stats() next: it must show the blocks taken.
      PublishStats();
      // Blocks freed while an async step was in flight may still be written by it; the
      // reservation's writer (a KV transfer from another process) is not ordered after that
      // step on the device, so the blocks are announced once it has been read.
      const int64_t after_step = engine_->num_steps_enqueued();
      if (engine_->num_steps_read() >= after_step) {
        op.on_reserved(std::move(blocks));
      } else {
        fenced_reserves_.push_back(
            FencedReserve{id, after_step, std::move(op.on_reserved), *std::move(blocks)});
      }
      return true;
    }
    if (absl::IsResourceExhausted(blocks.status()) && absl::Now() < op.deadline) return false;
    if (absl::IsResourceExhausted(blocks.status())) {
      blocks = absl::DeadlineExceededError(
          absl::StrCat("no KV blocks for request '", id, "' before the deadline: ",
                       blocks.status().message()));
    }
    op.on_reserved(blocks.status());
    Forget(id);
    return true;
  }

  // AnnounceFencedReserves hands out the reservations whose blocks no step in flight writes.
  void AnnounceFencedReserves() {
    while (!fenced_reserves_.empty() &&
           engine_->num_steps_read() >= fenced_reserves_.front().after_step) {
      FencedReserve r = std::move(fenced_reserves_.front());
      fenced_reserves_.pop_front();
      r.on_reserved(std::move(r.blocks));
    }
  }

  void RetryPendingReserves() {
    while (!pending_reserves_.empty()) {
      if (!TryReserve(pending_reserves_.front())) {
        // FIFO: later ones wait too, unless past their deadline.
        for (auto it = pending_reserves_.begin() + 1; it != pending_reserves_.end();) {
          if (absl::Now() >= it->deadline) {
            it->on_reserved(absl::DeadlineExceededError(absl::StrCat(
                "no KV blocks for request '", it->request.request_id, "' before the deadline")));
            Forget(it->request.request_id);
            it = pending_reserves_.erase(it);
          } else {
            ++it;
          }
        }
        return;
      }
      pending_reserves_.pop_front();
    }
  }

  void Apply(Op& op) {
    if (auto* submit = std::get_if<SubmitOp>(&op)) {
      const std::string id = submit->request.request_id;
      absl::Status s = engine_->AddRequest(std::move(submit->request));
      if (!s.ok()) {
        // Validated in Submit; only engine-state errors (queue full) land here.
        RequestOutput out;
        out.request_id = id;
        out.finish_reason = FinishReason::kError;
        out.status = s;
        submit->callback(out);
        Forget(id);
        return;
      }
      callbacks_.emplace(id, std::move(submit->callback));
    } else if (auto* abort = std::get_if<AbortOp>(&op)) {
      for (auto it = pending_reserves_.begin(); it != pending_reserves_.end(); ++it) {
        if (it->request.request_id == abort->request_id) {
          it->on_reserved(absl::CancelledError("aborted before its KV blocks were reserved"));
          Forget(abort->request_id);
          pending_reserves_.erase(it);
          return;
        }
      }
      for (auto it = fenced_reserves_.begin(); it != fenced_reserves_.end(); ++it) {
        if (it->request_id == abort->request_id) {
          // Its blocks were never announced: the caller learns of the abort as a failed
          // reservation (as above) and not of the engine's final output.
          it->on_reserved(absl::CancelledError("aborted before its KV blocks were reserved"));
          fenced_reserves_.erase(it);
          callbacks_.erase(abort->request_id);
          Forget(abort->request_id);
          break;
        }
      }
      engine_->AbortRequest(abort->request_id);
    } else if (auto* release = std::get_if<ReleaseOp>(&op)) {
      absl::Status s = engine_->ReleaseHeldBlocks(release->request_id);
      PublishStats();
      if (release->done) release->done(s);
    } else if (auto* reserve = std::get_if<ReserveOp>(&op)) {
      if (!pending_reserves_.empty() || !TryReserve(*reserve)) {
        pending_reserves_.push_back(std::move(*reserve));
      }
    } else if (auto* complete = std::get_if<CompleteOp>(&op)) {
      absl::Status s = engine_->CompleteTransfer(
          complete->request_id, std::move(complete->status), std::move(complete->first_token));
      PublishStats();
      if (complete->done) complete->done(s);
    }
  }

  void Loop() {
    for (;;) {
      std::deque<Op> ops;
      {
        std::unique_lock<std::mutex> lock(mu_);
        auto ready = [&] { return stop_ || !ops_.empty() || engine_->HasStepWork(); };
        if (engine_->HasPendingTimers() || !pending_reserves_.empty()) {
          cv_.wait_for(lock, kTimerPoll, ready);
        } else {
          cv_.wait(lock, ready);
        }
        if (stop_) break;
        ops.swap(ops_);
        num_queued_submits_ = 0;
      }
      for (Op& op : ops) Apply(op);
      std::vector<RequestOutput> outputs = engine_->Step();
      // Whoever gets an output may read Stats() next (a client that saw its request end reads
      // /metrics): they must show the step that produced it (blocks freed, counters).
      PublishStats();
      for (const RequestOutput& out : outputs) {
        auto it = callbacks_.find(out.request_id);
        if (it == callbacks_.end()) continue;
        it->second(out);
        if (out.finished()) {
          callbacks_.erase(it);
          Forget(out.request_id);
        }
      }
      AnnounceFencedReserves();
      RetryPendingReserves();
      PublishStats();
    }
    // Shutdown: every request still in flight gets its final (aborted) output.
    for (ReserveOp& op : pending_reserves_) {
      op.on_reserved(absl::UnavailableError("engine shut down"));
    }
    pending_reserves_.clear();
    for (FencedReserve& r : fenced_reserves_) {
      r.on_reserved(absl::UnavailableError("engine shut down"));
      callbacks_.erase(r.request_id);
    }
    fenced_reserves_.clear();
    for (auto& [id, callback] : callbacks_) {
      RequestOutput out;
      out.request_id = id;
      out.finish_reason = FinishReason::kAbort;
      out.status = absl::UnavailableError("engine shut down");
      callback(out);
    }
    callbacks_.clear();
  }

  void Forget(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(id);
  }

  void PublishStats() {
    AsyncEngineStats s;
    s.num_waiting_requests = engine_->num_waiting();
    s.num_running_requests = engine_->num_running();
    s.num_total_blocks = engine_->num_total_blocks();
    s.num_free_blocks = engine_->num_free_blocks();
    s.block_size = engine_->block_size();
    s.num_held_blocks = engine_->num_held_blocks();
    s.num_reserved = engine_->num_reserved();
    s.num_cached_blocks = engine_->num_cached_blocks();
    s.counters = engine_->counters();
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = s;
  }

  std::unique_ptr<LLMEngine> engine_;
  std::shared_ptr<const KvEventLog> kv_events_;  // thread-safe
  int32_t max_model_len_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> ops_;                          // guarded by mu_
  std::unordered_set<std::string> in_flight_;   // guarded by mu_
  int64_t num_queued_submits_ = 0;              // guarded by mu_
  AsyncEngineStats stats_;                      // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  std::unordered_map<std::string, OutputCallback> callbacks_;  // engine thread only
  std::deque<ReserveOp> pending_reserves_;  // engine thread only: waiting for free blocks
  // Reserved while an async step was in flight: announced once num_steps_read() reaches
  // after_step (engine thread only, in order of after_step).
  struct FencedReserve {
    std::string request_id;
    int64_t after_step = 0;
    std::function<void(absl::StatusOr<std::vector<int32_t>>)> on_reserved;
    std::vector<int32_t> blocks;
  };
  std::deque<FencedReserve> fenced_reserves_;
};

AsyncEngine::AsyncEngine(std::unique_ptr<LLMEngine> engine)
    : impl_(std::make_unique<Impl>(std::move(engine))) {}
AsyncEngine::~AsyncEngine() = default;
void AsyncEngine::Shutdown() { impl_->Shutdown(); }
absl::Status AsyncEngine::Submit(EngineRequest request, OutputCallback on_output) {
  return impl_->Submit(std::move(request), std::move(on_output));
}
void AsyncEngine::Abort(const std::string& request_id) { impl_->Abort(request_id); }
void AsyncEngine::ReleaseHeldBlocks(const std::string& request_id,
                                    std::function<void(absl::Status)> done) {
  impl_->ReleaseHeldBlocks(request_id, std::move(done));
}
void AsyncEngine::ReserveForTransfer(
    EngineRequest request, std::optional<SampledToken> first_token, absl::Time deadline,
    std::function<void(absl::StatusOr<std::vector<int32_t>>)> on_reserved,
    OutputCallback on_output) {
  impl_->ReserveForTransfer(std::move(request), std::move(first_token), deadline,
                            std::move(on_reserved), std::move(on_output));
}
void AsyncEngine::CompleteTransfer(const std::string& request_id, absl::Status status,
                                   std::optional<SampledToken> first_token,
                                   std::function<void(absl::Status)> done) {
  impl_->CompleteTransfer(request_id, std::move(status), std::move(first_token), std::move(done));
}
KvCache& AsyncEngine::kv_cache() { return impl_->kv_cache(); }
int64_t AsyncEngine::block_size() const { return impl_->block_size(); }
AsyncEngineStats AsyncEngine::Stats() const { return impl_->Stats(); }
KvEventBatch AsyncEngine::ReadKvEvents(uint64_t after_seq, size_t max_events) const {
  return impl_->ReadKvEvents(after_seq, max_events);
}
KvSnapshot AsyncEngine::KvCacheSnapshot() const { return impl_->KvCacheSnapshot(); }
const std::string& AsyncEngine::kv_identity() const { return impl_->kv_identity(); }
int32_t AsyncEngine::max_model_len() const { return impl_->max_model_len(); }
const Model& AsyncEngine::model() const { return impl_->model(); }

}  // namespace sluice
