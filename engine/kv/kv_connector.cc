#include "engine/kv/kv_connector.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sluice {

int64_t KvBlockBytes(const KvCacheSpec& spec, int64_t block_size,
                     absl::Span<const int32_t> layers, int64_t dtype_bytes) {
  const int64_t num_layers = layers.empty() ? spec.num_layers : static_cast<int64_t>(layers.size());
  return (spec.k_floats_per_token + spec.v_floats_per_token) * dtype_bytes * block_size *
         num_layers;
}

namespace {

// ForEachPiece calls fn(cache_piece_pointer, byte_offset_in_block, piece_bytes) for every
// layer's K then V piece of `block`, in serialization order.
template <typename Cache, typename Fn>
void ForEachPiece(Cache& cache, int32_t block, absl::Span<const int32_t> layers, Fn fn) {
  const KvCacheSpec& spec = cache.spec();
  const int64_t bs = cache.block_size();
  int64_t offset = 0;
  const int64_t count = layers.empty() ? spec.num_layers : static_cast<int64_t>(layers.size());
  for (int64_t i = 0; i < count; ++i) {
    const int64_t layer = layers.empty() ? i : layers[static_cast<size_t>(i)];
    const int64_t k_floats = bs * spec.k_floats_per_token;
    const int64_t v_floats = bs * spec.v_floats_per_token;
    // A cache without V (MLA keeps only the latent in K) has no V storage at all: its null
    // pointer must not reach memcpy, even for 0 bytes (UBSan: nonnull argument).
    if (k_floats > 0) fn(cache.k(layer) + block * k_floats, offset, k_floats * 4);
    offset += k_floats * 4;
    if (v_floats > 0) fn(cache.v(layer) + block * v_floats, offset, v_floats * 4);
    offset += v_floats * 4;
  }
}

}  // namespace

void GatherKvBlock(const KvCache& cache, int32_t block, absl::Span<uint8_t> out,
                   absl::Span<const int32_t> layers) {
  ForEachPiece(cache, block, layers, [&](const float* piece, int64_t offset, int64_t bytes) {
    std::memcpy(out.data() + offset, piece, static_cast<size_t>(bytes));
  });
}

void ScatterKvBlock(absl::Span<const uint8_t> in, int32_t block, KvCache& cache,
                    absl::Span<const int32_t> layers) {
  ForEachPiece(cache, block, layers, [&](float* piece, int64_t offset, int64_t bytes) {
    std::memcpy(piece, in.data() + offset, static_cast<size_t>(bytes));
  });
}

AsyncKvConnector::AsyncKvConnector(std::unique_ptr<KvBlockStoreBackend> backend,
                                   const AsyncKvConnectorOptions& options)
    : backend_(std::move(backend)), options_(options) {
  load_thread_ = std::thread([this] { LoadLoop(); });
  save_thread_ = std::thread([this] { SaveLoop(); });
}

AsyncKvConnector::~AsyncKvConnector() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  load_thread_.join();
  save_thread_.join();
}

absl::Status AsyncKvConnector::Bind(const KvConnectorLayout& layout) {
  if (layout.block_size <= 0 || layout.block_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV connector: bad block layout (",
                                                   layout.block_size, " tokens, ",
                                                   layout.block_bytes, " bytes)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (bound_) {
    if (layout.kv_identity == layout_.kv_identity && layout.block_size == layout_.block_size &&
        layout.block_bytes == layout_.block_bytes) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "KV connector is bound to layout '", layout_.kv_identity, "' (", layout_.block_bytes,
        " bytes per block of ", layout_.block_size, " tokens); this engine's is '",
        layout.kv_identity, "' (", layout.block_bytes, " bytes per block of ", layout.block_size,
        " tokens)"));
  }
  // Before any load or save is queued (the engine binds before its first step), so the
  // backend's threads never see it half bound.
  if (absl::Status s = backend_->Bind(layout); !s.ok()) return s;
  block_bytes_ = layout.block_bytes;
  layout_ = layout;
  bound_ = true;
  return absl::OkStatus();
}

void AsyncKvConnector::StartLoad(uint64_t ticket, std::vector<BlockHash> hashes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.num_loads;
    stats_.num_load_queried_blocks += static_cast<int64_t>(hashes.size());
    loads_.push_back(LoadJob{ticket, std::move(hashes)});
  }
  cv_.notify_all();
}

