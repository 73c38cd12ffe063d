#include "services/router/kv_peer_config.h"

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

std::string DescribeLayout(const KvPeerConfig& c) {
  return absl::StrCat("block_size ", c.block_size, ", ", c.num_layers, " layers, ",
                      c.values_per_token, " values/token of ", c.dtype_bytes, " bytes");
}

const char* ReplayWhat(int64_t swa_replay_tokens) {
  return swa_replay_tokens > 0 ? "moves only full-attention layers" : "moves every layer";
}

}  // namespace

std::optional<std::string> KvPeerMismatch(const KvPeerConfig& a, const std::string& a_name,
                                          const KvPeerConfig& b, const std::string& b_name) {
  if (a.transfer_mode != b.transfer_mode) {
    return absl::StrCat("KV transfer mode mismatch: ", a_name, " runs --kv-transfer-mode ",
                        a.transfer_mode, " but ", b_name, " runs --kv-transfer-mode ",
                        b.transfer_mode,
                        "; start every prefill and decode worker with the same "
                        "--kv-transfer-mode");
  }
  if ((a.swa_replay_tokens > 0) != (b.swa_replay_tokens > 0)) {
    return absl::StrCat("SWA replay mismatch: ", a_name, " runs --swa-replay-tokens ",
                        a.swa_replay_tokens, " (", ReplayWhat(a.swa_replay_tokens), ") but ",
                        b_name, " runs --swa-replay-tokens ", b.swa_replay_tokens, " (",
                        ReplayWhat(b.swa_replay_tokens),
                        "); start every prefill and decode worker with the same "
                        "--swa-replay-tokens");
  }
  if (a.block_size != b.block_size || a.num_layers != b.num_layers ||
      a.values_per_token != b.values_per_token || a.dtype_bytes != b.dtype_bytes) {
    return absl::StrCat("KV layout mismatch: ", a_name, " has ", DescribeLayout(a), " but ", b_name,
                        " has ", DescribeLayout(b),
                        "; serve the same model with the same --block-size and --device on "
                        "every prefill and decode worker");
  }
  return std::nullopt;
}

}  // namespace sluice
