// Scheduler: decides, each step, which sequences run and how many tokens each computes.
//
// Policy (vLLM v1-style, one token budget for prefill and decode):
//  1. Running sequences first, in admission order: each gets all its uncomputed tokens (1 for a
//     decode, the rest of the prompt for a partly prefilled one) up to the remaining budget.
//     When the KV blocks they need are not free, the most recently admitted running sequence
//     is preempted (blocks freed, recomputed from scratch later) until they fit.
//  2. Waiting sequences in FIFO order (preempted ones go first) while budget, blocks and the
//     max_num_seqs limit allow; a long prompt is split into prefill chunks over several steps.
// Not thread-safe.
#ifndef SLUICE_ENGINE_SCHED_SCHEDULER_H_
#define SLUICE_ENGINE_SCHED_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/kv/kv_block_allocator.h"
#include "engine/sched/sequence.h"

namespace sluice {

struct SchedulerConfig {
  int64_t block_size = 16;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 512;
};

// ScheduledSequence: `num_new_tokens` tokens of `seq` starting at seq->num_computed_tokens.
// When they reach the end of seq->token_ids the step samples a token for it.
struct ScheduledSequence {
  Sequence* seq = nullptr;
  int32_t num_new_tokens = 0;
  bool samples() const { return seq->num_computed_tokens + num_new_tokens == seq->num_tokens(); }
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> scheduled;
  int32_t num_batched_tokens = 0;
  int32_t num_preempted = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, int64_t num_kv_blocks);

  // Add queues a new sequence at the back of the waiting queue. Takes ownership.
  void Add(std::unique_ptr<Sequence> seq);
  // Schedule plans one step. Sequences stay owned by the scheduler.
  SchedulerOutput Schedule();
  // Remove takes a finished or aborted sequence out (waiting or running), frees its blocks and
  // returns it; nullptr if no sequence has that id.
  std::unique_ptr<Sequence> Remove(const std::string& request_id);
  Sequence* Find(const std::string& request_id);

  // Disaggregation hooks.
  // Reserve allocates blocks for `num_tokens` tokens and parks `seq` outside the waiting and
  // running queues (never scheduled) until Activate. Returns false (seq untouched, still owned
  // by the caller) when not enough blocks are free.
  bool Reserve(std::unique_ptr<Sequence>& seq, int64_t num_tokens);
  // Activate moves a reserved sequence to the front of the waiting queue (it keeps its blocks
  // and num_computed_tokens). False if no reserved sequence has that id.
  bool Activate(const std::string& request_id);
  // Detach takes a sequence out (waiting, running or reserved) WITHOUT freeing its blocks; the
  // caller owns the blocks (returns them with FreeBlocks). nullptr if unknown.
  std::unique_ptr<Sequence> Detach(const std::string& request_id);
  // FreeBlocks drops one reference to each block (blocks from Detach).
  void FreeBlocks(const std::vector<int32_t>& blocks) { allocator_.Free(blocks); }
  int64_t num_reserved() const { return static_cast<int64_t>(reserved_.size()); }

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  const KvBlockAllocator& allocator() const { return allocator_; }
  int64_t num_preemptions() const { return num_preemptions_; }

 private:
  // EnsureBlocks grows seq's block table to hold `num_tokens` tokens; false if blocks ran out.
  bool EnsureBlocks(Sequence& seq, int64_t num_tokens);
  void Preempt(Sequence& seq);

  SchedulerConfig config_;
  KvBlockAllocator allocator_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  std::vector<std::unique_ptr<Sequence>> reserved_;  // waiting for a KV transfer
  int64_t next_admission_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_SCHEDULER_H_
