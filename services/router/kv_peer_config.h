// KvPeerConfig: the settings a prefill and a decode worker must share to move KV between them
// (WorkerInfo.kv_transfer_mode and WorkerInfo.kv_peer, sluice/v1/registry.proto). The router
// refuses to register a worker whose settings differ from those of the workers already in its
// pool (WorkerRegistry::Register): a mixed pool would fail requests one at a time, each looking
// like an error of its own.
#ifndef SLUICE_SERVICES_ROUTER_KV_PEER_CONFIG_H_
#define SLUICE_SERVICES_ROUTER_KV_PEER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

namespace sluice {

struct KvPeerConfig {
  std::string transfer_mode = "pull";  // --kv-transfer-mode: "pull" | "push" | "layerwise"
  // The effective --swa-replay-tokens: > 0 moves only the full-attention layers' KV. Peers must
  // agree on on/off (each receiver replays its own count).
  int64_t swa_replay_tokens = 0;
  // The KV cache geometry (v1::KvLayout without num_blocks, which is each worker's own).
  int64_t block_size = 0;  // tokens per block
  int64_t num_layers = 0;
  int64_t values_per_token = 0;  // K + V values per token and layer
  int64_t dtype_bytes = 0;
};

// KvPeerMismatch: why workers with configs `a` and `b` cannot move KV between them, one
// sentence naming both values (`a_name` / `b_name` say which worker is which, e.g. "decode
// worker 10.0.0.2:7101"); nullopt when they can.
std::optional<std::string> KvPeerMismatch(const KvPeerConfig& a, const std::string& a_name,
                                          const KvPeerConfig& b, const std::string& b_name);

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_KV_PEER_CONFIG_H_
