#include "services/serve/serve_command.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/api/openai_service.h"
#include "services/router/inference_grpc_service.h"
#include "services/serve/api_auth_flags.h"
#include "services/serve/log.h"
#include "services/serve/server_limits.h"
#include "services/serve/tls_flags.h"

namespace sluice {

int RunServe(const ServeOptions& options) {
  // Block the shutdown signals in every thread (threads inherit the mask), then wait for them
  // on this thread with sigwait: no async-signal-safety concerns.
  const sigset_t signals = BlockServerSignals();
  absl::StatusOr<std::unique_ptr<ApiAuth>> auth = CreateApiAuth(options.auth);
  if (!auth.ok()) {
    spdlog::error("{}", std::string(auth.status().message()));
    return 1;
  }

  // The kvstore shards are reached over mTLS when --tls-ca is given (checked before the model
  // loads, as the workers do).
  absl::StatusOr<PeerTlsOptions> peer_tls =
      PeerTlsFromPublic(options.http, options.tls_ca_file, "this server's");
  if (!peer_tls.ok()) {
    spdlog::error("{}", std::string(peer_tls.status().message()));
    return 1;
  }
  RuntimeOptions runtime_options = options.runtime;
  if (peer_tls->enabled()) {
    runtime_options.kvstore_credentials = PeerChannelCredentials(*peer_tls);
  } else if (!options.runtime.kvstore.empty() && !options.http.tls_cert_file.empty()) {
    spdlog::warn("--kvstore without --tls-ca: the kvstore shards are reached in plaintext");
  }
  absl::StatusOr<ModelRuntime> runtime = LoadModelRuntime(runtime_options);
  if (!runtime.ok()) {
    spdlog::error("cannot load the model: {}", std::string(runtime.status().ToString()));
    return 1;
  }
  absl::StatusOr<std::unique_ptr<MultimodalRuntime>> multimodal =
      LoadMultimodal(options.runtime.model_dir, options.multimodal, *runtime->tokenizer,
                     runtime->chat_template.get(),
                     ResolveVisionPlacement(options.multimodal, options.runtime.device,
                                            options.runtime.load_format));
  if (!multimodal.ok()) {
    spdlog::error("cannot load the image encoder: {}", multimodal.status().ToString());
    return 1;
  }
  OpenAiServiceOptions service_options;
  service_options.served_model_name = runtime->served_model_name;
  if (*multimodal != nullptr) {
    service_options.multimodal = &(*multimodal)->context;
    spdlog::info("vision-language model: {} tokens per image, at most {} images per prompt",
                 (*multimodal)->encoder->tokens_per_image(),
                 (*multimodal)->context.max_images_per_prompt);
  }
  service_options.max_concurrent_requests = options.max_concurrent_requests;
  service_options.allow_unknown_fields = options.allow_unknown_fields;
  service_options.log_requests = options.log_requests;
  if (!options.tool_call_parser.empty()) {
    service_options.tool_call_syntax = *tools::ToolCallSyntaxByName(options.tool_call_parser);
  }
  service_options.auth = auth->get();
  // Chat template renders and tokenization run off the I/O threads (HTTP and gRPC).
  ApplyRenderFlags(options.render, service_options);
  auto service = std::make_unique<OpenAiService>(runtime->backend.get(), runtime->tokenizer.get(),
                                                 runtime->chat_template.get(), service_options);
  OpenAiService* service_ptr = service.get();
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      options.http, [service_ptr](const HttpRequestInfo& request,
                                  std::shared_ptr<ResponseSink> sink, Poster poster) {
        return service_ptr->Handle(request, std::move(sink), std::move(poster));
      });
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().ToString()));
    return 1;
  }
  // The gRPC API shares the HTTP API's validation, backend and metrics.
  std::unique_ptr<InferenceGrpcService> grpc_service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::string grpc_listening;
  if (options.grpc_port >= 0) {
    InferenceGrpcServiceOptions grpc_options;
    grpc_options.served_model_name = runtime->served_model_name;
    grpc_options.max_concurrent_requests = options.max_concurrent_requests;
    grpc_options.auth = auth->get();
    grpc_options.multimodal = service_options.multimodal;
    grpc_options.render_pools = service->render_pools();
    grpc_options.grammar_compiler = [service_ptr] { return service_ptr->grammar_compiler(); };
    grpc_options.tool_call_syntax = service_options.tool_call_syntax;
    grpc_service = std::make_unique<InferenceGrpcService>(
        runtime->backend.get(), runtime->tokenizer.get(), runtime->chat_template.get(),
        &service->metrics(), grpc_options);
    grpc::ServerBuilder builder;
    // gRPC binds with SO_REUSEPORT by default: a second process on a taken port would start
    // and share it. Off, so it fails to bind instead.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    int grpc_port = 0;
    builder.AddListeningPort(absl::StrCat(options.grpc_host, ":", options.grpc_port),
                             GrpcServerCredentials(options.http), &grpc_port);
    builder.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
    builder.RegisterService(grpc_service.get());
    grpc_server = builder.BuildAndStart();
    if (grpc_server == nullptr || grpc_port == 0) {
      spdlog::error("cannot listen for gRPC on {}:{}", options.grpc_host, options.grpc_port);
      return 1;
    }
    grpc_listening = absl::StrCat(" grpc ", options.grpc_host, ":", grpc_port);
  }
  spdlog::info("serving model '{}'", runtime->served_model_name);
  std::printf("Sluice listening on %s://%s:%u%s\n", Scheme(options.http),
              options.http.host.c_str(),
              static_cast<unsigned>((*server)->port()), grpc_listening.c_str());
  std::fflush(stdout);

  const int signal_number = WaitForShutdown(signals, auth->get());
  spdlog::info("received signal {}, shutting down", signal_number);
  // Order matters: stop the io threads, then the engine (its final callbacks post into the
  // stopped io_context, which still exists), then destroy the server and its pending handlers.
  (*server)->Stop();
  // Cancels the renders running or queued (HTTP and gRPC: those answer CANCELLED): a costly
  // render does not hold the exit up.
  service->StopRendering();
  // Cancels the open gRPC calls; their reactors finish once the engine delivered their final
  // (aborted) outputs, which happens while the engine still runs.
  if (grpc_server != nullptr) grpc_server->Shutdown(std::chrono::system_clock::now() +
                                                    std::chrono::seconds(2));
  runtime->backend.reset();
  server->reset();
  spdlog::info("bye");
  return 0;
}

}  // namespace sluice
