#include "transfer/layerwise_push.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transfer/transfer_validation.h"

namespace sluice::transfer {

absl::StatusOr<std::shared_ptr<LayerwisePush>> LayerwisePush::Create(
    PushFn push, Executor executor, RemoteKvDescriptor remote, std::vector<BlockRun> remote_runs,
    std::vector<KvRegion> local, std::vector<int32_t> region_layers, const Options& options) {
  if (!push || !executor) {
    return absl::InvalidArgumentError("LayerwisePush needs a push function and an executor");
  }
  if (options.num_layers < 1 || options.layers_per_group < 1) {
    return absl::InvalidArgumentError(absl::StrCat("layerwise push needs num_layers >= 1 and "
                                                   "layers_per_group >= 1, got ",
                                                   options.num_layers, " and ",
                                                   options.layers_per_group));
  }
  if (remote.regions.size() != local.size() || region_layers.size() != local.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layerwise push: ", remote.regions.size(), " remote regions, ", local.size(),
        " local regions and ", region_layers.size(), " region layers must match"));
  }
  for (size_t i = 0; i < region_layers.size(); ++i) {
    if (region_layers[i] < 0 || region_layers[i] >= options.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("region ", i, " names layer ",
                                                     region_layers[i], " of ",
                                                     options.num_layers));
    }
  }
  return std::shared_ptr<LayerwisePush>(
      new LayerwisePush(std::move(push), std::move(executor), std::move(remote),
                        std::move(remote_runs), std::move(local), std::move(region_layers),
                        options));
}

LayerwisePush::LayerwisePush(PushFn push, Executor executor, RemoteKvDescriptor remote,
                             std::vector<BlockRun> remote_runs, std::vector<KvRegion> local,
                             std::vector<int32_t> region_layers, const Options& options)
    : push_(std::move(push)),
      executor_(std::move(executor)),
      remote_(std::move(remote)),
      remote_runs_(std::move(remote_runs)),
      local_(std::move(local)),
      options_(options),
      num_groups_((options.num_layers + options.layers_per_group - 1) /
                  options.layers_per_group) {
  group_remote_.resize(num_groups_);
  group_local_.resize(num_groups_);
  for (RemoteKvDescriptor& d : group_remote_) d.worker_address = remote_.worker_address;
  for (size_t i = 0; i < local_.size(); ++i) {
    const int32_t group = region_layers[i] / options_.layers_per_group;
    group_remote_[group].regions.push_back(remote_.regions[i]);
    group_local_[group].push_back(local_[i]);
  }
}

int32_t LayerwisePush::num_groups_pushed() const {
  absl::MutexLock lock(&mu_);
  return pushed_;
}

int64_t LayerwisePush::bytes_pushed() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

bool LayerwisePush::DoneLocked() const {
  return (status_.ok() && pushed_ == num_groups_) || (!status_.ok() && !running_);
}

std::function<void()> LayerwisePush::TakeDoneLocked() {
  if (done_.empty() || !DoneLocked()) return nullptr;
  std::vector<DoneCallback> callbacks;
  callbacks.swap(done_);
  return [callbacks = std::move(callbacks), status = status_] {
    for (const DoneCallback& done : callbacks) done(status);
  };
}

void LayerwisePush::FailLocked(absl::Status why) {
  if (status_.ok()) status_ = std::move(why);
  queue_.clear();
}

