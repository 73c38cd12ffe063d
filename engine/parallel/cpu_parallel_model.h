// CpuParallelModel: one model replica split over N ranks that are threads of this process,
// joined by a CpuCommunicatorGroup. It implements Model, so the engine (or a test) drives it
// like any model: each Forward runs all ranks' Forward at once, with rank 0 on the calling
// thread. Used for the CPU tensor/expert-parallel equality tests and as the single-host
// reference for the NCCL path (one process per GPU instead of one thread per rank).
#ifndef SLUICE_ENGINE_PARALLEL_CPU_PARALLEL_MODEL_H_
#define SLUICE_ENGINE_PARALLEL_CPU_PARALLEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/model/model.h"

namespace sluice {

struct CpuParallelOptions {
  int32_t world_size = 2;
  bool tensor_parallel = true;
  bool expert_parallel = false;
  std::vector<int32_t> expert_slots;           // ParallelShard::expert_slots; empty: contiguous
  absl::Duration timeout = absl::Seconds(60);  // per collective
};

// LoadCpuParallelModel loads the model in `dir` once per rank (LoadModel), shards rank r with
// Model::Shard and returns the replica. The returned model's kv_cache_spec() is rank 0's; the
// KvCache passed to Forward serves rank 0 and the other ranks keep their own caches of the same
// geometry (same block ids: one plan drives all ranks). Logits come from rank 0 (every rank
// computes the same ones). Not thread-safe (one Forward at a time, like any Model).
// Errors: those of LoadModel and Model::Shard (e.g. InvalidArgument for a head count the world
// size does not divide), InvalidArgument for world_size < 1.
absl::StatusOr<std::unique_ptr<Model>> LoadCpuParallelModel(const std::string& dir,
                                                            const CpuParallelOptions& options);

}  // namespace sluice

#endif  // SLUICE_ENGINE_PARALLEL_CPU_PARALLEL_MODEL_H_
