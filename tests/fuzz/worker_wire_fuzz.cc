// What a peer worker sends about KV blocks (sluice.v1.KvBlocks in PrefillResponse.kv and
// PushKvRequest.destination): the block runs and the serialized RemoteKvDescriptor, through
// the checks the decode worker (PullKv, RequestPush) and the prefill worker (RunPush) apply
// before anything reaches UCX. No cluster is needed: the checks are pure functions of the
// message and the local cache geometry.
//
// Input: byte 0 the reservation size (blocks the receiving side holds for the request), then a
// serialized KvBlocks. Checks beyond "no crash": accepted runs stay within [0, INT32_MAX], the
// decode side never takes more blocks than it reserved, and a descriptor that parses
// re-serializes to the same bytes.
#include <cstdint>
#include <limits>
#include <vector>

#include "services/common/peer_kv_blocks.h"
#include "sluice/v1/kv.pb.h"
#include "transfer/block_runs.h"
#include "transfer/block_runs_wire.h"
#include "transfer/kv_transfer.h"

namespace {

// The local cache: two layers' K and V regions of 8 blocks of 64 bytes each.
struct LocalCache {
  std::vector<uint8_t> memory = std::vector<uint8_t>(4 * 8 * 64);
  std::vector<sluice::transfer::KvRegion> regions;
  LocalCache() {
    for (int i = 0; i < 4; ++i) regions.push_back({memory.data() + i * 8 * 64, 8, 64});
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const LocalCache* local = new LocalCache();
  const int64_t reserved = data[0] % 16;
  sluice::v1::KvBlocks kv;
  if (!kv.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;

  auto raw = sluice::transfer::RemoteKvDescriptor::Parse(kv.kv_descriptor());
  if (raw.ok() && raw->Serialize() != kv.kv_descriptor()) __builtin_trap();
  // Decode side (PullKv): both full layouts and the full-attention subset of SWA replay.
  for (const std::vector<int32_t>& indices :
       {std::vector<int32_t>{0, 1, 2, 3}, std::vector<int32_t>{0, 1}, std::vector<int32_t>{3, 9}}) {
    (void)sluice::ParseTransferRegions(kv.kv_descriptor(), local->regions, indices);
  }
  std::vector<int32_t> blocks(static_cast<size_t>(reserved));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(7 - i % 8);
  auto remote_runs = sluice::transfer::RunsFromWire(kv, reserved);
  if (remote_runs.ok()) {
    const int64_t n = sluice::transfer::TotalBlocks(*remote_runs);
    if (n < 0 || n > reserved) __builtin_trap();
    for (const auto& run : *remote_runs) {
      if (run.first_block < 0 || run.num_blocks < 1 ||
          int64_t{run.first_block} + run.num_blocks - 1 > std::numeric_limits<int32_t>::max()) {
        __builtin_trap();
      }
    }
    std::vector<int32_t> local_ids(blocks.begin(), blocks.begin() + n);
    auto pairs = sluice::transfer::PairRuns(*remote_runs,
                                            sluice::transfer::CoalesceBlocks(local_ids));
    if (!pairs.ok()) __builtin_trap();  // equal totals, valid runs: must pair
  }
  // Prefill side (RunPush): the destination may reserve more than the prompt needs.
  auto dest_runs = sluice::transfer::RunsFromWire(kv, std::numeric_limits<int32_t>::max());
  if (dest_runs.ok()) {
    const size_t needed = static_cast<size_t>(reserved);
    std::vector<int32_t> ids = sluice::transfer::FirstBlocks(*dest_runs, needed);
    if (ids.size() > needed) __builtin_trap();
    for (int32_t id : ids) {
      if (id < 0) __builtin_trap();
    }
    (void)sluice::transfer::PairRuns(sluice::transfer::CoalesceBlocks(ids),
                                     sluice::transfer::CoalesceBlocks(ids));
  }
  return 0;
}
