// embedding_handoff_bench: one image's projected embeddings from `sluice encoder` to the worker
// that needs them (issue 26), by the two paths the worker has: an RMA read of the encoder's
// registered staging slot plus the ReleaseEmbeddings ack (services/common/embedding_fetch.h),
// versus the same bytes inline in a gRPC answer (ReleaseEmbeddings with return_values — the
// path of every embedding before the staged hand-off, and the fallback now). Both sides run in
// this process on loopback, each with its own UCX agent, like an encoder and a worker on one
// host.
//
//   embedding_handoff_bench [--tokens 576] [--hidden 4096] [--iters 30] [--transports TLS]
//
// Default shape: LLaVA-1.5-7B (576 image tokens x 4096 floats: 9 MiB). Each round stages the
// embeddings (a memcpy into the arena, not timed) and times one fetch per path; the bytes are
// checked equal. Prints JSON: {"bytes", "iters", "rma_ms_median", "inline_ms_median",
// "inline_over_rma"}.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/common/embedding_fetch.h"
#include "services/encoder/embedding_staging.h"
#include "services/encoder/encoder_service.h"
#include "transfer/kv_transfer.h"

int main(int argc, char** argv) {
  CLI::App app{"Embedding hand-off: RMA from the staging arena vs inline gRPC"};
  int64_t tokens = 576, hidden = 4096;
  int iters = 30;
  std::string transports;
  app.add_option("--tokens", tokens, "image tokens")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "floats per token")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed rounds")->check(CLI::PositiveNumber);
  app.add_option("--transports", transports, "UCX transports (UCX_TLS syntax)");
  CLI11_PARSE(app, argc, argv);
  using namespace sluice;

  transfer::KvTransferOptions ucx;
  ucx.transports = transports;
  auto encoder_agent = transfer::KvTransferAgent::Create(ucx);
  auto worker_agent = transfer::KvTransferAgent::Create(ucx);
  if (!encoder_agent.ok() || !worker_agent.ok()) {
    std::cerr << "UCX: " << encoder_agent.status() << " " << worker_agent.status() << "\n";
    return 1;
  }
  const int64_t floats = tokens * hidden;
  const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
  EmbeddingStagingOptions staging_options;
  staging_options.arena_bytes = 2 * bytes;
  auto staging = EmbeddingStaging::Create(encoder_agent->get(), staging_options);
  if (!staging.ok()) {
    std::cerr << staging.status() << "\n";
    return 1;
  }
  // Only ReleaseEmbeddings is called: the service needs no vision tower here.
  EncoderServiceOptions service_options;
  service_options.staging = staging->get();
  EncoderService service(nullptr, nullptr, service_options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();

  EmbeddingFetchOptions rma_options;
  rma_options.agent = worker_agent->get();
  rma_options.buffer_bytes = 2 * bytes;
  auto rma = EmbeddingFetcher::Create(rma_options);
  auto inline_fetch = EmbeddingFetcher::Create({});
  if (!rma.ok() || !inline_fetch.ok()) {
    std::cerr << rma.status() << " " << inline_fetch.status() << "\n";
    return 1;
  }

  std::vector<float> values(static_cast<size_t>(floats));
  for (int64_t i = 0; i < floats; ++i) values[i] = static_cast<float>(i % 9973) * 0.001f;
  const absl::Span<const uint8_t> payload(reinterpret_cast<const uint8_t*>(values.data()),
                                          static_cast<size_t>(bytes));
  using Clock = std::chrono::steady_clock;
  std::vector<double> rma_ms, inline_ms;
  for (int round = -2; round < iters; ++round) {  // two warm-up rounds
    for (EmbeddingFetcher* fetcher : {rma->get(), inline_fetch->get()}) {
      absl::StatusOr<v1::EmbeddingRef> ref = (*staging)->Stage(payload, absl::Now());
      if (!ref.ok()) {
        std::cerr << ref.status() << "\n";
        return 1;
      }
      ref->set_encoder_address(absl::StrCat("127.0.0.1:", port));
      const auto start = Clock::now();
      auto got = fetcher->Fetch(*ref, floats);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (!got.ok() || std::memcmp((*got)->data(), values.data(), bytes) != 0) {
        std::cerr << "fetch failed: " << got.status() << "\n";
        return 1;
      }
      if (round >= 0) (fetcher == rma->get() ? rma_ms : inline_ms).push_back(ms);
    }
  }
  if ((*rma)->stats().rma_bytes == 0 || (*rma)->stats().num_rma_failures > 0) {
    std::cerr << "the RMA path fell back to inline\n";
    return 1;
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  nlohmann::json out = {{"bytes", bytes},
                        {"iters", iters},
                        {"rma_ms_median", median(rma_ms)},
                        {"inline_ms_median", median(inline_ms)},
                        {"inline_over_rma", median(inline_ms) / median(rma_ms)}};
  std::cout << out.dump() << std::endl;
  server->Shutdown(std::chrono::system_clock::now());
  return 0;
}
