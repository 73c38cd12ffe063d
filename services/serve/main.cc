// `sluice`: command-line entry point.
//
//   sluice serve --model DIR [--host 127.0.0.1] [--port 8000] [--served-model-name NAME] ...
//   sluice generate --model DIR --input prompts.jsonl --output out.jsonl
//   (serve/generate/prefill/decode: [--tensor-parallel-size N] [--expert-parallel-size N]
//    [--enable-eplb [--eplb-step-interval K] [--num-redundant-experts R]]
//    [--device cpu|cuda] [--gpu-memory-utilization F] [--load-format auto|dummy]
//    [--gemm-tuning PATH] [--gemm-tuning-save PATH] [--batch-invariant])
//   sluice router --model DIR [--port 8000] [--grpc-port 7000] [--min-remote-prefill-tokens N]
//   sluice eval ppl FILE [--url http://127.0.0.1:8000] [--model NAME] [--concurrency 4]
//                   [--tokenizer MODEL_DIR [--max-length N] [--stride S]]
//   sluice kvstore [--port 7300] [--dram-bytes 1G] [--ssd-dir DIR] [--ssd-bytes 16G] [--ttl-hours 72]
//   sluice --version | sluice version | sluice SUBCOMMAND --version   (version and git commit)
//   A usage error (unknown argument, bad value, missing option) exits 2: usage_error.h.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/spec/speculative.h"
#include "engine/kv/swa_replay.h"
#include "services/serve/build_info.h"
#include "services/common/crash_handler.h"
#include "services/serve/encoder_command.h"
#include "services/serve/eval_command.h"
#include "services/serve/api_auth_flags.h"
#include "services/serve/render_flags.h"
#include "services/serve/server_limits.h"
#include "services/serve/tls_flags.h"
#include "services/serve/usage_error.h"
#include "services/serve/version_flag.h"
#include "services/serve/generate_command.h"
#include "services/serve/kvstore_command.h"
#include "services/serve/log.h"
#include "services/serve/router_command.h"
#include "services/serve/scheduling_flags.h"
#include "services/serve/serve_command.h"
#include "services/serve/speculative_setup.h"
#include "services/serve/worker_command.h"