std::vector<KvLoadResult> AsyncKvConnector::PollLoads() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KvLoadResult> out;
  out.swap(done_);
  return out;
}

void AsyncKvConnector::Save(std::vector<BlockHash> hashes, KvBlockBuffer bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (pending_save_bytes_ + size > options_.max_pending_save_bytes) {
      stats_.num_save_dropped_blocks += static_cast<int64_t>(hashes.size());
      return;
    }
    pending_save_bytes_ += size;
    saves_.push_back(SaveJob{std::move(hashes), std::move(bytes)});
  }
  cv_.notify_all();
}

KvConnectorStats AsyncKvConnector::stats() const {
  const KvBlockStoreBackend::TransferBytes moved = backend_->transfer_bytes();
  std::lock_guard<std::mutex> lock(mu_);
  KvConnectorStats out = stats_;
  out.num_rma_bytes = moved.rma;
  out.num_inline_bytes = moved.inline_bytes;
  return out;
}

bool AsyncKvConnector::WaitIdle(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto idle = [&] { return loads_.empty() && saves_.empty() && num_busy_ == 0; };
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return idle();
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(left), idle);
}

KvLoadResult AsyncKvConnector::RunLoad(const LoadJob& job) {
  KvLoadResult result;
  result.ticket = job.ticket;
  if (absl::Now() < skip_loads_until_) return result;
  const absl::Time deadline = absl::Now() + options_.load_timeout;
  // One batched Exists first: the common miss costs no data movement, and only the leading run
  // is fetched (a block after a gap is useless: its KV is valid only under its exact parents).
  absl::StatusOr<std::vector<bool>> exists = backend_->Exists(job.hashes, deadline);
  if (!exists.ok()) {
    result.error = exists.status();
    skip_loads_until_ = absl::Now() + options_.failure_backoff;
    return result;
  }
  size_t run = 0;
  while (run < job.hashes.size() && run < exists->size() && (*exists)[run]) ++run;
  if (run == 0) return result;
  KvBlockBuffer bytes = backend_->AllocateBuffer(run * static_cast<size_t>(block_bytes_));
  absl::StatusOr<std::vector<bool>> found =
      backend_->Get(absl::MakeConstSpan(job.hashes).subspan(0, run), bytes.span(), deadline);
  if (!found.ok()) {
    result.error = found.status();
    skip_loads_until_ = absl::Now() + options_.failure_backoff;
    return result;
  }
  size_t got = 0;
  while (got < run && got < found->size() && (*found)[got]) ++got;
  if (got < run) {
    result.error = absl::NotFoundError(
        absl::StrCat("block ", got, " of ", run, " listed by Exists was not fetched"));
  }
  bytes.Shrink(got * static_cast<size_t>(block_bytes_));
  result.num_blocks = static_cast<int64_t>(got);
  result.bytes = std::move(bytes);
  return result;
}

void AsyncKvConnector::LoadLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !loads_.empty(); });
    if (stop_) return;
    LoadJob job = std::move(loads_.front());
    loads_.pop_front();
    ++num_busy_;
    lock.unlock();
    const bool skipped = absl::Now() < skip_loads_until_;
    KvLoadResult result = RunLoad(job);
    lock.lock();
    --num_busy_;
    if (skipped) ++stats_.num_load_skipped;
    stats_.num_loaded_blocks += result.num_blocks;
    if (!result.error.ok()) ++stats_.num_load_errors;
    done_.push_back(std::move(result));
    cv_.notify_all();
  }
}

void AsyncKvConnector::SaveLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !saves_.empty(); });
    if (stop_) return;
    SaveJob job = std::move(saves_.front());
    saves_.pop_front();
    ++num_busy_;
    lock.unlock();
    const absl::Time deadline = absl::Now() + options_.save_timeout;
    absl::StatusOr<KvBlockStoreBackend::PutCounts> put =
        backend_->Put(job.hashes, job.bytes.span(), deadline);
    lock.lock();
    --num_busy_;
    pending_save_bytes_ -= static_cast<int64_t>(job.bytes.size());
    if (put.ok()) {
      stats_.num_saved_blocks += put->stored;
      stats_.num_save_present_blocks += put->present;
      stats_.num_save_failed_blocks += put->failed;
    } else {
      stats_.num_save_failed_blocks += static_cast<int64_t>(job.hashes.size());
    }
    cv_.notify_all();
  }
}

}  // namespace sluice
