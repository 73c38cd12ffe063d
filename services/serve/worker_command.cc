#include "services/serve/worker_command.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/kv/swa_replay.h"
#include "services/decode/decode_service.h"
#include "services/prefill/prefill_service.h"
#include "services/serve/log.h"
#include "services/common/kv_event_publisher.h"
#include "services/common/registration_client.h"
#include "services/common/worker_http.h"
#include "services/common/worker_images.h"
#include "services/common/worker_metrics.h"
#include "services/common/worker_wire.h"
#include "transfer/device_copier.h"
#include "transfer/kv_transfer.h"
#include "transfer/staged_transfer.h"
#include "transfer/staging_pool.h"
#if defined(SLUICE_HAVE_CUDA)
#include "transfer/cuda/cuda_device_copier.h"
#endif

namespace sluice {
namespace {

enum class Role { kPrefill, kDecode };

// MaybeKvStaging: the pinned host staging --kv-staging asks for (null: none), for KV that is
// not registered with UCX, with `num_members` (--kv-staging-transfers) transfers at once, each
// on its own member: a prefill worker pushes through the pool (PrefillServiceOptions::staging),
// a decode worker pulls through it (DecodeServiceOptions::staging). "on" always, "auto" when
// the KV is in memory `agent` cannot register (device KV, a UCX context without CUDA). Staging
// works where this worker moves the KV itself: a prefill worker pushes (push, layerwise), a
// decode worker pulls (pull); in the other mode the peer moves it, so this worker's KV must be
// registered. Errors: FailedPrecondition for staging in a mode where the peer moves the KV, or
// "off" with KV UCX cannot register; InvalidArgument for a slot smaller than a block; those of
// the copier and StagingPool::Create.
absl::StatusOr<std::unique_ptr<transfer::StagingPool>> MaybeKvStaging(
    const WorkerOptions& options, Role role, v1::KvTransferMode mode,
    const KvTransferMemory& memory, transfer::KvTransferAgent* agent, int num_members) {
  const bool reachable = agent->SupportsMemoryType(memory.type);
  const bool pull = mode == v1::KV_TRANSFER_MODE_PULL;
  // The mode in which this worker moves the KV (and so can stage it).
  const bool moves_kv = role == Role::kPrefill ? !pull : pull;
  const char* staging_modes = role == Role::kPrefill ? "push or layerwise" : "pull";
  if (options.kv_staging == "off" || (options.kv_staging == "auto" && reachable)) {
    if (!reachable) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this UCX context cannot register ", transfer::MemoryTypeName(memory.type),
          " memory and --kv-staging is off: use --kv-staging auto with --kv-transfer-mode ",
          staging_modes, " (or a UCX built with CUDA support)"));
    }
    return std::unique_ptr<transfer::StagingPool>();
  }
  if (!moves_kv) {
    const std::string why = absl::StrCat(
        "--kv-staging ", options.kv_staging,
        reachable ? "" : absl::StrCat("; UCX cannot register ",
                                      transfer::MemoryTypeName(memory.type), " memory"));
    if (role == Role::kPrefill) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the KV is pushed through staging (", why,
          "), so decode workers cannot pull it: run every worker with --kv-transfer-mode push or "
          "layerwise"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "this decode worker's KV is not registered with UCX (", why, "), but in ",
        options.kv_transfer_mode,
        " mode the prefill worker writes into it: run every worker with --kv-transfer-mode pull "
        "(this worker then pulls through its staging)",
        reachable ? ", or this one with --kv-staging off" : ""));
  }
  int64_t largest_block = 0;
  for (const transfer::KvRegion& r : memory.regions) {
    largest_block = std::max(largest_block, r.block_bytes);
  }
  if (options.kv_staging_slot_bytes < largest_block) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-staging-slot-bytes ", options.kv_staging_slot_bytes,
        " is smaller than one KV block of a layer (", largest_block,
        " bytes): give at least that (default ", WorkerOptions().kv_staging_slot_bytes, ")"));
  }
  static constexpr int kSlots = 2;  // one slot's device copy overlaps the other's RMA
  transfer::StagingPool::CopierFactory make_copier;
  if (memory.type == transfer::MemoryType::kCuda) {
#if defined(SLUICE_HAVE_CUDA)
    make_copier = []() -> absl::StatusOr<std::unique_ptr<transfer::DeviceCopier>> {
      absl::StatusOr<std::unique_ptr<transfer::CudaDeviceCopier>> copier =
          transfer::CudaDeviceCopier::Create(/*device=*/-1, kSlots);
      if (!copier.ok()) return copier.status();
      return std::unique_ptr<transfer::DeviceCopier>(*std::move(copier));
    };
#else
    return absl::FailedPreconditionError("device KV in a build without CUDA");
#endif
  } else {
    // The engine's host KV, copied with memcpy (the same pipeline a GPU worker runs).
    make_copier = []() -> absl::StatusOr<std::unique_ptr<transfer::DeviceCopier>> {
      return std::make_unique<transfer::HostMemcpyCopier>(kSlots);
    };
  }
  transfer::StagingOptions staging_options;
  staging_options.slot_bytes = options.kv_staging_slot_bytes;
  staging_options.num_slots = kSlots;
  absl::StatusOr<std::unique_ptr<transfer::StagingPool>> pool =
      transfer::StagingPool::Create(agent, num_members, make_copier, staging_options);
  if (!pool.ok()) return pool.status();
  spdlog::info("KV {} go through pinned host staging slots of {} bytes: {} per transfer, {} "
               "transfer{} at once ({} KV{})",
               role == Role::kPrefill ? "pushes" : "pulls", options.kv_staging_slot_bytes, kSlots,
               num_members, num_members == 1 ? "" : "s", transfer::MemoryTypeName(memory.type),
               reachable ? ", --kv-staging on" : " UCX cannot register");
  return pool;
}

