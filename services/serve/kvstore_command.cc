#include "services/serve/kvstore_command.h"

#include <signal.h>
#include <sys/mman.h>

#include <cstdio>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/common/http_server.h"
#include "services/kvstore/block_store.h"
#include "services/kvstore/kvstore_metrics.h"
#include "services/kvstore/kvstore_service.h"
#include "services/serve/log.h"
#include "services/serve/tls_flags.h"
#include "transfer/kv_transfer.h"

namespace sluice {
namespace {

// ParseBytes: "4096", "64M", "4G", "1.5T" (binary multiples) -> bytes.
absl::StatusOr<int64_t> ParseBytes(const std::string& text) {
  std::string s = absl::AsciiStrToUpper(text);
  if (!s.empty() && s.back() == 'B') s.pop_back();
  if (!s.empty() && s.back() == 'I') s.pop_back();  // "GiB" -> "G"
  double scale = 1;
  if (!s.empty() && std::string_view("KMGT").find(s.back()) != std::string_view::npos) {
    scale = static_cast<double>(1ull << (10 * (1 + std::string_view("KMGT").find(s.back()))));
    s.pop_back();
  }
  double v = 0;
  if (!absl::SimpleAtod(s, &v) || v <= 0 || v * scale > 9e18) {
    return absl::InvalidArgumentError(absl::StrCat("not a byte size: '", text, "'"));
  }
  return static_cast<int64_t>(v * scale);
}

// HostArena: the DRAM tier's memory when the store runs without UCX (page-aligned, locked in
// RAM if the limit allows, so a swapped-out block never stalls a read).
class HostArena {
 public:
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(int64_t bytes) {
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return absl::ResourceExhaustedError("cannot map the DRAM arena");
    if (mlock(p, static_cast<size_t>(bytes)) != 0) {
      spdlog::warn("could not lock the {}-byte DRAM arena in RAM (RLIMIT_MEMLOCK?)", bytes);
    }
    return std::unique_ptr<HostArena>(new HostArena(p, bytes));
  }
  ~HostArena() { munmap(base_, static_cast<size_t>(bytes_)); }
  uint8_t* base() const { return static_cast<uint8_t*>(base_); }

 private:
  HostArena(void* base, int64_t bytes) : base_(base), bytes_(bytes) {}
  void* base_;
  int64_t bytes_;
};

}  // namespace

CLI::App* AddKvStoreCommand(CLI::App& app, KvStoreOptions& o) {
  CLI::App* cmd = app.add_subcommand("kvstore", "KV block store (DRAM + SSD tiers, UCX data path)");
  cmd->add_option("--host", o.host, "gRPC address to listen on");
  cmd->add_option("--port", o.port, "gRPC port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--metrics-host", o.metrics_host, "HTTP /metrics address");
  cmd->add_option("--metrics-port", o.metrics_port, "HTTP /metrics port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--dram-bytes", o.dram_bytes, "DRAM tier size (e.g. 4G)");
  cmd->add_option("--dram-page-bytes", o.dram_page_bytes,
                  "DRAM arena page size: the largest block accepted (e.g. 64M)");
  cmd->add_option("--ssd-dir", o.ssd_dir, "SSD tier directory (kept across restarts)");
  cmd->add_option("--ssd-bytes", o.ssd_bytes, "SSD tier size (e.g. 200G)");
  cmd->add_option("--ttl-hours", o.ttl_hours, "Delete blocks unused for this long")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--ssd-sync-writes", o.ssd_sync_writes,
                "fdatasync every block file before acknowledging (survives power loss)");
  cmd->add_option("--max-lease-seconds", o.max_lease_seconds,
                  "Longest a client may hold DRAM slots for a transfer")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--expire-interval-seconds", o.expire_interval_seconds,
                  "How often expired blocks and leases are swept")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ucx-transports", o.ucx_transports, "UCX transports (UCX_TLS syntax)");
  cmd->add_flag("--no-ucx", o.no_ucx, "No UCX data path: clients use the inline gRPC calls");
  cmd->add_option("--drain-timeout-s", o.drain_timeout_s,
                  "SIGTERM: refuse new reads/writes and wait this long at most for granted "
                  "transfers to end")
      ->check(CLI::NonNegativeNumber);
  AddPeerTlsFlags(*cmd, o.tls);
  return cmd;
}

