#include "services/serve/router_command.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/model/model_config.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/api/openai_service.h"
#include "services/common/vllm_metrics.h"
#include "services/router/inference_grpc_service.h"
#include "services/router/kv_router.h"
#include "services/router/registry_service.h"
#include "services/router/router_metrics.h"
#include "services/router/worker_registry.h"
#include "services/serve/api_auth_flags.h"
#include "services/serve/log.h"
#include "services/serve/server_limits.h"
#include "services/serve/tls_flags.h"
#include "services/serve/model_runtime.h"

namespace sluice {
namespace {

// LeaseSweeper removes workers whose lease ran out, every `period`, until
// destroyed.
class LeaseSweeper {
 public:
  LeaseSweeper(WorkerRegistry* registry, absl::Duration period)
      : thread_([this, registry, period] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!stop_) {
            cv_.wait_for(lock, absl::ToChronoMilliseconds(period));
            if (stop_) break;
            lock.unlock();
            for (const std::string& id : registry->ExpireLeases()) {
              spdlog::warn("worker {} missed its lease; removed", id);
            }
            lock.lock();
          }
        }) {}
  ~LeaseSweeper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

int RunRouter(const RouterOptions& options) {
  const sigset_t signals = BlockServerSignals();
  absl::StatusOr<std::unique_ptr<ApiAuth>> auth = CreateApiAuth(options.auth);
  if (!auth.ok()) {
    spdlog::error("{}", std::string(auth.status().message()));
    return 1;
  }

  // mTLS with the workers: the router's public certificate is its identity.
  absl::StatusOr<PeerTlsOptions> peer_tls_or =
      PeerTlsFromPublic(options.http, options.tls_ca_file, "the router's");
  if (!peer_tls_or.ok()) {
    spdlog::error("{}", std::string(peer_tls_or.status().message()));
    return 1;
  }
  const PeerTlsOptions peer_tls = *peer_tls_or;
  std::shared_ptr<grpc::ChannelCredentials> worker_credentials = PeerChannelCredentials(peer_tls);

  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFile(options.model_dir + "/tokenizer.json");
  if (!tokenizer.ok()) {
    spdlog::error("cannot load the tokenizer: {}", std::string(tokenizer.status().ToString()));
    return 1;
  }
  std::unique_ptr<ChatTemplate> chat_template;
  absl::StatusOr<std::unique_ptr<ChatTemplate>> loaded_template =
      ChatTemplate::FromModelDir(options.model_dir);
  if (loaded_template.ok()) {
    chat_template = *std::move(loaded_template);
  } else if (!absl::IsNotFound(loaded_template.status())) {
    spdlog::error("cannot load the chat template: {}",
                  std::string(loaded_template.status().ToString()));
    return 1;
  }
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(options.model_dir);
  if (!config.ok()) {
    spdlog::error("cannot read config.json: {}", std::string(config.status().ToString()));
    return 1;
  }

  // Images: checked here (the same 400s as `sluice serve`) and encoded by encoder workers.
  absl::StatusOr<std::unique_ptr<MultimodalRuntime>> multimodal =
      LoadRouterMultimodal(options.model_dir, options.multimodal, **tokenizer,
                           chat_template.get());
  if (!multimodal.ok()) {
    spdlog::error("cannot set up image input: {}", multimodal.status().ToString());
    return 1;
  }

  // The planner sizes the encoder pool too when the model takes images.
  PlannerOptions planner_options = options.planner;
  planner_options.encoder_pool = *multimodal != nullptr;
  Planner planner(planner_options);
  Planner* planner_ptr = &planner;

  WorkerRegistryOptions registry_options;
  registry_options.lease = absl::Seconds(options.lease_seconds);
  registry_options.suspect_grace = absl::Seconds(options.suspect_grace_seconds);
  registry_options.lease_jitter_k = options.lease_jitter_k;
  registry_options.max_lease = absl::Seconds(options.max_lease_seconds);
  WorkerRegistry registry(registry_options);
  RemoteBackendOptions backend_options = options.backend;
  backend_options.max_model_len = options.max_model_len > 0
                                      ? options.max_model_len
                                      : static_cast<int32_t>(config->max_position_embeddings);
  absl::StatusOr<RoutingPolicy> routing_policy = ParseRoutingPolicy(options.routing_policy);
  if (!routing_policy.ok()) {
    spdlog::error("{}", std::string(routing_policy.status().message()));
    return 1;
  }
  KvRouterOptions kv_router_options;
  kv_router_options.policy = *routing_policy;
  kv_router_options.min_remote_prefill_tokens = backend_options.min_remote_prefill_tokens;
  kv_router_options.channel_credentials = worker_credentials;
  KvRouter kv_router(&registry, kv_router_options);  // outlives the backend
  backend_options.kv_router = &kv_router;
  backend_options.channel_credentials = worker_credentials;
  backend_options.on_image_request = [planner_ptr](int64_t num_images) {
    planner_ptr->ObserveImageRequest(absl::Now(), num_images);
  };
  auto backend = std::make_unique<RemoteBackend>(&registry, backend_options);
  RemoteBackend* backend_ptr = backend.get();

  const std::string model_name = options.served_model_name.empty()
                                     ? ModelNameFromDir(options.model_dir)
                                     : options.served_model_name;
  OpenAiServiceOptions service_options;
  service_options.served_model_name = model_name;
  service_options.max_concurrent_requests = options.max_concurrent_requests;
  service_options.allow_unknown_fields = options.allow_unknown_fields;
  service_options.log_requests = options.log_requests;
  if (!options.tool_call_parser.empty()) {
    service_options.tool_call_syntax = *tools::ToolCallSyntaxByName(options.tool_call_parser);
  }
  service_options.auth = auth->get();
  const CheckedImages* checked_images = nullptr;
  if (*multimodal != nullptr) {
    checked_images = (*multimodal)->checked.get();
    service_options.multimodal = &(*multimodal)->context;
    spdlog::info("vision-language model: {} tokens per image, at most {} images per prompt; "
                 "images go to registered encoder workers (else the workers encode them)",
                 (*multimodal)->context.tokens_per_image,
                 (*multimodal)->context.max_images_per_prompt);
  }
  // Chat template renders and tokenization run off the I/O threads (HTTP and gRPC).
  ApplyRenderFlags(options.render, service_options);
  // Structured outputs and tool calls: compiled here (errors are the router's 400s) and sent to
  // the workers as GBNF text (SamplingParams.grammar_ebnf).
  auto service = std::make_unique<OpenAiService>(backend_ptr, tokenizer->get(), chat_template.get(),
                                                 service_options);
  OpenAiService* service_ptr = service.get();
  service->metrics().set_finished_observer([planner_ptr](const FinishedRequest& r) {
    planner_ptr->ObserveRequest(absl::Now(), r.num_prompt_tokens, r.num_cached_tokens,
                                r.num_generation_tokens);
  });
  // PlanNow: the planner's answer for the registered workers.
  auto plan_now = [planner_ptr, &registry]() {
    std::vector<PlannerWorker> workers;
    for (const WorkerSnapshot& w : registry.List()) {
      PlannerWorker pw;
      pw.worker_id = w.worker_id;
      pw.pool = w.role == WorkerRole::kPrefill  ? PlannerPool::kPrefill
                : w.role == WorkerRole::kEncoder ? PlannerPool::kEncoder
                                                 : PlannerPool::kDecode;
      pw.draining = w.draining;
      pw.num_total_blocks = w.load.num_total_blocks;
      pw.block_size = w.load.block_size;
      pw.prefill_steps = w.load.prefill_steps;
      pw.decode_steps = w.load.decode_steps;
      pw.encode_steps = w.load.encode_steps;
      pw.num_images_answered = w.load.num_images_answered;
      workers.push_back(std::move(pw));
    }
    return planner_ptr->Plan(workers, absl::Now());
  };
  WorkerRegistry* registry_ptr = &registry;
  KvRouter* kv_router_ptr = &kv_router;

  // One gRPC port: the public Inference API (same validation, backend and metrics as the
  // HTTP API) and the Registry the workers register with.
  InferenceGrpcServiceOptions inference_options;
  inference_options.served_model_name = model_name;
  inference_options.max_concurrent_requests = options.max_concurrent_requests;
  inference_options.auth = auth->get();
  inference_options.multimodal = service_options.multimodal;
  inference_options.render_pools = service->render_pools();
  inference_options.grammar_compiler = [service_ptr] { return service_ptr->grammar_compiler(); };
  inference_options.tool_call_syntax = service_options.tool_call_syntax;
  inference_options.health = [registry_ptr]() {
    return registry_ptr->CountLive(WorkerRole::kDecode) > 0
               ? absl::OkStatus()
               : absl::UnavailableError("no decode worker registered");
  };
  InferenceGrpcService inference_service(backend_ptr, tokenizer->get(), chat_template.get(),
                                         &service->metrics(), inference_options);
  // With mTLS the port asks every caller for a certificate: the Registry admits only callers
  // with one of the cluster CA, Inference clients may come without.
  RegistryService registry_service(&registry, /*require_client_certificate=*/peer_tls.enabled());
  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second process on a taken port would start
  // and share it. Off, so it fails to bind instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int grpc_port = 0;
  builder.AddListeningPort(
      absl::StrCat(options.grpc_host, ":", options.grpc_port),
      peer_tls.enabled()
          ? PeerServerCredentials(peer_tls, ClientCertificates::kVerifyIfPresented)
          : GrpcServerCredentials(options.http),
      &grpc_port);
  builder.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  builder.RegisterService(&registry_service);
  builder.RegisterService(&inference_service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || grpc_port == 0) {
    spdlog::error("cannot listen for gRPC on {}:{}", options.grpc_host, options.grpc_port);
    return 1;
  }
  LeaseSweeper sweeper(&registry, registry_options.lease / 12);

  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      options.http,
      [service_ptr, registry_ptr, backend_ptr, kv_router_ptr, planner_ptr, plan_now,
       checked_images](
          const HttpRequestInfo& request,
                                               std::shared_ptr<ResponseSink> sink,
                                               Poster poster) -> std::shared_ptr<RequestHandle> {
        const std::string path = request.target.substr(0, request.target.find('?'));
        if ((path == "/v1/workers" || path == "/v1/planner") &&
            !service_ptr->Authorize(request, *sink, nullptr)) {
          return nullptr;
        }
        if (request.method == "GET" && path == "/v1/planner") {
          sink->SendResponse(200, "application/json",
                             planner_ptr->Json(plan_now(), absl::Now()).dump());
          return nullptr;
        }
        if (request.method == "GET" && path == "/v1/workers") {
          sink->SendResponse(200, "application/json", WorkersJson(registry_ptr->List()).dump());
          return nullptr;
        }
        if (request.method == "GET" && path == "/health" && backend_ptr->draining()) {
          sink->SendResponse(503, "application/json", R"({"status":"draining"})");
          return nullptr;
        }
        if (request.method == "GET" && path == "/health" &&
            registry_ptr->CountLive(WorkerRole::kDecode) == 0) {
          sink->SendResponse(503, "application/json",
                             R"({"status":"no decode worker registered"})");
          return nullptr;
        }
        if (request.method == "GET" && path == "/metrics") {
          // The front end's metrics (one scrape) plus the router's worker
          // gauges.
          struct Capture : ResponseSink {
            int status = 0;
            std::string content_type, body;
            void SendResponse(int s, const std::string& type, std::string b) override {
              status = s;
              content_type = type;
              body = std::move(b);
            }
            void StartEventStream() override {}
            void SendEvent(std::string) override {}
            void EndEventStream() override {}
          };
          auto capture = std::make_shared<Capture>();
          service_ptr->Handle(request, capture, poster);
          if (capture->status != 200) {  // e.g. 401 with --protect-metrics
            sink->SendResponse(capture->status, capture->content_type, std::move(capture->body));
            return nullptr;
          }
          capture->body += RenderRouterMetrics(registry_ptr->List(), backend_ptr->counters());
          capture->body += RenderKvRouterMetrics(kv_router_ptr->counters());
          if (checked_images != nullptr) {
            capture->body += RenderCheckedImagesMetrics(checked_images->stats());
          }
          capture->body += Planner::RenderMetrics(plan_now());
          sink->SendResponse(capture->status, capture->content_type, std::move(capture->body));
          return nullptr;
        }
        return service_ptr->Handle(request, std::move(sink), std::move(poster));
      });
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().ToString()));
    return 1;
  }
  spdlog::info("router for model '{}', max_model_len {}", model_name,
               backend_options.max_model_len);
  std::printf("Sluice router listening on %s://%s:%u grpc %s:%d\n", Scheme(options.http),
              options.http.host.c_str(),
              static_cast<unsigned>((*server)->port()), options.grpc_host.c_str(), grpc_port);
  std::fflush(stdout);

  const int signal_number = WaitForShutdown(signals, auth->get());
  // Drain: readiness fails and new requests get 503 at once; those in flight finish (bounded).
  spdlog::info("received signal {}, draining (up to {} s)", signal_number,
               options.drain_timeout_seconds);
  backend_ptr->StartDrain();
  const absl::Time drain_until = absl::Now() + absl::Seconds(options.drain_timeout_seconds);
  while (backend_ptr->num_in_flight() > 0 && absl::Now() < drain_until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  spdlog::info("{} requests in flight at shutdown", backend_ptr->num_in_flight());
  (*server)->Stop();
  // Cancels the renders running or queued (HTTP and gRPC: those answer CANCELLED).
  service->StopRendering();
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  backend.reset();
  server->reset();
  service.reset();
  spdlog::info("bye");
  return 0;
}

}  // namespace sluice
