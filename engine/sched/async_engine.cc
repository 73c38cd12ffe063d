#include "engine/sched/async_engine.h"

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
  explicit Impl(std::unique_ptr<LLMEngine> engine) : engine_(std::move(engine)) {
    max_model_len_ = engine_->max_model_len();
    PublishStats();
    thread_ = std::thread([this] { Loop(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
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
    std::lock_guard<std::mutex> lock(mu_);
    if (!in_flight_.contains(request_id)) return;
    ops_.push_back(AbortOp{request_id});
    cv_.notify_one();
  }

  AsyncEngineStats Stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
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
  using Op = std::variant<SubmitOp, AbortOp>;

  void Loop() {
    for (;;) {
      std::deque<Op> ops;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !ops_.empty() || engine_->HasUnfinishedRequests(); });
        if (stop_) break;
        ops.swap(ops_);
        num_queued_submits_ = 0;
      }
      for (Op& op : ops) {
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
            continue;
          }
          callbacks_.emplace(id, std::move(submit->callback));
        } else {
          engine_->AbortRequest(std::get<AbortOp>(op).request_id);
        }
      }
      for (const RequestOutput& out : engine_->Step()) {
        auto it = callbacks_.find(out.request_id);
        if (it == callbacks_.end()) continue;
        it->second(out);
        if (out.finished()) {
          callbacks_.erase(it);
          Forget(out.request_id);
        }
      }
      PublishStats();
    }
    // Shutdown: every request still in flight gets its final (aborted) output.
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
    s.counters = engine_->counters();
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = s;
  }

  std::unique_ptr<LLMEngine> engine_;
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
};

AsyncEngine::AsyncEngine(std::unique_ptr<LLMEngine> engine)
    : impl_(std::make_unique<Impl>(std::move(engine))) {}
AsyncEngine::~AsyncEngine() = default;
absl::Status AsyncEngine::Submit(EngineRequest request, OutputCallback on_output) {
  return impl_->Submit(std::move(request), std::move(on_output));
}
void AsyncEngine::Abort(const std::string& request_id) { impl_->Abort(request_id); }
AsyncEngineStats AsyncEngine::Stats() const { return impl_->Stats(); }
int32_t AsyncEngine::max_model_len() const { return impl_->max_model_len(); }
const Model& AsyncEngine::model() const { return impl_->model(); }

}  // namespace sluice