int Run(const WorkerOptions& options, Role role) {
  const char* name = role == Role::kPrefill ? "prefill" : "decode";
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  v1::KvTransferMode transfer_mode;
  if (options.kv_transfer_mode == "pull") {
    transfer_mode = v1::KV_TRANSFER_MODE_PULL;
  } else if (options.kv_transfer_mode == "push") {
    transfer_mode = v1::KV_TRANSFER_MODE_PUSH;
  } else if (options.kv_transfer_mode == "layerwise") {
    transfer_mode = v1::KV_TRANSFER_MODE_LAYERWISE;
  } else {
    spdlog::error("--kv-transfer-mode must be pull, push or layerwise, not '{}'",
                  options.kv_transfer_mode);
    return 1;
  }
  if (options.http_port < 0 || options.http_port > 65535) {
    spdlog::error("--http-port must be in [0, 65535], not {}", options.http_port);
    return 1;
  }
  if (options.kv_staging_transfers < 1 || options.kv_staging_transfers > kMaxKvStagingTransfers) {
    spdlog::error("--kv-staging-transfers must be in [1, {}] (each staged transfer holds 2 "
                  "slots of --kv-staging-slot-bytes of pinned memory), not {}",
                  kMaxKvStagingTransfers, options.kv_staging_transfers);
    return 1;
  }

  // mTLS: checked before the model loads, so a bad file fails in a second.
  if (absl::Status tls = ValidatePeerTls(options.tls); !tls.ok()) {
    spdlog::error("{}", std::string(tls.message()));
    return 1;
  }
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials = PeerChannelCredentials(options.tls);

  RuntimeOptions runtime_options = options.runtime;
  runtime_options.kvstore_credentials = peer_credentials;
  runtime_options.engine.kv_hold_timeout_ms =
      static_cast<int64_t>(options.kv_pin_timeout_s * 1000);
  // The engine's reservation timeout is only a backstop: DecodeService frees unclaimed
  // reservations at --reserve-timeout-s, and a claimed one must outlive its transfer (which
  // has --transfer-timeout-s from the claim).
  runtime_options.engine.kv_reserve_timeout_ms = static_cast<int64_t>(
      (options.reserve_timeout_s + options.transfer_timeout_s + 5) * 1000);
  // A vision-language model's tower, for images the router sends as bytes (no encoder worker):
  // the engine's ImageEncoder, so images are encoded off the gRPC and engine threads and only
  // where their positions are computed. Without it (dummy weights, a folder whose tower does not
  // load) the worker still serves embeddings from encoder workers; it just does not advertise
  // image_encode.
  absl::StatusOr<std::shared_ptr<WorkerImages>> images = std::shared_ptr<WorkerImages>();
  if (runtime_options.load_format != "dummy") {
    WorkerImagesOptions images_options;
    images_options.cache_bytes = options.encoder_cache_bytes;
    images_options.encode_threads = options.image_encode_threads;
    images_options.test_encode_delay = absl::Milliseconds(options.test_image_encode_delay_ms);
    images = WorkerImages::Load(runtime_options.model_dir, images_options);
    if (!images.ok()) {
      spdlog::warn("no image encoding on this worker (images need encoder workers): {}",
                   images.status().ToString());
      images = std::shared_ptr<WorkerImages>();
    }
  }
  runtime_options.engine.image_encoder = *images;
  absl::StatusOr<ModelRuntime> runtime = LoadModelRuntime(runtime_options);
  if (!runtime.ok()) {
    spdlog::error("{}", runtime.status().ToString());
    return 1;
  }
  AsyncEngine& engine = runtime->backend->engine();
  // KV memory registered once with the transfer agent.
  transfer::KvTransferOptions transfer_options;
  transfer_options.transports = options.ucx_transports;
  auto agent = transfer::KvTransferAgent::Create(transfer_options);
  if (!agent.ok()) {
    spdlog::error("UCX: {}", agent.status().ToString());
    return 1;
  }
  // The KV cache's own memory is registered: host arrays on the CPU engine, the CUDA runner's
  // device arrays (moved GPU to GPU by UCX's cuda_ipc on one host) with --device cuda.
  absl::StatusOr<KvTransferMemory> memory = KvTransferMemoryOf(engine.model(), engine.kv_cache());
  if (!memory.ok()) {
    spdlog::error("KV memory: {}", memory.status().ToString());
    return 1;
  }
  std::vector<transfer::KvRegion> regions = memory->regions;
  // A prefill worker may push its KV, a decode worker pull it, through pinned host staging
  // instead of registering it (--kv-staging): then the KV stays unregistered and only the
  // staging slots are.
  // --kv-staging-transfers members (2 slots, 2 copy lanes each), so that many concurrent
  // pushes (prefill) or pulls (decode) do not wait for each other's slots; the services' transfer
  // threads are at least as many (below).
  absl::StatusOr<std::unique_ptr<transfer::StagingPool>> staging =
      MaybeKvStaging(options, role, transfer_mode, *memory, agent->get(),
                     options.kv_staging_transfers);
  if (!staging.ok()) {
    spdlog::error("KV staging: {}", staging.status().ToString());
    return 1;
  }
  std::string kv_descriptor;  // empty while staging: peers cannot reach this worker's KV
  if (*staging == nullptr) {
    for (const transfer::KvRegion& r : regions) {
      auto handle = (*agent)->RegisterRegion(r.base, r.num_blocks * r.block_bytes, memory->type);
      if (!handle.ok()) {
        spdlog::error("register {} KV memory: {}", transfer::MemoryTypeName(memory->type),
                      handle.status().ToString());
        return 1;
      }
    }
    auto descriptor = (*agent)->Describe(regions);
    if (!descriptor.ok()) {
      spdlog::error("describe KV memory: {}", descriptor.status().ToString());
      return 1;
    }
    kv_descriptor = descriptor->Serialize();
  }
  // Image embeddings staged on encoder workers are read over the same agent (RMA into its own
  // registered landing buffers), inline when that fails.
  if (*images != nullptr) {
    EmbeddingFetchOptions fetch_options;
    fetch_options.agent = agent->get();
    fetch_options.credentials = peer_credentials;
    absl::StatusOr<std::unique_ptr<EmbeddingFetcher>> fetcher =
        EmbeddingFetcher::Create(fetch_options);
    if (!fetcher.ok()) {
      spdlog::error("embedding landing buffers: {}", fetcher.status().ToString());
      return 1;
    }
    (*images)->SetEmbeddingFetcher(*std::move(fetcher));
  }
  // The fetcher's landing buffers are registered with the agent: gone before it is (this guard
  // is destroyed before `agent`, after the servers).
  struct DropFetcher {
    WorkerImages* images;
    ~DropFetcher() {
      if (images != nullptr) images->SetEmbeddingFetcher(nullptr);
    }
  } drop_fetcher{images->get()};

  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second process on a taken port would start
  // and share it. Off, so it fails to bind instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  builder.AddListeningPort(options.listen,
                           PeerServerCredentials(options.tls, ClientCertificates::kRequire),
                           &bound_port);
  // Requests with images may carry their embeddings inline (mm_inputs, 9 MiB per LLaVA-1.5
  // image: an encoder without UCX, or below its inline threshold).
  builder.SetMaxReceiveMessageSize(256 << 20);
  WorkerGrammars grammars(runtime->tokenizer.get());  // outlives the services
  std::unique_ptr<PrefillService> prefill;
  std::unique_ptr<DecodeService> decode;
  // The engine's last outputs (aborts of what is still in flight) go to the services' sessions:
  // it stops before they are destroyed, on every return below.
  struct StopEngineFirst {
    AsyncEngine* engine;
    ~StopEngineFirst() { engine->Shutdown(); }
  } stop_engine_first{&engine};
  std::string advertise = options.advertise;
  if (advertise.empty()) {
    const size_t colon = options.listen.rfind(':');
    advertise = options.listen.substr(0, colon + 1);  // port filled in after binding
  }
  WorkerMetrics metrics(name, runtime->served_model_name);
  if (role == Role::kPrefill) {
    PrefillServiceOptions prefill_options;
    prefill_options.transfer_mode = transfer_mode;
    prefill_options.pin_timeout = absl::Seconds(options.kv_pin_timeout_s);
    prefill_options.default_push_timeout = absl::Seconds(options.transfer_timeout_s);
    prefill_options.swa_replay_tokens = EffectiveSwaReplayTokens(
        engine.model(), runtime_options.engine.swa_replay_tokens);
    prefill_options.grammars = &grammars;
    prefill_options.images = images->get();
    prefill_options.layerwise_group_layers = options.layerwise_group_layers;
    prefill_options.test_fail_layer_group = options.test_fail_layer_push;
    if (*staging != nullptr) {
      prefill_options.staging = staging->get();
      prefill_options.push_threads =
          std::max(prefill_options.push_threads, options.kv_staging_transfers);
    }
    // The advertised address is only known after binding; the service copies it below.
    prefill = std::make_unique<PrefillService>(&engine, agent->get(), regions, kv_descriptor, "",
                                               &metrics, prefill_options);
    builder.RegisterService(prefill.get());
  } else {
    DecodeServiceOptions decode_options;
    decode_options.reserve_timeout = absl::Seconds(options.reserve_timeout_s);
    decode_options.transfer_timeout = absl::Seconds(options.transfer_timeout_s);
    decode_options.transfer_mode = transfer_mode;
    decode_options.swa_replay_tokens = EffectiveSwaReplayTokens(
        engine.model(), runtime_options.engine.swa_replay_tokens);
    decode_options.grammars = &grammars;
    decode_options.images = images->get();
    decode_options.test_transfer_delay = absl::Milliseconds(options.test_transfer_delay_ms);
    decode_options.test_post_transfer_delay =
        absl::Milliseconds(options.test_post_transfer_delay_ms);
    decode_options.test_reserve_answer_delay =
        absl::Milliseconds(options.test_reserve_answer_delay_ms);
    decode_options.channel_credentials = peer_credentials;
    if (*staging != nullptr) {
      decode_options.staging = staging->get();
      decode_options.transfer_threads =
          std::max(decode_options.transfer_threads, options.kv_staging_transfers);
    }
    decode = std::make_unique<DecodeService>(&engine, agent->get(), regions, kv_descriptor,
                                             &metrics, decode_options);
    builder.RegisterService(decode.get());
  }
  KvEventPublisher kv_events(&engine);  // KV events for KV-aware routers
  builder.RegisterService(&kv_events);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    spdlog::error("cannot listen on {}", options.listen);
    return 1;
  }
  if (options.advertise.empty()) advertise = absl::StrCat(advertise, bound_port);
  if (prefill != nullptr) {
    // Rebuild with the final address (no call can have arrived before registration).
    prefill->set_advertised_address(advertise);
  }

  // /metrics and /health over HTTP (scrapers, Kubernetes probes).
  WorkerHttpOptions http_options;
  http_options.host = options.http_host;
  http_options.port = static_cast<uint16_t>(options.http_port);
  PrefillService* prefill_ptr = prefill.get();
  DecodeService* decode_ptr = decode.get();
  transfer::KvTransferAgent* agent_ptr = agent->get();
  std::shared_ptr<KvConnector> kv_connector = runtime->kv_connector;
  const WorkerImages* images_ptr = images->get();
  const transfer::StagingPool* staging_ptr = staging->get();
  http_options.render_metrics = [&engine, &metrics, prefill_ptr, decode_ptr, agent_ptr,
                                 kv_connector, images_ptr, staging_ptr] {
    WorkerMetrics::ServiceGauges gauges;
    if (staging_ptr != nullptr) gauges.staging = staging_ptr->stats();
    if (prefill_ptr != nullptr) gauges.num_queued_prefill_tokens =
        prefill_ptr->num_queued_prefill_tokens();
    if (decode_ptr != nullptr) gauges.num_sessions = decode_ptr->num_sessions();
    AsyncEngineStats stats = engine.Stats();
    // Write-through finishes after the engine's last step: read the connector live.
    if (kv_connector != nullptr) stats.counters.kv_connector = kv_connector->stats();
    std::string text = metrics.Render(stats, agent_ptr->stats(), gauges);
    if (images_ptr != nullptr) text += RenderWorkerImageMetrics(*images_ptr);
    return text;
  };
  http_options.healthy = [&metrics] { return metrics.healthy(); };
  absl::StatusOr<std::unique_ptr<HttpServer>> http = StartWorkerHttp(std::move(http_options));
  if (!http.ok()) {
    spdlog::error("metrics HTTP server: {}", http.status().ToString());
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  // Peers reach a wildcard-bound HTTP server at the advertised gRPC host.
  const bool wildcard = options.http_host == "0.0.0.0" || options.http_host == "::";
  const std::string metrics_host =
      wildcard ? advertise.substr(0, advertise.rfind(':')) : options.http_host;
  const std::string metrics_address = absl::StrCat(metrics_host, ":", (*http)->port());

  // Set when the router refused this worker (its settings differ from the pool's).
  struct Refusal {
    std::mutex mu;
    std::optional<std::string> why;  // guarded by mu
  } refusal;
  std::unique_ptr<RegistrationClient> registration;
  if (!options.router.empty()) {
    RegistrationOptions reg;
    reg.router_address = options.router;
    reg.credentials = peer_credentials;
    reg.worker.set_role(role == Role::kPrefill ? v1::WORKER_ROLE_PREFILL
                                               : v1::WORKER_ROLE_DECODE);
    reg.worker.set_address(advertise);
    reg.worker.set_model(runtime->served_model_name);
    reg.worker.set_kv_block_size(static_cast<int32_t>(engine.block_size()));
    reg.worker.set_num_total_blocks(engine.Stats().num_total_blocks);
    reg.worker.set_max_model_len(engine.max_model_len());
    reg.worker.set_metrics_address(metrics_address);
    reg.worker.set_kv_transfer_mode(transfer_mode);
    // What KV peers must share: the router refuses this worker if its pool differs.
    if (!options.test_register_without_kv_peer) {
      v1::KvPeerConfig* kv_peer = reg.worker.mutable_kv_peer();
      kv_peer->set_swa_replay_tokens(static_cast<int32_t>(EffectiveSwaReplayTokens(
          engine.model(), runtime_options.engine.swa_replay_tokens)));
      *kv_peer->mutable_layout() = LayoutOf(engine.kv_cache(), engine.model().KvDtypeBytes());
    }
    // A refusal ends the worker (exit 1) through the signal wait below.
    reg.on_refused = [&refusal](const std::string& why) {
      {
        std::lock_guard<std::mutex> lock(refusal.mu);
        refusal.why = why;
      }
      kill(getpid(), SIGTERM);
    };
    // Grammars sent as SamplingParams.grammar_ebnf are compiled and enforced (WorkerGrammars).
    reg.worker.add_capabilities("grammar");  // registry.proto WorkerInfo.capabilities
    // Images sent as bytes are encoded here (WorkerImages).
    if (images_ptr != nullptr) reg.worker.add_capabilities("image_encode");
    // Migrations re-prefill prompt + the tokens already streamed here (resumed_output_token_ids).
    reg.worker.add_capabilities("resume");
    PrefillService* p = prefill.get();
    // (Every preemption and recompute is logged as it happens: EngineOptions::on_recompute.)
    auto heartbeat_load = [&engine, p]() {
      const AsyncEngineStats s = engine.Stats();
      v1::WorkerLoad load;
      load.set_num_waiting_requests(s.num_waiting_requests + s.num_reserved);
      load.set_num_running_requests(s.num_running_requests);
      load.set_num_free_blocks(s.num_free_blocks);
      load.set_num_total_blocks(s.num_total_blocks);
      load.set_num_pinned_blocks(s.num_held_blocks);
      if (p != nullptr) load.set_num_queued_prefill_tokens(p->num_queued_prefill_tokens());
      for (auto [from, to] : {std::pair{&s.counters.prefill_steps, load.mutable_prefill_steps()},
                              std::pair{&s.counters.decode_steps, load.mutable_decode_steps()}}) {
        to->set_num_steps(from->num_steps);
        to->set_num_tokens(from->num_tokens);
        to->set_seconds(from->seconds);
      }
      return load;
    };
    registration = std::make_unique<RegistrationClient>(reg, std::move(heartbeat_load));
  }
  std::printf("Sluice %s worker listening on %s (KV transfer: %s)\n", name, advertise.c_str(),
              options.kv_transfer_mode.c_str());
  std::printf("Sluice %s worker metrics on http://%s/metrics\n", name, metrics_address.c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::optional<std::string> refused;
  {
    std::lock_guard<std::mutex> lock(refusal.mu);
    refused = refusal.why;
  }
  if (refused.has_value()) {
    // Never registered: nothing to drain. A misconfigured worker must not run unnoticed.
    spdlog::error("exiting: the router at {} refused this {} worker: {}", options.router, name,
                  *refused);
    server->Shutdown(std::chrono::system_clock::now());
    registration.reset();
    (*http)->Stop();
    return 1;
  }
  // Drain: readiness fails and the router stops sending work at once; what this worker holds
  // gets --drain-timeout-s to finish. A prefill worker waits until its pinned KV was pulled
  // (the Release acks need the server up); a decode worker until its streams ended. Then the
  // worker deregisters and the server shuts down, cutting what is left: the router continues
  // cut decode streams on another decode worker (migration) and retries cut prefills.
  const absl::Time drain_until = absl::Now() + absl::Seconds(options.drain_timeout_s);
  spdlog::info("received signal {}, draining (up to {} s)", signal_number,
               options.drain_timeout_s);
  metrics.set_healthy(false);
  if (prefill != nullptr) prefill->set_draining(true);
  if (decode != nullptr) decode->set_draining(true);
  if (registration != nullptr) registration->Drain();
  auto idle = [&] {
    const AsyncEngineStats s = engine.Stats();
    if (decode != nullptr) return decode->num_sessions() == 0;
    return s.num_held_blocks == 0 && s.num_waiting_requests == 0 && s.num_running_requests == 0;
  };
  while (!idle() && absl::Now() < drain_until) absl::SleepFor(absl::Milliseconds(50));
  spdlog::info(idle() ? "drained" : "drain timeout: cutting the requests left");
  // Leave the router at once rather than at the lease's end; it cancels what is still in
  // flight here, and those requests fail over to other workers.
  if (registration != nullptr) registration->Deregister();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  registration.reset();
  (*http)->Stop();
  return 0;
}

}  // namespace

int RunPrefillWorker(const WorkerOptions& options) { return Run(options, Role::kPrefill); }
int RunDecodeWorker(const WorkerOptions& options) { return Run(options, Role::kDecode); }

}  // namespace sluice