int RunKvStore(const KvStoreOptions& o) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (absl::Status tls = ValidatePeerTls(o.tls); !tls.ok()) {
    spdlog::error("{}", std::string(tls.message()));
    return 1;
  }
  absl::StatusOr<int64_t> dram_bytes = ParseBytes(o.dram_bytes);
  absl::StatusOr<int64_t> page_bytes = ParseBytes(o.dram_page_bytes);
  absl::StatusOr<int64_t> ssd_bytes = ParseBytes(o.ssd_bytes);
  for (const absl::Status& s : {dram_bytes.status(), page_bytes.status(), ssd_bytes.status()}) {
    if (!s.ok()) {
      spdlog::error("{}", s.ToString());
      return 1;
    }
  }

  // The arena: UCX-allocated (and registered) memory, so clients reach it by RMA; on one host
  // UCX places it in shared memory that peers map directly.
  std::unique_ptr<transfer::KvTransferAgent> agent;
  std::unique_ptr<HostArena> host_arena;
  uint8_t* arena = nullptr;
  if (!o.no_ucx) {
    transfer::KvTransferOptions t;
    t.transports = o.ucx_transports;
    auto created = transfer::KvTransferAgent::Create(t);
    if (!created.ok()) {
      spdlog::error("UCX: {}", created.status().ToString());
      return 1;
    }
    agent = std::move(*created);
    auto region = agent->AllocateRegion(*dram_bytes);
    if (!region.ok()) {
      spdlog::error("DRAM arena: {}", region.status().ToString());
      return 1;
    }
    arena = static_cast<uint8_t*>(region->base);
  } else {
    auto created = HostArena::Create(*dram_bytes);
    if (!created.ok()) {
      spdlog::error("DRAM arena: {}", created.status().ToString());
      return 1;
    }
    host_arena = std::move(*created);
    arena = host_arena->base();
  }

  kvstore::BlockStoreOptions so;
  so.dram_arena = arena;
  so.dram_bytes = *dram_bytes;
  so.dram_page_bytes = *page_bytes;
  so.ssd_dir = o.ssd_dir;
  so.ssd_bytes = *ssd_bytes;
  so.ssd_sync_writes = o.ssd_sync_writes;
  so.ttl = absl::Seconds(o.ttl_hours * 3600);
  so.max_lease = absl::Seconds(o.max_lease_seconds);
  absl::StatusOr<std::unique_ptr<kvstore::BlockStore>> store = kvstore::BlockStore::Open(so);
  if (!store.ok()) {
    spdlog::error("kvstore: {}", store.status().ToString());
    return 1;
  }
  const kvstore::BlockStoreStats opened = (*store)->stats();
  spdlog::info("kvstore: SSD tier {} holds {} blocks ({} bytes) from earlier runs", o.ssd_dir,
               opened.ssd_blocks, opened.ssd_bytes);

  kvstore::KvStoreService service(store->get(), agent.get());
  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second process on a taken port would start
  // and share it. Off, so it fails to bind instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  builder.AddListeningPort(absl::StrCat(o.host, ":", o.port),
                           PeerServerCredentials(o.tls, ClientCertificates::kRequire), &bound_port);
  builder.RegisterService(&service);
  // Inline puts/gets carry whole blocks: allow a batch of large ones.
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    spdlog::error("kvstore: cannot listen on {}:{}", o.host, o.port);
    return 1;
  }

  HttpServerOptions http_options;
  http_options.host = o.metrics_host;
  http_options.port = static_cast<uint16_t>(o.metrics_port);
  http_options.num_io_threads = 1;
  kvstore::BlockStore* store_ptr = store->get();
  transfer::KvTransferAgent* agent_ptr = agent.get();
  kvstore::KvStoreService* service_ptr = &service;
  auto http = HttpServer::Start(
      http_options, [store_ptr, agent_ptr, service_ptr](const HttpRequestInfo& req,
                                           std::shared_ptr<ResponseSink> sink, Poster) {
        const std::string path = req.target.substr(0, req.target.find('?'));
        if (req.method == "GET" && path == "/metrics") {
          const transfer::KvTransferStats t =
              agent_ptr != nullptr ? agent_ptr->stats() : transfer::KvTransferStats{};
          sink->SendResponse(200, "text/plain; version=0.0.4",
                             kvstore::RenderKvStoreMetrics(store_ptr->stats(),
                                                           agent_ptr != nullptr ? &t : nullptr));
        } else if (req.method == "GET" && path == "/health" && service_ptr->draining()) {
          sink->SendResponse(503, "application/json", "{\"status\":\"draining\"}");
        } else if (req.method == "GET" && path == "/health") {
          sink->SendResponse(200, "application/json", "{\"status\":\"ok\"}");
        } else {
          sink->SendResponse(404, "application/json", "{\"error\":\"not found\"}");
        }
        return std::shared_ptr<RequestHandle>();
      });
  if (!http.ok()) {
    spdlog::error("metrics HTTP server: {}", http.status().ToString());
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }

  // TTL and lease sweeper.
  absl::Notification stop;
  std::thread sweeper([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Seconds(o.expire_interval_seconds))) {
      store_ptr->ExpireOld();
    }
  });

  std::printf("Sluice kvstore listening on %s:%d metrics http://%s:%u/metrics (data path: %s)\n",
              o.host.c_str(), bound_port, o.metrics_host.c_str(), (*http)->port(),
              agent != nullptr ? "ucx" : "inline");
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  // Drain: refuse new reads and writes (the engines compute instead) and let the transfers
  // already granted commit or release, bounded by --drain-timeout-s.
  spdlog::info("received signal {}, draining (up to {} s)", signal_number, o.drain_timeout_s);
  service.set_draining(true);
  const absl::Time drain_until = absl::Now() + absl::Seconds(o.drain_timeout_s);
  while (store_ptr->stats().active_leases > 0 && absl::Now() < drain_until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  spdlog::info("{} active leases left, stopping", store_ptr->stats().active_leases);
  stop.Notify();
  sweeper.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  (*http)->Stop();
  return 0;
}

}  // namespace sluice