namespace {

// AddEngineFlags registers the flags shared by `serve`, `generate`, `prefill` and `decode`.
void AddEngineFlags(CLI::App& app, sluice::RuntimeOptions& runtime, double& kv_cache_gib) {
  app.add_option("--model", runtime.model_dir, "Hugging Face model folder")->required();
  app.add_option("--served-model-name", runtime.served_model_name,
                 "Model id clients use (default: the model folder's name)");
  app.add_option("--max-num-seqs", runtime.engine.max_num_seqs, "Running sequences per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-num-batched-tokens", runtime.engine.max_num_batched_tokens,
                 "Token budget per engine step")
      ->check(CLI::PositiveNumber);
  auto* gib = app.add_option("--kv-cache-memory-gib", kv_cache_gib,
                             "KV cache memory budget in GiB")
                  ->check(CLI::PositiveNumber);
  app.add_option("--num-kv-blocks,--num-gpu-blocks-override", runtime.engine.num_kv_blocks,
                 "KV cache blocks (overrides --kv-cache-memory-gib / --gpu-memory-utilization)")
      ->check(CLI::PositiveNumber)
      ->excludes(gib);
  app.add_option("--device", runtime.device,
                 "Backend: cpu (float32 CPU engine) or cuda (bf16 CUDA runner on GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--load-format", runtime.load_format,
                 "auto: the folder's safetensors; dummy: random weights from config.json alone")
      ->check(CLI::IsMember({"auto", "dummy"}));
  app.add_option("--gpu-memory-utilization", runtime.gpu_memory_utilization,
                 "--device cuda: fraction of GPU memory for weights, activations and KV blocks")
      ->check(CLI::Range(0.0, 1.0))
      ->excludes(gib);
  app.add_option("--gemm-tuning", runtime.gemm_tuning,
                 "--device cuda: GEMM tuning table, a file or a directory of <GPU name>.json "
                 "(auto: configs/gemm_tuning; empty: time every decode GEMM shape at start-up)");
  app.add_option("--gemm-tuning-save", runtime.gemm_tuning_save,
                 "--device cuda: write the start-up's GEMM tuning table here (file or directory)");
  app.add_flag("--enforce-eager", runtime.enforce_eager,
               "--device cuda: capture no CUDA graphs; every step (decode, speculative verify, "
               "draft rounds) runs eagerly");
  app.add_option("--block-size", runtime.engine.block_size, "Tokens per KV block")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-model-len", runtime.engine.max_model_len,
                 "Max prompt + output tokens (default: the model's max_position_embeddings)")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-prefix-caching", runtime.engine.enable_prefix_caching,
               "Compute every prompt in full (no reuse of cached KV blocks)");
  app.add_flag("!--no-grammar-jump-forward", runtime.engine.grammar_jump_forward,
               "Structured output: take a model step for every token, also for those the "
               "grammar forces (default: append forced tokens without a step; same output)");
  app.add_flag("!--no-async-scheduling", runtime.engine.async_scheduling,
               "--device cuda: read each step's sampled tokens after enqueuing the next step "
               "(default) or wait for them before scheduling it");
  app.add_option("--kvstore", runtime.kvstore,
                 "kvstore shards host:port[,host:port...]: load prompt KV blocks from them and "
                 "write new ones through (needs prefix caching)");
  runtime.engine.swa_replay_tokens = sluice::kDefaultSwaReplayTokens;
  app.add_option("--swa-replay-tokens", runtime.engine.swa_replay_tokens,
                 "Models with sliding-window layers: KV transfers move only full-attention "
                 "layers and the receiver replays the last N prompt tokens to rebuild the "
                 "sliding layers (0: move every layer; same on every worker)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--speculative-model", runtime.speculative.model,
                 "Draft model folder for speculative decoding (same vocabulary and tokenizer as "
                 "--model); it runs where the target runs (--device)");
  app.add_option("--speculative-method", runtime.speculative.method,
                 "Speculative decoding drafter: draft_model (needs --speculative-model), ngram "
                 "(prompt lookup) or mtp (the target's own MTP module; DeepSeek-V3)")
      ->check(CLI::IsMember({"draft_model", "ngram", "mtp"}));
  app.add_option("--num-speculative-tokens", runtime.speculative.num_speculative_tokens,
                 "Draft tokens per step: the fixed k, or the most --speculative-verify auto "
                 "verifies (1..16, default 5)")
      ->check(CLI::Range(1, sluice::kMaxSpeculativeTokens));
  app.add_option("--speculative-verify", runtime.speculative.verify,
                 "auto (default): verify per sequence the draft prefix whose expected gain "
                 "beats its cost (confidence-scheduled); a number k: always draft and verify k "
                 "tokens")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "auto") return "";
            int32_t k = 0;
            if (absl::SimpleAtoi(value, &k) && k >= 1 && k <= sluice::kMaxSpeculativeTokens) {
              return "";
            }
            return absl::StrCat("invalid value '", value, "' (expected auto or an integer in [1, ",
                                sluice::kMaxSpeculativeTokens, "])");
          },
          "auto|K", "speculative verify"));
  app.add_option("--speculative-draft-vocab", runtime.speculative.draft_vocab,
                 "--speculative-model: draft only over the N most frequent tokens (FR-Spec: an "
                 "LM head of N rows; counted over the served tokens, lowest ids until then). "
                 "0: the whole vocabulary")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prompt-lookup-min", runtime.speculative.prompt_lookup_min,
                 "--speculative-method ngram: shortest suffix matched in the sequence "
                 "(default 2)")
      ->check(CLI::PositiveNumber);
  app.add_option("--prompt-lookup-max", runtime.speculative.prompt_lookup_max,
                 "--speculative-method ngram: longest suffix matched in the sequence "
                 "(default 4)")
      ->check(CLI::PositiveNumber);
  sluice::AddSchedulingFlags(app, runtime.engine);
  app.add_flag("--batch-invariant", runtime.engine.batch_invariant,
               "Bitwise-reproducible logits: a request gets the same logits, logprobs and "
               "tokens whatever it is batched with, however its prompt is chunked, and whether "
               "its prefix came from the cache or a KV transfer (CPU backend; implies "
               "--swa-replay-tokens 0 unless given)");
  app.add_option("--tensor-parallel-size", runtime.tensor_parallel_size,
                 "Ranks splitting attention heads and dense MLPs (CPU: threads of this process)");
  auto* ep = app.add_option("--expert-parallel-size", runtime.expert_parallel_size,
                            "Ranks holding disjoint routed experts of MoE layers (equal to "
                            "--tensor-parallel-size when both exceed 1)");
  auto* eplb = app.add_flag("--enable-eplb", runtime.enable_eplb,
                            "Rebalance experts over the EP ranks from the measured load")
                   ->needs(ep);
  app.add_option("--eplb-step-interval", runtime.eplb_step_interval,
                 "Engine steps between EPLB rebalances")
      ->check(CLI::PositiveNumber)
      ->needs(eplb);
  app.add_option("--num-redundant-experts", runtime.num_redundant_experts,
                 "Extra expert replicas EPLB places on the EP ranks")
      ->check(CLI::NonNegativeNumber)
      ->needs(eplb);
}

}  // namespace

