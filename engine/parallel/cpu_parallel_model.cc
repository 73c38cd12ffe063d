#include "engine/parallel/cpu_parallel_model.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/parallel/cpu_communicator.h"

namespace sluice {
namespace {

class CpuParallelModel : public Model {
 public:
  // `full_spec`: the unsharded model's KV spec (a rank storing it holds the whole KV).
  CpuParallelModel(std::unique_ptr<CpuCommunicatorGroup> group,
                   std::vector<std::unique_ptr<Model>> ranks, const KvCacheSpec& full_spec)
      : group_(std::move(group)), ranks_(std::move(ranks)), full_spec_(full_spec) {}

  const ModelConfig& config() const override { return ranks_[0]->config(); }
  KvCacheSpec kv_cache_spec() const override { return ranks_[0]->kv_cache_spec(); }
  int64_t WeightBytesPerToken() const override { return ranks_[0]->WeightBytesPerToken(); }
  // The all-reduce adds ranks in rank order and expert parallelism combines per token in top-k
  // order (cpu_communicator.h, expert_parallel.h): invariant when every rank's model is.
  bool IsBatchInvariant() const override {
    return std::all_of(ranks_.begin(), ranks_.end(),
                       [](const std::unique_ptr<Model>& r) { return r->IsBatchInvariant(); });
  }

  absl::Status Forward(const ForwardInput& input, KvCache& kv_cache,
                       absl::Span<float> logits) override {
    const size_t n = ranks_.size();
    // Caches of ranks 1..N-1 follow rank 0's geometry (the engine sizes rank 0's).
    if (caches_.size() != n - 1 || (n > 1 && (caches_[0]->num_blocks() != kv_cache.num_blocks() ||
                                              caches_[0]->block_size() != kv_cache.block_size()))) {
      caches_.clear();
      for (size_t r = 1; r < n; ++r) {
        caches_.push_back(std::make_unique<KvCache>(ranks_[r]->kv_cache_spec(),
                                                    kv_cache.num_blocks(), kv_cache.block_size()));
      }
    }
    SyncReplicatedContext(input, kv_cache);
    rank_logits_.resize(n - 1);
    for (auto& l : rank_logits_) l.resize(logits.size());
    return RunAll([&](size_t r) {
      if (r == 0) return ranks_[0]->Forward(input, kv_cache, logits);
      return ranks_[r]->Forward(input, *caches_[r - 1], absl::MakeSpan(rank_logits_[r - 1]));
    });
  }

  absl::Status UpdateExpertPlacement(absl::Span<const int32_t> expert_slots) override {
    return RunAll([&](size_t r) { return ranks_[r]->UpdateExpertPlacement(expert_slots); });
  }

  // Rank 0's reason (missing MTP weights, or that it is sharded) — not the base class's "no
  // MTP module", which would blame the architecture. Never OK: ForwardMtp is not collective.
  absl::Status MtpStatus() const override {
    if (absl::Status rank = ranks_[0]->MtpStatus(); !rank.ok()) return rank;
    return absl::FailedPreconditionError(
        "the model is sharded over tensor/expert-parallel ranks (TP/EP) and the MTP module "
        "drafts on an unsharded model only");
  }

  std::vector<int64_t> TakeExpertLoad() override {
    std::vector<int64_t> total;
    for (auto& rank : ranks_) {
      const std::vector<int64_t> load = rank->TakeExpertLoad();
      total.resize(load.size(), 0);
      for (size_t e = 0; e < load.size(); ++e) total[e] += load[e];
    }
    return total;
  }

 private:
  // A rank that fails mid-step must not leave the others waiting out their timeout. Input
  // errors (InvalidArgument) are found by every rank alike before any collective (all ranks
  // validate the same ForwardInput), so they leave the group usable for the next step.
  static bool MustAbort(const absl::Status& s) { return !s.ok() && !absl::IsInvalidArgument(s); }