absl::Status LayerwisePush::Start(absl::Span<const int32_t> local_block_ids) {
  std::function<void()> done;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("layerwise push started twice");
    started_ = true;
    const int64_t reserved = TotalBlocks(remote_runs_);
    if (local_block_ids.empty() || reserved < static_cast<int64_t>(local_block_ids.size())) {
      status = absl::InvalidArgumentError(
          absl::StrCat("the peer reserved ", reserved, " blocks; the prompt's KV needs ",
                       local_block_ids.size()));
    } else {
      // The peer's first blocks in sequence order, as many as ours.
      std::vector<int32_t> dest;
      dest.reserve(local_block_ids.size());
      for (const BlockRun& r : remote_runs_) {
        for (int32_t b = 0; b < r.num_blocks && dest.size() < local_block_ids.size(); ++b) {
          dest.push_back(r.first_block + b);
        }
      }
      local_runs_ = CoalesceBlocks(local_block_ids);
      dest_runs_ = CoalesceBlocks(dest);
      num_blocks_ = static_cast<int64_t>(local_block_ids.size());
      status = ValidateTransfer(remote_, dest_runs_, local_, local_runs_).status();
    }
    if (!status.ok()) {
      FailLocked(status);
      done = TakeDoneLocked();
    }
  }
  if (done) done();
  return status;
}

void LayerwisePush::LayerReady(int32_t layer, LayerWait wait) {
  std::function<void()> done;
  bool start_drain = false;
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return;  // failed or cancelled: nothing more moves
    if (!started_ || layer != next_layer_) {
      FailLocked(absl::FailedPreconditionError(absl::StrCat(
          "layerwise push: layer ", layer, " reported ",
          started_ ? absl::StrCat("while layer ", next_layer_, " was expected")
                   : std::string("before the blocks were known"))));
      done = TakeDoneLocked();
    } else {
      ++next_layer_;
      if (wait) pending_waits_.push_back(std::move(wait));
      const bool group_end = next_layer_ % options_.layers_per_group == 0 ||
                             next_layer_ == options_.num_layers;
      if (group_end) {
        queue_.push_back(Ready{(next_layer_ - 1) / options_.layers_per_group,
                               std::move(pending_waits_)});
        pending_waits_.clear();
        if (!running_) running_ = start_drain = true;
      }
    }
  }
  if (done) done();
  if (start_drain) executor_([self = shared_from_this()] { self->Drain(); });
}

void LayerwisePush::Cancel(absl::Status why) {
  if (why.ok()) why = absl::CancelledError("layerwise push cancelled");
  std::function<void()> done;
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok() || pushed_ == num_groups_) return;  // already failed, or all landed
    FailLocked(std::move(why));
    done = TakeDoneLocked();
  }
  if (done) done();
}

void LayerwisePush::OnDone(DoneCallback callback) {
  std::function<void()> done;
  {
    absl::MutexLock lock(&mu_);
    done_.push_back(std::move(callback));
    done = TakeDoneLocked();
  }
  if (done) done();
}

void LayerwisePush::Drain() {
  for (;;) {
    Ready next;
    std::function<void()> done;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      if (!status_.ok() || queue_.empty()) {
        running_ = false;
        stop = true;
        done = TakeDoneLocked();
      } else {
        next = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (stop) {
      if (done) done();
      return;
    }
    absl::Status status;
    for (LayerWait& wait : next.waits) {
      if (status.ok()) status = wait();
    }
    if (status.ok() && absl::Now() >= options_.deadline) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "layerwise push: the deadline passed before group ", next.group, " of ", num_groups_));
    }
    if (status.ok()) status = PushGroup(next.group);
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      ++pushed_;
      for (const KvRegion& r : group_local_[next.group]) bytes_ += r.block_bytes * num_blocks_;
    } else {
      FailLocked(absl::Status(status.code(),
                              absl::StrCat("layerwise push of layer group ", next.group, " of ",
                                           num_groups_, ": ", status.message())));
    }
  }
}

absl::Status LayerwisePush::PushGroup(int32_t group) {
  if (group_local_[group].empty()) return absl::OkStatus();  // no region of these layers moves
  std::vector<BlockRun> dest, local;
  {
    absl::MutexLock lock(&mu_);
    dest = dest_runs_;
    local = local_runs_;
  }
  return push_(group_remote_[group], dest, group_local_[group], local, options_.deadline);
}

}  // namespace sluice::transfer
