#include "services/serve/encoder_command.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/encoder/embedding_staging.h"
#include "services/encoder/encoder_service.h"
#include "services/serve/api_auth_flags.h"
#include "services/serve/log.h"
#include "services/common/registration_client.h"
#include "services/common/worker_http.h"
#include "transfer/kv_transfer.h"

namespace sluice {

int RunEncoder(const EncoderOptions& options) {
  const sigset_t signals = BlockServerSignals();
  absl::StatusOr<std::unique_ptr<vision::VisionEncoder>> encoder = LoadVisionEncoderOn(
      options.model_dir,
      ResolveVisionPlacement(options.multimodal, "cpu", options.load_format));
  if (!encoder.ok()) {
    spdlog::error("cannot load the image encoder: {}", encoder.status().ToString());
    return 1;
  }
  spdlog::info("vision tower on {}", (*encoder)->device());
  std::unique_ptr<vision::EmbeddingCache> cache;
  if (options.multimodal.encoder_cache_bytes > 0) {
    cache = std::make_unique<vision::EmbeddingCache>(options.multimodal.encoder_cache_bytes);
  }
  if (absl::Status tls = ValidatePeerTls(options.tls); !tls.ok()) {
    spdlog::error("{}", std::string(tls.message()));
    return 1;
  }
  EncoderServiceOptions service_options;
  service_options.decode_limits.max_bytes = options.multimodal.max_image_bytes;
  service_options.decode_limits.max_pixels = options.multimodal.max_image_pixels;
  service_options.max_images_per_call = options.max_images_per_call;
  service_options.test_encode_delay_ms = options.test_encode_delay_ms;
  // The staged hand-off: embeddings wait in registered memory for the worker's RMA read.
  std::unique_ptr<transfer::KvTransferAgent> agent;
  std::unique_ptr<EmbeddingStaging> staging;
  if (!options.no_ucx) {
    transfer::KvTransferOptions transfer_options;
    transfer_options.transports = options.ucx_transports;
    absl::StatusOr<std::unique_ptr<transfer::KvTransferAgent>> created =
        transfer::KvTransferAgent::Create(transfer_options);
    if (!created.ok()) {
      spdlog::error("UCX: {} (--no-ucx answers every embedding inline)",
                    created.status().ToString());
      return 1;
    }
    agent = *std::move(created);
    EmbeddingStagingOptions staging_options;
    staging_options.arena_bytes = options.embedding_staging_bytes;
    staging_options.lease = absl::Milliseconds(options.embedding_lease_ms);
    absl::StatusOr<std::unique_ptr<EmbeddingStaging>> made =
        EmbeddingStaging::Create(agent.get(), staging_options);
    if (!made.ok()) {
      spdlog::error("embedding staging arena: {}", made.status().ToString());
      return 1;
    }
    staging = *std::move(made);
  }
  service_options.staging = staging.get();
  service_options.inline_max_bytes = options.embedding_inline_max_bytes;
  EncoderService service(encoder->get(), cache.get(), service_options);

  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second process on a taken port would start
  // and share it. Off, so it fails to bind instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  builder.AddListeningPort(options.listen,
                           PeerServerCredentials(options.tls, ClientCertificates::kRequire),
                           &bound_port);
  builder.SetMaxReceiveMessageSize(256 << 20);  // a few large images per call
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    spdlog::error("cannot listen on {}", options.listen);
    return 1;
  }
  WorkerHttpOptions http_options;
  http_options.host = options.http_host;
  http_options.port = static_cast<uint16_t>(options.http_port);
  http_options.render_metrics = [&service] { return service.RenderMetrics(); };
  http_options.healthy = [&service] { return !service.draining(); };  // 503 while draining
  absl::StatusOr<std::unique_ptr<HttpServer>> http = StartWorkerHttp(std::move(http_options));
  if (!http.ok()) {
    spdlog::error("metrics HTTP server: {}", http.status().ToString());
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  const std::string advertise =
      options.advertise.empty() ? absl::StrCat(host, ":", bound_port) : options.advertise;
  std::unique_ptr<RegistrationClient> registration;
  if (!options.router.empty()) {
    RegistrationOptions reg;
    reg.router_address = options.router;
    reg.worker.set_role(v1::WORKER_ROLE_ENCODER);
    reg.worker.set_address(advertise);
    reg.worker.set_model(options.model_dir);
    const bool wildcard = options.http_host == "0.0.0.0" || options.http_host == "::";
    reg.worker.set_metrics_address(
        absl::StrCat(wildcard ? advertise.substr(0, advertise.rfind(':')) : options.http_host,
                     ":", (*http)->port()));
    EncoderService* service_ptr = &service;
    registration = std::make_unique<RegistrationClient>(reg, [service_ptr] {
      v1::WorkerLoad load;
      load.set_num_running_requests(service_ptr->num_in_flight());
      const StepTotals totals = service_ptr->encode_totals();
      load.mutable_encode_steps()->set_num_steps(totals.num_steps);
      load.mutable_encode_steps()->set_num_tokens(totals.num_tokens);
      load.mutable_encode_steps()->set_seconds(totals.seconds);
      load.set_num_images_answered(service_ptr->num_images());
      return load;
    });
  }
  std::printf("Sluice encoder listening on %s:%d\n", host.c_str(), bound_port);
  std::printf("Sluice encoder metrics on http://%s:%u/metrics\n", options.http_host.c_str(),
              static_cast<unsigned>((*http)->port()));
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("received signal {}, draining (up to {} s)", signal_number,
               options.drain_timeout_s);
  // Drain: the router stops sending images here; calls in flight finish (bounded), then the
  // encoder leaves the router at once rather than at its lease's end.
  service.set_draining(true);
  if (registration != nullptr) registration->Drain();
  const absl::Time drain_until = absl::Now() + absl::Seconds(options.drain_timeout_s);
  while (service.num_in_flight() > 0 && absl::Now() < drain_until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (registration != nullptr) registration->Deregister();
  registration.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*http)->Stop();
  return 0;
}

}  // namespace sluice