  static bool SameSpec(const KvCacheSpec& a, const KvCacheSpec& b) {
    return a.num_layers == b.num_layers && a.k_floats_per_token == b.k_floats_per_token &&
           a.v_floats_per_token == b.v_floats_per_token;
  }

  // SyncReplicatedContext copies the context blocks of this step's sequences from the engine's
  // cache into the other ranks' caches when every rank stores the whole KV (MLA's replicated
  // latent, attention replicated under EP alone, or a single KV head replicated over TP ranks). The engine's cache is rank 0's, and KV can
  // land there without a Forward (KV transfer from a prefill worker, a kvstore load); the other
  // ranks must attend to the same entries. Costs one copy of the context KV per rank per step.
  void SyncReplicatedContext(const ForwardInput& input, const KvCache& kv_cache) {
    const KvCacheSpec& spec = kv_cache.spec();
    if (!SameSpec(spec, full_spec_)) return;  // KV heads split: each rank's own entries (serve)
    const int64_t bs = kv_cache.block_size();
    const int64_t k_block = bs * spec.k_floats_per_token, v_block = bs * spec.v_floats_per_token;
    for (auto& cache : caches_) {
      if (!SameSpec(cache->spec(), full_spec_)) continue;
      for (const SequenceSlice& seq : input.sequences) {
        const int64_t blocks = std::min<int64_t>((seq.num_context_tokens + bs - 1) / bs,
                                                 static_cast<int64_t>(seq.block_table.size()));
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t id = seq.block_table[b];
          for (int64_t l = 0; l < spec.num_layers; ++l) {
            std::copy_n(kv_cache.k(l) + id * k_block, k_block, cache->k(l) + id * k_block);
            std::copy_n(kv_cache.v(l) + id * v_block, v_block, cache->v(l) + id * v_block);
          }
        }
      }
    }
  }

  // RunAll runs fn(rank) for every rank at once, rank 0 on the calling thread, and returns the
  // first error (by rank).
  template <typename Fn>
  absl::Status RunAll(Fn fn) {
    const size_t n = ranks_.size();
    std::vector<absl::Status> status(n);
    std::vector<std::thread> threads;
    for (size_t r = 1; r < n; ++r) {
      threads.emplace_back([&, r] {
        status[r] = fn(r);
        if (MustAbort(status[r])) group_->Abort();
      });
    }
    status[0] = fn(0);
    if (MustAbort(status[0])) group_->Abort();
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<CpuCommunicatorGroup> group_;
  std::vector<std::unique_ptr<Model>> ranks_;
  KvCacheSpec full_spec_;
  std::vector<std::unique_ptr<KvCache>> caches_;  // ranks 1..N-1
  std::vector<std::vector<float>> rank_logits_;   // ranks 1..N-1, discarded
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadCpuParallelModel(const std::string& dir,
                                                            const CpuParallelOptions& options) {
  auto group = CpuCommunicatorGroup::Create(options.world_size, options.timeout);
  if (!group.ok()) return group.status();
  std::vector<std::unique_ptr<Model>> ranks;
  KvCacheSpec full_spec;
  for (int32_t r = 0; r < options.world_size; ++r) {
    auto model = LoadModel(dir);
    if (!model.ok()) return model.status();
    if (r == 0) full_spec = (*model)->kv_cache_spec();
    ParallelShard shard;
    shard.rank = r;
    shard.world_size = options.world_size;
    shard.comm = (*group)->communicator(r);
    shard.tensor_parallel = options.tensor_parallel;
    shard.expert_parallel = options.expert_parallel;
    shard.expert_slots = options.expert_slots;
    if (absl::Status s = (*model)->Shard(shard); !s.ok()) return s;
    ranks.push_back(std::move(*model));
  }
  return std::unique_ptr<Model>(new CpuParallelModel(std::move(*group), std::move(ranks), full_spec));
}

}  // namespace sluice