int main(int argc, char** argv) {
  sluice::InstallCrashHandler(argv[0]);
  CLI::App app{"Sluice: an LLM serving engine with an OpenAI-compatible API"};
  app.require_subcommand(1);
  // `--version` (on every subcommand too): ParseCommandLine below.
  CLI::App* version_cmd = app.add_subcommand(
      "version", "Print the version and the git commit of this build");

  sluice::ServeOptions serve;
  double serve_kv_gib = 0.0;
  int port = serve.http.port;
  CLI::App* serve_cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API");
  AddEngineFlags(*serve_cmd, serve.runtime, serve_kv_gib);
  serve_cmd->add_option("--host", serve.http.host, "Address to listen on");
  serve_cmd->add_option("--port", port, "Port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535));
  serve_cmd->add_option("--max-concurrent-requests", serve.max_concurrent_requests,
                        "Generation requests in flight before answering 503")
      ->check(CLI::PositiveNumber);
  serve_cmd->add_flag("!--disable-log-requests", serve.log_requests,
                      "No log line per generation request (default: path, status, id, user, tokens, "
                      "finish reason and latency when it ends)");
  serve_cmd->add_flag("--allow-unknown-fields", serve.allow_unknown_fields,
                      "Accept request fields the API does not know, with a logged warning "
                      "(default: 400 naming the field)");
  serve_cmd->add_option("--tool-call-parser", serve.tool_call_parser,
                        "The model's tool-call syntax (default: found in the chat template)")
      ->check(CLI::IsMember({"hermes", "llama3_json", "deepseek_v3"}));
  serve_cmd->add_option("--io-threads", serve.http.num_io_threads, "HTTP io threads")
      ->check(CLI::PositiveNumber);
  serve_cmd->add_option("--grpc-host", serve.grpc_host, "gRPC API address");
  serve_cmd->add_option("--grpc-port", serve.grpc_port,
                        "Serve the gRPC API (sluice.v1.Inference) on this port (0: any free)")
      ->check(CLI::Range(0, 65535));
  sluice::AddApiAuthFlags(*serve_cmd, serve.auth);
  sluice::AddHttpLimitFlags(*serve_cmd, serve.http);
  sluice::AddTlsFlags(*serve_cmd, serve.http);
  sluice::AddServeCaFlag(*serve_cmd, serve.tls_ca_file);
  sluice::AddMultimodalFlags(*serve_cmd, serve.multimodal);
  serve_cmd->add_option("--vision-device", serve.multimodal.vision_device,
                    "Vision-language models: where the vision tower runs, cpu or cuda "
                    "(default: --device)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sluice::AddRenderFlags(*serve_cmd, serve.render, /*pools=*/true);

  sluice::GenerateOptions generate;
  double generate_kv_gib = 0.0;
  CLI::App* generate_cmd =
      app.add_subcommand("generate", "Offline batch inference over a JSONL file");
  AddEngineFlags(*generate_cmd, generate.runtime, generate_kv_gib);
  generate_cmd->add_option("--input", generate.input_path, "Requests, one JSON per line")
      ->required();
  generate_cmd->add_option("--output", generate.output_path, "Responses, one JSON per line")
      ->required();
  generate_cmd->add_option("--max-in-flight", generate.max_in_flight,
                           "Requests being generated at once")
      ->check(CLI::PositiveNumber);
  generate_cmd->add_flag("!--no-progress", generate.progress, "Hide the progress bar");
  sluice::AddMultimodalFlags(*generate_cmd, generate.multimodal);
  generate_cmd->add_option("--vision-device", generate.multimodal.vision_device,
                    "Vision-language models: where the vision tower runs, cpu or cuda "
                    "(default: --device)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sluice::AddRenderFlags(*generate_cmd, generate.render, /*pools=*/false);

  sluice::RouterOptions router;
  int router_port = router.http.port;
  int router_grpc_port = router.grpc_port;
  CLI::App* router_cmd = app.add_subcommand(
      "router", "OpenAI HTTP API in front of registered prefill/decode workers");
  router_cmd->add_option("--model", router.model_dir, "Model folder (tokenizer, template)")
      ->required();
  router_cmd->add_option("--served-model-name", router.served_model_name, "Model id clients use");
  router_cmd->add_option("--host", router.http.host, "HTTP address to listen on");
  router_cmd->add_option("--port", router_port, "HTTP port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  router_cmd->add_option("--grpc-host", router.grpc_host, "Registry gRPC address");
  router_cmd->add_option("--grpc-port", router_grpc_port,
                         "gRPC port: the Inference API and the worker Registry (0: any)")
      ->check(CLI::Range(0, 65535));
  router_cmd->add_option("--max-model-len", router.max_model_len,
                         "Max prompt + output tokens (default: config.json)")
      ->check(CLI::PositiveNumber);
  router_cmd->add_option("--max-concurrent-requests", router.max_concurrent_requests,
                         "Generation requests in flight before answering 503")
      ->check(CLI::PositiveNumber);
  router_cmd->add_flag("!--disable-log-requests", router.log_requests,
                       "No log line per generation request (default: path, status, id, user, tokens, "
                       "finish reason and latency when it ends)");
  router_cmd->add_flag("--allow-unknown-fields", router.allow_unknown_fields,
                       "Accept request fields the API does not know, with a logged warning "
                       "(default: 400 naming the field)");
  router_cmd->add_option("--tool-call-parser", router.tool_call_parser,
                        "The model's tool-call syntax (default: found in the chat template)")
      ->check(CLI::IsMember({"hermes", "llama3_json", "deepseek_v3"}));
  router_cmd->add_option("--min-remote-prefill-tokens", router.backend.min_remote_prefill_tokens,
                         "Shorter prompts prefill on the decode worker")
      ->check(CLI::NonNegativeNumber);
  router_cmd->add_option("--routing-policy", router.routing_policy,
                         "Worker choice: kv (cached prefix vs load), load, round_robin")
      ->check(CLI::IsMember({"kv", "load", "round_robin"}));
  sluice::AddApiAuthFlags(*router_cmd, router.auth);
  sluice::AddHttpLimitFlags(*router_cmd, router.http);
  sluice::AddTlsFlags(*router_cmd, router.http);
  sluice::AddMultimodalFlags(*router_cmd, router.multimodal, /*with_cache=*/false);
  sluice::AddRouterCaFlag(*router_cmd, router.tls_ca_file);
  sluice::AddRenderFlags(*router_cmd, router.render, /*pools=*/true);
  router_cmd->add_option("--lease-seconds", router.lease_seconds,
                         "Worker lease: workers heartbeat at a third of it; the shortest lease "
                         "a worker gets")
      ->check(CLI::PositiveNumber);
  router_cmd->add_option("--lease-jitter-k", router.lease_jitter_k,
                         "Each worker's lease is mean + K x stddev of its recent heartbeat "
                         "intervals, within [--lease-seconds, --max-lease-seconds]; 0: fixed")
      ->check(CLI::NonNegativeNumber);
  router_cmd->add_option("--max-lease-seconds", router.max_lease_seconds,
                         "The longest lease heartbeat jitter can earn a worker")
      ->check(CLI::PositiveNumber);
  router_cmd->add_option("--suspect-grace-s", router.suspect_grace_seconds,
                         "A worker that missed its lease gets no new work but keeps its "
                         "requests; it is removed after this much more silence (60)")
      ->check(CLI::NonNegativeNumber);
  router_cmd->add_option("--drain-timeout-s", router.drain_timeout_seconds,
                         "SIGTERM: refuse new requests and let those in flight finish within "
                         "this many seconds before exiting (30)")
      ->check(CLI::NonNegativeNumber);
  router_cmd->add_option("--max-migrations", router.backend.max_migrations,
                         "Times one request's decode may move to another decode worker after "
                         "its worker failed mid-stream (3; 0: never)")
      ->check(CLI::NonNegativeNumber);
  router_cmd->add_option("--io-threads", router.http.num_io_threads, "HTTP io threads")
      ->check(CLI::PositiveNumber);
  router_cmd->add_option_function<double>(
      "--decode-queue-timeout-s",
      [&router](double s) { router.backend.decode_queue_timeout = absl::Seconds(s); },
      "Wait this long for a decode worker with free KV blocks before answering 503, "
      "counted from the first time every decode worker was full (120)");
  router_cmd->add_option_function<double>(
      "--kv-pin-timeout-s",
      [&router](double s) { router.backend.prefill_pin_timeout = absl::Seconds(s); },
      "The prefill workers' --kv-pin-timeout-s: how long a first token's KV stays pinned (30)");
  router_cmd->add_option_function<double>(
      "--decode-reserve-timeout-s",
      [&router](double s) { router.backend.decode_reserve_timeout = absl::Seconds(s); },
      "The decode workers' --reserve-timeout-s: a reservation older than this (minus 2 s) when "
      "prefill answers is made again (30)")
      ->check(CLI::PositiveNumber);
  router_cmd->add_option("--slo-ttft", router.planner.slo.ttft_seconds,
                         "Planner: time-to-first-token SLO in seconds (2); GET /v1/planner")
      ->check(CLI::PositiveNumber);
  router_cmd->add_option("--slo-itl", router.planner.slo.itl_seconds,
                         "Planner: inter-token latency SLO in seconds (0.1)")
      ->check(CLI::PositiveNumber);
  router_cmd->add_option("--slo-encode-share", router.planner.slo.encode_share,
                         "Planner, vision-language models: share of --slo-ttft the encoder pool "
                         "may take (0.25); prefill plans with the rest")
      ->check(CLI::Range(0.01, 0.99));
  router_cmd->add_option_function<double>(
      "--planner-window-s",
      [&router](double s) { router.planner.window = absl::Seconds(s); },
      "Planner: the load (arrival rate, lengths, prefix hits) is measured over this window (60)")
      ->check(CLI::PositiveNumber);
  router_cmd->add_option("--planner-min-replicas", router.planner.min_replicas,
                         "Planner: fewest replicas it asks for per pool (1)")
      ->check(CLI::NonNegativeNumber);
  router_cmd->add_option_function<double>(
      "--test-decode-start-delay-ms",
      [&router](double ms) { router.backend.test_decode_start_delay = absl::Milliseconds(ms); },
      "Test only: delay the first Decode call after a remote prefill's first token was sent");

  // `sluice prefill` / `sluice decode`: disaggregated workers (services/prefill/README.md).
  sluice::WorkerOptions worker_options[2];
  double worker_kv_gib[2] = {0.0, 0.0};
  CLI::App* worker_cmds[2];
  const char* worker_names[2] = {"prefill", "decode"};
  for (int i = 0; i < 2; ++i) {
    sluice::WorkerOptions& w = worker_options[i];
    worker_cmds[i] = app.add_subcommand(
        worker_names[i], i == 0 ? "gRPC prefill worker (pins KV for decode workers)"
                                : "gRPC decode worker (pulls KV from prefill workers)");
    CLI::App& cmd = *worker_cmds[i];
    AddEngineFlags(cmd, w.runtime, worker_kv_gib[i]);
    cmd.add_option("--listen", w.listen, "gRPC host:port to listen on (port 0: any)");
    cmd.add_option("--advertise", w.advertise, "Address others reach this worker at");
    cmd.add_option("--router", w.router, "Router registry host:port (empty: no registration)");
    cmd.add_option("--ucx-transports", w.ucx_transports, "UCX transports (UCX_TLS syntax)");
    sluice::AddPeerTlsFlags(cmd, w.tls);
    cmd.add_option("--kv-pin-timeout-s", w.kv_pin_timeout_s,
                   "Prefill: free pinned KV blocks after this many seconds without a Release")
        ->check(CLI::PositiveNumber);
    cmd.add_option("--reserve-timeout-s", w.reserve_timeout_s,
                   "Decode: fail a reservation without KV transfer after this many seconds")
        ->check(CLI::PositiveNumber);
    cmd.add_option("--transfer-timeout-s", w.transfer_timeout_s, "KV transfer deadline")
        ->check(CLI::PositiveNumber);
    cmd.add_option("--http-host", w.http_host, "Host for /metrics and /health (HTTP)");
    cmd.add_option("--http-port", w.http_port, "Port for /metrics and /health (0: any free)")
        ->check(CLI::Range(0, 65535));
    cmd.add_option("--kv-transfer-mode", w.kv_transfer_mode,
                   "pull: decode reads the KV; push: prefill writes it after the prefill; "
                   "layerwise: prefill writes each layer as it is computed (same on every "
                   "worker)")
        ->check(CLI::IsMember({"pull", "push", "layerwise"}));
    cmd.add_option("--encoder-cache-bytes", w.encoder_cache_bytes,
                   "Vision-language models: cache of the image embeddings this worker encodes "
                   "itself when no encoder worker could, bytes, LRU (default 64 MiB; 0: off)")
        ->check(CLI::NonNegativeNumber);
    cmd.add_option("--image-encode-threads", w.image_encode_threads,
                   "Vision-language models: threads encoding those images (off the gRPC and "
                   "engine threads)")
        ->check(CLI::PositiveNumber);
    cmd.add_option("--test-image-encode-delay-ms", w.test_image_encode_delay_ms,
                   "Test only: hold each image encode of this worker this long")
        ->check(CLI::NonNegativeNumber);
    cmd.add_flag("--test-register-without-kv-peer", w.test_register_without_kv_peer,
                 "Test only: register without the KV settings the router checks (as a worker "
                 "from before the check), so a misconfigured worker is admitted");
    cmd.add_option("--drain-timeout-s", w.drain_timeout_s,
                   "SIGTERM: finish requests in flight within this many seconds, then cut the "
                   "rest (the router moves cut decode streams elsewhere) and exit 0")
        ->check(CLI::NonNegativeNumber);
    if (i == 0) {
      cmd.add_option("--layerwise-group-layers", w.layerwise_group_layers,
                     "Layerwise KV transfer: model layers moved per push")
          ->check(CLI::PositiveNumber);
      cmd.add_option("--test-fail-layer-push", w.test_fail_layer_push,
                     "Test only: fail the push of this layer group in layerwise mode (-1: none)");
    }
    cmd.add_option("--kv-staging", w.kv_staging,
                   i == 0 ? "Push the KV through pinned host staging slots instead of registering "
                            "the KV cache with UCX: auto (when UCX cannot register the device "
                            "KV), on, off; push and layerwise modes"
                          : "Pull the KV through pinned host staging slots instead of registering "
                            "the KV cache with UCX: auto (when UCX cannot register the device "
                            "KV), on, off; pull mode")
        ->check(CLI::IsMember({"auto", "on", "off"}));
    cmd.add_option("--kv-staging-slot-bytes", w.kv_staging_slot_bytes,
                   "KV staging: bytes of each of the 2 staging slots (>= one block of a "
                   "layer's K or V)")
        ->check(CLI::PositiveNumber);
    // Range checked at start-up (worker_command.cc), with a message naming the limit.
    cmd.add_option("--kv-staging-transfers", w.kv_staging_transfers,
                   absl::StrCat("KV staging: ", i == 0 ? "pushes" : "pulls",
                                " staged at once, each through its own 2 slots (2 x "
                                "--kv-staging-slot-bytes of pinned memory each); 1..",
                                sluice::kMaxKvStagingTransfers));
    if (i == 1) {
      cmd.add_option("--test-transfer-delay-ms", w.test_transfer_delay_ms,
                     "Test only: hold every KV transfer this long before it starts")
          ->check(CLI::NonNegativeNumber);
      cmd.add_option("--test-post-transfer-delay-ms", w.test_post_transfer_delay_ms,
                     "Test only: hold every KV transfer's completion this long after it "
                     "returned (before the first decode step)")
          ->check(CLI::NonNegativeNumber);
      cmd.add_option("--test-reserve-answer-delay-ms", w.test_reserve_answer_delay_ms,
                     "Test only: hold every Reserve's answer this long after its reservation "
                     "token was issued")
          ->check(CLI::NonNegativeNumber);
    }
  }

  sluice::KvStoreOptions kvstore_options;
  CLI::App* kvstore_cmd = sluice::AddKvStoreCommand(app, kvstore_options);
  sluice::EvalOptions eval_options;
  CLI::App* eval_ppl_cmd = sluice::AddEvalCommand(app, eval_options);

  sluice::EncoderOptions encoder_options;
  CLI::App* encoder_cmd = app.add_subcommand(
      "encoder", "Vision encoder service: images to embeddings over gRPC, cached");
  encoder_cmd->add_option("--model", encoder_options.model_dir,
                          "LlavaForConditionalGeneration folder")
      ->required();
  encoder_cmd->add_option("--listen", encoder_options.listen, "gRPC address (port 0: any)");
  encoder_cmd->add_option("--http-host", encoder_options.http_host, "/metrics and /health host");
  encoder_cmd->add_option("--http-port", encoder_options.http_port,
                          "/metrics and /health port (0: any)");
  encoder_cmd->add_option("--max-images-per-call", encoder_options.max_images_per_call,
                          "Images per Encode call at most")
      ->check(CLI::PositiveNumber);
  encoder_cmd->add_option("--router", encoder_options.router,
                          "Router registry host:port to register with (empty: none)");
  encoder_cmd->add_option("--advertise", encoder_options.advertise,
                          "Address the router reaches this encoder at (default: --listen)");
  encoder_cmd->add_option("--drain-timeout-s", encoder_options.drain_timeout_s,
                          "SIGTERM: finish Encode calls in flight within this many seconds")
      ->check(CLI::NonNegativeNumber);
  encoder_cmd->add_option("--test-encode-delay-ms", encoder_options.test_encode_delay_ms,
                          "Test only: hold every Encode call this long before it starts")
      ->check(CLI::NonNegativeNumber);
  encoder_cmd->add_flag("--no-ucx", encoder_options.no_ucx,
                        "No UCX: every embedding answered inline in gRPC");
  encoder_cmd->add_option("--ucx-transports", encoder_options.ucx_transports,
                          "UCX transports (UCX_TLS syntax; default: UCX's choice)");
  encoder_cmd->add_option("--embedding-staging-bytes", encoder_options.embedding_staging_bytes,
                          "Registered arena holding embeddings until workers read them "
                          "(default 256 MiB; full: inline)");
  encoder_cmd->add_option("--embedding-inline-max-bytes",
                          encoder_options.embedding_inline_max_bytes,
                          "Embeddings of at most this many bytes ride the gRPC answer "
                          "(default 65536; larger ones are read over UCX)");
  encoder_cmd->add_option("--embedding-lease-ms", encoder_options.embedding_lease_ms,
                          "Staged embeddings no worker released are freed after this long "
                          "(default 30000)");
  sluice::AddMultimodalFlags(*encoder_cmd, encoder_options.multimodal);
  encoder_options.multimodal.vision_device = "cpu";
  encoder_cmd->add_option("--device", encoder_options.multimodal.vision_device,
                          "Where the vision tower and projector run: cpu (float32) or cuda "
                          "(bf16, GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  encoder_cmd->add_option("--load-format", encoder_options.load_format,
                          "auto: the folder's safetensors; dummy: random weights from "
                          "config.json alone (--device cuda)")
      ->check(CLI::IsMember({"auto", "dummy"}));
  sluice::AddPeerTlsFlags(*encoder_cmd, encoder_options.tls);

  if (std::optional<int> exit_code =
          sluice::ParseCommandLine(app, argc, argv, sluice::SluiceVersionLine())) {
    return *exit_code;
  }
  if (version_cmd->parsed()) {
    std::printf("%s\n", sluice::SluiceVersionLine().c_str());
    return 0;
  }
  sluice::InitLogging();
  sluice::RaiseOpenFileLimit();

  // A TP/EP layout the model cannot take is a usage error (exit 2), found before any weight loads.
  const std::pair<CLI::App*, sluice::RuntimeOptions*> engine_cmds[] = {
      {serve_cmd, &serve.runtime},
      {generate_cmd, &generate.runtime},
      {worker_cmds[0], &worker_options[0].runtime},
      {worker_cmds[1], &worker_options[1].runtime}};
  for (sluice::WorkerOptions& w : worker_options) w.runtime.kv_crosses_processes = true;
  for (const auto& [cmd, runtime] : engine_cmds) {
    if (!cmd->parsed()) continue;
    // Bounded SWA replay rebuilds sliding-window K/V approximately: batch-invariant mode moves
    // every layer instead unless a replay length was asked for (then the engine checks it).
    if (runtime->engine.batch_invariant && cmd->count("--swa-replay-tokens") == 0) {
      runtime->engine.swa_replay_tokens = 0;
    }
    if (auto layout = sluice::CheckParallelLayout(*runtime); !layout.ok()) {
      spdlog::error("{}", layout.status().ToString());
      return sluice::kUsageErrorExitCode;
    }
    sluice::SpeculativeFlagsGiven given;
    given.model = cmd->count("--speculative-model") > 0;
    given.num_speculative_tokens = cmd->count("--num-speculative-tokens") > 0;
    given.verify = cmd->count("--speculative-verify") > 0;
    given.draft_vocab = cmd->count("--speculative-draft-vocab") > 0;
    given.prompt_lookup =
        cmd->count("--prompt-lookup-min") > 0 || cmd->count("--prompt-lookup-max") > 0;
    if (absl::Status s = sluice::CheckSpeculativeFlags(runtime->speculative, given); !s.ok()) {
      std::fprintf(stderr, "sluice: error: %s\nRun 'sluice %s --help' for usage.\n",
                   std::string(s.message()).c_str(), cmd->get_name().c_str());
      return sluice::kUsageErrorExitCode;
    }
  }

  if (kvstore_cmd->parsed()) return sluice::RunKvStore(kvstore_options);
  if (encoder_cmd->parsed()) return sluice::RunEncoder(encoder_options);
  if (eval_ppl_cmd->parsed()) return sluice::RunEvalPerplexity(eval_options);
  if (router_cmd->parsed()) {
    router.http.port = static_cast<uint16_t>(router_port);
    router.grpc_port = static_cast<uint16_t>(router_grpc_port);
    return sluice::RunRouter(router);
  }
  auto gib_to_bytes = [](double gib) { return static_cast<int64_t>(gib * (1ull << 30)); };
  for (int i = 0; i < 2; ++i) {
    if (!worker_cmds[i]->parsed()) continue;
    if (worker_kv_gib[i] > 0) {
      worker_options[i].runtime.engine.kv_cache_bytes = gib_to_bytes(worker_kv_gib[i]);
    }
    return i == 0 ? sluice::RunPrefillWorker(worker_options[i])
                  : sluice::RunDecodeWorker(worker_options[i]);
  }
  if (serve_cmd->parsed()) {
    if (serve_kv_gib > 0) serve.runtime.engine.kv_cache_bytes = gib_to_bytes(serve_kv_gib);
    serve.http.port = static_cast<uint16_t>(port);
    return sluice::RunServe(serve);
  }
  if (generate_kv_gib > 0) generate.runtime.engine.kv_cache_bytes = gib_to_bytes(generate_kv_gib);
  return sluice::RunGenerate(generate);
}
