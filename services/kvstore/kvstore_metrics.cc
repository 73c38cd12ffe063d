#include "services/kvstore/kvstore_metrics.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace sluice::kvstore {
namespace {

void Family(std::string& out, const char* name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Tiered(std::string& out, const char* name, int64_t dram, int64_t ssd) {
  absl::StrAppend(&out, name, "{tier=\"dram\"} ", dram, "\n", name, "{tier=\"ssd\"} ", ssd, "\n");
}

void Value(std::string& out, const char* name, int64_t v) { absl::StrAppend(&out, name, " ", v, "\n"); }

}  // namespace

std::string RenderKvStoreMetrics(const BlockStoreStats& s,
                                 const transfer::KvTransferStats* transfer) {
  std::string out;
  Family(out, "sluice_kvstore_blocks", "gauge", "Blocks stored per tier.");
  Tiered(out, "sluice_kvstore_blocks", s.dram_blocks, s.ssd_blocks);
  Family(out, "sluice_kvstore_bytes", "gauge",
         "Bytes stored per tier (DRAM: block payloads; SSD: whole files).");
  Tiered(out, "sluice_kvstore_bytes", s.dram_bytes, s.ssd_bytes);
  Family(out, "sluice_kvstore_capacity_bytes", "gauge", "Capacity per tier.");
  Tiered(out, "sluice_kvstore_capacity_bytes", s.dram_capacity_bytes, s.ssd_capacity_bytes);
  Family(out, "sluice_kvstore_hits_total", "counter",
         "Blocks served, by the tier they were found in.");
  Tiered(out, "sluice_kvstore_hits_total", s.hits_dram, s.hits_ssd);
  Family(out, "sluice_kvstore_misses_total", "counter",
         "Blocks asked for and not served (absent, expired or corrupt).");
  Value(out, "sluice_kvstore_misses_total", s.misses);
  Family(out, "sluice_kvstore_evictions_total", "counter",
         "Blocks evicted for capacity (DRAM evictions move the block to SSD).");
  Tiered(out, "sluice_kvstore_evictions_total", s.evictions_dram, s.evictions_ssd);
  Family(out, "sluice_kvstore_expired_total", "counter", "Block copies deleted by the TTL.");
  Value(out, "sluice_kvstore_expired_total", s.expired);
  Family(out, "sluice_kvstore_corrupt_blocks_total", "counter",
         "Blocks that failed their checksum on a read and were deleted.");
  Value(out, "sluice_kvstore_corrupt_blocks_total", s.corrupt_blocks);
  Family(out, "sluice_kvstore_blocks_stored_total", "counter", "Blocks stored by puts.");
  Value(out, "sluice_kvstore_blocks_stored_total", s.blocks_stored);
  Family(out, "sluice_kvstore_put_checksum_mismatches_total", "counter",
         "Put blocks refused because the bytes did not match the client's checksum.");
  Value(out, "sluice_kvstore_put_checksum_mismatches_total", s.put_checksum_mismatches);
  Family(out, "sluice_kvstore_active_leases", "gauge", "Leases holding DRAM slots.");
  Value(out, "sluice_kvstore_active_leases", s.active_leases);
  if (transfer != nullptr) {
    Family(out, "sluice_kvstore_ucx_endpoints", "gauge", "Cached UCX endpoints.");
    Value(out, "sluice_kvstore_ucx_endpoints", transfer->num_endpoints);
  }
  return out;
}

}  // namespace sluice::kvstore
