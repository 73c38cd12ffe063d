// `sluice kvstore`: the KV block store service (services/kvstore/README.md).
//
//   sluice kvstore --port 7300 --dram-bytes 4G --ssd-dir /var/lib/sluice/kvstore
//                  --ssd-bytes 200G --ttl-hours 72 [--metrics-port 7301]
#ifndef SLUICE_SERVICES_SERVE_KVSTORE_COMMAND_H_
#define SLUICE_SERVICES_SERVE_KVSTORE_COMMAND_H_

#include <cstdint>
#include <string>

#include "services/common/peer_tls.h"

namespace CLI {
class App;
}

namespace sluice {

struct KvStoreOptions {
  std::string host = "127.0.0.1";  // gRPC listen address
  int port = 7300;                 // 0: any free port
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 7301;         // HTTP /metrics and /health; 0: any free port
  std::string dram_bytes = "1G";   // DRAM tier (arena) size; K/M/G/T suffixes (powers of 1024)
  std::string dram_page_bytes = "64M";  // arena page: the largest block accepted
  std::string ssd_dir = "kvstore-data";
  std::string ssd_bytes = "16G";
  double ttl_hours = 72;
  bool ssd_sync_writes = false;    // fdatasync every block file (power-loss safe)
  double max_lease_seconds = 60;
  double expire_interval_seconds = 60;
  std::string ucx_transports;      // UCX_TLS syntax; empty: UCX's choice
  bool no_ucx = false;             // inline gRPC transfers only (no UCX data path)
  // SIGTERM: new reads/writes are refused (clients compute instead) while granted leases end,
  // for at most this long.
  double drain_timeout_s = 10;
  PeerTlsOptions tls;  // --tls-cert/--tls-key/--tls-ca: clients need a certificate of the CA
};

// AddKvStoreCommand: registers `kvstore` on `app`, filling `options`.
CLI::App* AddKvStoreCommand(CLI::App& app, KvStoreOptions& options);

// RunKvStore: serves until SIGINT/SIGTERM, then drains (KvStoreService::set_draining, /health
// 503) until no lease is active or drain_timeout_s passed; the exit code.
int RunKvStore(const KvStoreOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_KVSTORE_COMMAND_H_
