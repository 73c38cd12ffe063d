// `sluice encoder`: the vision encoder service (services/encoder) as its own process — the
// encoder pool of encoder / prefill / decode disaggregation (issue 26).
//
//   sluice encoder --model DIR [--listen 127.0.0.1:7301] [--http-port 0]
//                  [--router HOST:PORT] [--advertise HOST:PORT] [--drain-timeout-s 30]
//                  [--encoder-cache-bytes N] [--max-image-bytes N] [--max-image-pixels N]
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
  MultimodalFlags multimodal;  // cache size and image limits
  PeerTlsOptions tls;          // --tls-cert/--tls-key/--tls-ca: callers need a CA certificate
};

int RunEncoder(const EncoderOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_ENCODER_COMMAND_H_
