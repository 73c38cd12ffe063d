#include "services/api/render_pools.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sluice {

RenderPools::RenderPools(RenderPoolOptions options) : options_(std::move(options)) {
  pool_ = std::make_unique<Pool>(options_.threads);
  if (options_.custom_template_threads > 0) {
    custom_pool_ = std::make_unique<Pool>(options_.custom_template_threads);
  }
}

RenderPools::~RenderPools() { Stop(); }

absl::Status RenderPools::Post(bool custom_template, RenderCancel cancelled, absl::Time deadline,
                               Job job) {
  jinja::RenderLimits limits = options_.limits;
  limits.cancelled = cancelled.get();
  limits.deadline = std::min(deadline, absl::Now() + absl::FromChrono(options_.timeout));
  // Under mu_: Stop must not destroy a pool between its choice and the post.
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("The server is shutting down");
  Pool* pool = custom_template && custom_pool_ != nullptr ? custom_pool_.get() : pool_.get();
  if (pool->queued.fetch_add(1) >= options_.max_queued) {
    pool->queued.fetch_sub(1);
    return absl::UnavailableError(absl::StrCat("The server is overloaded (", options_.max_queued,
                                               " requests waiting to be parsed); retry later"));
  }
  live_.insert(cancelled.get());
  pool->tasks.Post([this, pool, limits, cancelled = std::move(cancelled), job = std::move(job)]() {
    pool->queued.fetch_sub(1);
    job(limits);
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(cancelled.get());
  });
  return absl::OkStatus();
}

int64_t RenderPools::num_queued() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const Pool* pool : {pool_.get(), custom_pool_.get()}) {
    if (pool != nullptr) n += pool->queued.load();
  }
  return n;
}

void RenderPools::Stop() {
  std::unique_ptr<Pool> pool;
  std::unique_ptr<Pool> custom_pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (std::atomic<bool>* flag : live_) flag->store(true);
    pool = std::move(pool_);
    custom_pool = std::move(custom_pool_);
  }
  // TaskPool's destructor runs what is queued (cancelled above, so quickly) and joins.
  custom_pool.reset();
  pool.reset();
}

}  // namespace sluice
