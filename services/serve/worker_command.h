// `sluice prefill` and `sluice decode`: gRPC workers for disaggregated serving.
//
//   sluice prefill --model DIR --listen HOST:PORT --router HOST:PORT [engine flags]
//   sluice decode  --model DIR --listen HOST:PORT --router HOST:PORT [engine flags]
//     [--http-port N] [--kv-transfer-mode pull|push|layerwise]
// See services/prefill/README.md.
#ifndef SLUICE_SERVICES_SERVE_WORKER_COMMAND_H_
#define SLUICE_SERVICES_SERVE_WORKER_COMMAND_H_

#include <string>

#include "services/common/peer_tls.h"
#include "services/serve/model_runtime.h"

namespace sluice {

// The most --kv-staging-transfers: each holds 2 x --kv-staging-slot-bytes of pinned memory.
inline constexpr int kMaxKvStagingTransfers = 64;

struct WorkerOptions {
  RuntimeOptions runtime;
  std::string listen = "127.0.0.1:7101";  // gRPC host:port (port 0: any free port)
  std::string advertise;        // address peers/router use; empty: the bound listen address
  std::string router;           // router Registry host:port; empty: do not register
  std::string ucx_transports;   // UCX_TLS syntax; empty: UCX's choice
  double kv_pin_timeout_s = 30;     // prefill: pinned blocks freed without a Release after this
  double reserve_timeout_s = 30;    // decode: reservation without transfer fails after this
  double transfer_timeout_s = 10;   // decode: KV transfer deadline
  std::string http_host = "127.0.0.1";  // /metrics and /health (HTTP)
  int http_port = 0;                    // 0: any free port (printed at start)
  // "pull" (decode reads), "push" (prefill writes after the prefill) or "layerwise" (prefill
  // writes each layer while it computes the next ones).
  std::string kv_transfer_mode = "pull";
  // SIGTERM: stop taking work, finish what is held within this; the rest is cut (the router
  // migrates decode streams to other workers), then exit 0.
  double drain_timeout_s = 30;
  double test_transfer_delay_ms = 0;  // decode, test only: hold each KV transfer this long
  double test_post_transfer_delay_ms = 0;  // decode, test only: hold each transfer's completion
  double test_reserve_answer_delay_ms = 0;  // decode, test only: hold each Reserve's answer
  int layerwise_group_layers = 1;     // prefill, layerwise mode: model layers per push
  int test_fail_layer_push = -1;      // prefill, test only: this layer group's push fails
  // Move the KV through pinned host staging slots (transfer/staged_transfer.h) instead of
  // registering the KV cache with UCX: a prefill worker pushes through them (push and layerwise
  // modes), a decode worker pulls through them (pull mode); in the other modes the peer moves
  // the KV, so it must be registered (refused at startup). "auto": when the KV is in device
  // memory the UCX context cannot register (a UCX without CUDA support or one that found no
  // device); "on": always (e.g. device KV over tcp between hosts; a CPU engine's KV is then
  // copied with memcpy); "off": never (such a device KV fails at startup).
  std::string kv_staging = "auto";
  int64_t kv_staging_slot_bytes = 8 << 20;  // staging: bytes per slot (2 slots)
  // Staging: transfers staged at once, each with its own 2 slots and copy lanes (pushes on a
  // prefill worker, pulls on a decode worker); the worker's transfer threads are at least as
  // many. In [1, kMaxKvStagingTransfers].
  int kv_staging_transfers = 4;
  // --tls-cert/--tls-key/--tls-ca: mTLS on the gRPC port (callers need a certificate of the
  // CA) and on every channel this worker opens (router, prefill peers, kvstore).
  PeerTlsOptions tls;
  // Vision-language models: the embedding cache of the images this worker encodes itself
  // (the router's self-encode fallback, when no encoder worker could); 0: no cache.
  int64_t encoder_cache_bytes = 64 << 20;
  int image_encode_threads = 2;          // threads encoding those images
  double test_image_encode_delay_ms = 0;  // test only: hold each of those encodes this long
  // Test only: register as a worker from before the router's KV peer check (no
  // WorkerInfo.kv_peer), so the router admits it whatever its settings.
  bool test_register_without_kv_peer = false;
};

// RunPrefillWorker / RunDecodeWorker: serve until SIGINT/SIGTERM; exit code.
int RunPrefillWorker(const WorkerOptions& options);
int RunDecodeWorker(const WorkerOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_WORKER_COMMAND_H_
