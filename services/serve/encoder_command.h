// `sluice encoder`: the vision encoder service (services/encoder) as its own process — the
// encoder pool of encoder / prefill / decode disaggregation (issue 26).
//
//   sluice encoder --model DIR [--device cpu|cuda] [--vision-batch 8] [--load-format auto|dummy]
//                  [--listen 127.0.0.1:7301] [--http-port 0]
//                  [--router HOST:PORT] [--advertise HOST:PORT] [--drain-timeout-s 30]
//                  [--encoder-cache-bytes N] [--max-image-bytes N] [--max-image-pixels N]
//                  [--no-ucx] [--ucx-transports TLS] [--embedding-staging-bytes N]
//                  [--embedding-inline-max-bytes N] [--embedding-lease-ms N]
//
// Embeddings over --embedding-inline-max-bytes stay in a UCX-registered staging arena and the
// answer carries a reference the worker RMA-reads (services/encoder/embedding_staging.h);
// --no-ucx answers every embedding inline.
//
// With --router it registers with the router as an encoder worker (WORKER_ROLE_ENCODER) and
// heartbeats its load (Encode calls in flight); the router then sends it the images of its
// requests. SIGTERM drains: the router stops sending images, calls in flight finish, and the
// encoder deregisters before it exits.
//
// Prints "Sluice encoder listening on HOST:PORT" and "Sluice encoder metrics on
// http://HOST:PORT/metrics" once serving; SIGINT/SIGTERM stop it.
#ifndef SLUICE_SERVICES_SERVE_ENCODER_COMMAND_H_
#define SLUICE_SERVICES_SERVE_ENCODER_COMMAND_H_

#include <cstdint>
#include <string>

#include "services/common/peer_tls.h"
#include "services/serve/multimodal_setup.h"

namespace sluice {

struct EncoderOptions {
  std::string model_dir;
  std::string listen = "127.0.0.1:7301";
  std::string http_host = "127.0.0.1";
  int http_port = 0;
  int32_t max_images_per_call = 64;
  std::string router;     // the router's Registry host:port; empty: no registration
  std::string advertise;  // the address the router reaches this encoder at (default: listen)
  double drain_timeout_s = 30;  // SIGTERM: finish Encode calls in flight within this long
  int32_t test_encode_delay_ms = 0;  // test only: delay every Encode call
  bool no_ucx = false;                               // every embedding inline
  std::string ucx_transports;                        // UCX_TLS syntax; empty: UCX's choice
  int64_t embedding_staging_bytes = int64_t{256} << 20;
  int64_t embedding_inline_max_bytes = 64 << 10;     // at most this many bytes go inline
  int32_t embedding_lease_ms = 30000;                // staged slots unreleased this long are freed
  std::string load_format = "auto";  // auto | dummy (random vision weights, --device cuda)
  MultimodalFlags multimodal;  // cache size, image limits, --device (vision_device)
  PeerTlsOptions tls;          // --tls-cert/--tls-key/--tls-ca: callers need a CA certificate
};

int RunEncoder(const EncoderOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_ENCODER_COMMAND_H_
