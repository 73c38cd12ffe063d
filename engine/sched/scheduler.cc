#include "engine/sched/scheduler.h"

#include <algorithm>
#include <utility>

namespace sluice {

Scheduler::Scheduler(const SchedulerConfig& config, int64_t num_kv_blocks)
    : config_(config), allocator_(num_kv_blocks) {}

void Scheduler::Add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

Sequence* Scheduler::Find(const std::string& request_id) {
  for (auto& s : running_) {
    if (s->request.request_id == request_id) return s.get();
  }
  for (auto& s : waiting_) {
    if (s->request.request_id == request_id) return s.get();
  }
  for (auto& s : reserved_) {
    if (s->request.request_id == request_id) return s.get();
  }
  return nullptr;
}

bool Scheduler::Reserve(std::unique_ptr<Sequence>& seq, int64_t num_tokens) {
  if (!EnsureBlocks(*seq, num_tokens)) return false;
  reserved_.push_back(std::move(seq));
  return true;
}

bool Scheduler::Activate(const std::string& request_id) {
  auto it = std::find_if(reserved_.begin(), reserved_.end(), [&](const auto& s) {
    return s->request.request_id == request_id;
  });
  if (it == reserved_.end()) return false;
  waiting_.push_front(std::move(*it));
  reserved_.erase(it);
  return true;
}

std::unique_ptr<Sequence> Scheduler::Remove(const std::string& request_id) {
  std::unique_ptr<Sequence> out = Detach(request_id);
  if (out != nullptr) {
    allocator_.Free(out->block_table);
    out->block_table.clear();
  }
  return out;
}

std::unique_ptr<Sequence> Scheduler::Detach(const std::string& request_id) {
  std::unique_ptr<Sequence> out;
  auto match = [&](const std::unique_ptr<Sequence>& s) {
    return s->request.request_id == request_id;
  };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    out = std::move(*it);
    running_.erase(it);
  } else if (auto wit = std::find_if(waiting_.begin(), waiting_.end(), match);
             wit != waiting_.end()) {
    out = std::move(*wit);
    waiting_.erase(wit);
  } else if (auto rit = std::find_if(reserved_.begin(), reserved_.end(), match);
             rit != reserved_.end()) {
    out = std::move(*rit);
    reserved_.erase(rit);
  }
  return out;
}

bool Scheduler::EnsureBlocks(Sequence& seq, int64_t num_tokens) {
  const int64_t needed =
      NumBlocksFor(num_tokens, config_.block_size) - static_cast<int64_t>(seq.block_table.size());
  if (needed <= 0) return true;
  return allocator_.Allocate(needed, seq.block_table);
}

void Scheduler::Preempt(Sequence& seq) {
  allocator_.Free(seq.block_table);
  seq.block_table.clear();
  seq.num_computed_tokens = 0;
  seq.num_cached_tokens = 0;
  ++seq.num_preemptions;
  ++num_preemptions_;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int32_t budget = config_.max_num_batched_tokens;

  // 1. Running sequences, oldest first; preempt from the newest end when blocks run out.
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Sequence& seq = *running_[i];
    const int32_t n = std::min(seq.num_tokens() - seq.num_computed_tokens, budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool fits = EnsureBlocks(seq, seq.num_computed_tokens + n);
    while (!fits) {
      // Victim: the most recently admitted running sequence (possibly `seq` itself).
      std::unique_ptr<Sequence> victim = std::move(running_.back());
      running_.pop_back();
      Preempt(*victim);
      ++out.num_preempted;
      const bool was_self = victim.get() == &seq;
      waiting_.push_front(std::move(victim));
      if (was_self) break;
      fits = EnsureBlocks(seq, seq.num_computed_tokens + n);
    }
    if (!fits) break;  // `seq` preempted itself; everything after it is gone too
    out.scheduled.push_back({&seq, n});
    budget -= n;
    ++i;
  }

  // 2. Waiting sequences, FIFO, unless this step had to preempt (avoid thrashing).
  while (out.num_preempted == 0 && !waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    Sequence& seq = *waiting_.front();
    const int32_t n = std::min(seq.num_tokens() - seq.num_computed_tokens, budget);
    if (!EnsureBlocks(seq, seq.num_computed_tokens + n)) break;
    seq.admission_order = next_admission_++;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    out.scheduled.push_back({running_.back().get(), n});
    budget -= n;
  }
  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return out;
}

}  // namespace sluice
