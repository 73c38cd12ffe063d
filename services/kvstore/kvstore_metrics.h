// RenderKvStoreMetrics: the kvstore's Prometheus text exposition (format 0.0.4): blocks, bytes
// and capacity per tier (gauges), hits per tier, misses, evictions per tier, expirations, corrupt
// blocks, stored blocks, refused puts (counters, `_total`), active leases, and UCX transfer
// counters when the store runs with UCX.
#ifndef SLUICE_SERVICES_KVSTORE_KVSTORE_METRICS_H_
#define SLUICE_SERVICES_KVSTORE_KVSTORE_METRICS_H_

#include <string>

#include "services/kvstore/block_store.h"
#include "transfer/kv_transfer.h"

namespace sluice::kvstore {

// `transfer` may be null (no UCX).
std::string RenderKvStoreMetrics(const BlockStoreStats& stats,
                                 const transfer::KvTransferStats* transfer);

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_KVSTORE_METRICS_H_
