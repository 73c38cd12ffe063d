// ModelRuntime: everything `sluice serve` and `sluice generate` load from a model folder —
// the model and its engine (as an InferenceBackend), the tokenizer, and the chat template.
#ifndef SLUICE_SERVICES_SERVE_MODEL_RUNTIME_H_
#define SLUICE_SERVICES_SERVE_MODEL_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>

#include "absl/status/statusor.h"
#include "engine/parallel/cpu_parallel_model.h"
#include "engine/sched/llm_engine.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/api/local_backend.h"
#include "services/serve/speculative_setup.h"

namespace sluice {

// RuntimeOptions are the engine-facing command-line flags.
struct RuntimeOptions {
  std::string model_dir;
  std::string served_model_name;  // empty: the model folder's name
  EngineOptions engine;
  // Backend (vLLM's --device): "cpu", the float32 CPU engine (engine/model), or "cuda", the bf16
  // CUDA runner (engine/cuda/cuda_model.h) on GPU 0, driven by the same LLMEngine; its KV cache
  // lives in device memory (no host KV cache is allocated).
  std::string device = "cpu";
  // vLLM's --load-format: "auto" reads the folder's safetensors; "dummy" builds deterministic
  // random weights from config.json alone (engine/model/dummy_weights.h: LoadDummyModel on the
  // CPU, CreateDummyCudaRunner on the GPU — the same values, bf16-rounded there).
  std::string load_format = "auto";
  // --device cuda without engine.num_kv_blocks (--num-kv-blocks): the fraction of the GPU's total
  // memory this process may hold in all (vLLM's --gpu-memory-utilization); what the weights and
  // other processes hold, and a fixed reserve for activations and graphs, are subtracted, the rest
  // becomes KV blocks (see CudaKvBlocks in model_runtime.cc).
  double gpu_memory_utilization = 0.9;
  // --device cuda: the GEMM tuning table (cuda_runner::CudaRunnerOptions::gemm_tuning: "auto"
  // finds configs/gemm_tuning/<GPU name>.json; a file or directory; "" none) and where to
  // write the process's table after start-up ("" nowhere).
  std::string gemm_tuning = "auto";
  std::string gemm_tuning_save;
  // --device cuda (vLLM's --enforce-eager): run every step eagerly, capturing no CUDA graphs,
  // for the target and a GPU draft model alike. Start-up is shorter; decode steps pay the
  // kernels' launch costs.
  bool enforce_eager = false;
  // "host:port[,host:port...]": kvstore shards to load prompt KV from and write it through to
  // (services/kvstore/kvstore_connector.h); empty: none.
  std::string kvstore;
  // Credentials of the channels to the kvstore shards (mTLS); nullptr: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> kvstore_credentials;
  // Ranks of one model replica (engine/parallel/README.md; vLLM's flag names). On the CPU backend
  // the ranks are threads of this process (LoadCpuParallelModel). Both > 1: the same N ranks
  // split attention/dense MLPs (TP) and hold disjoint routed experts (EP), so they must be equal.
  int32_t tensor_parallel_size = 1;
  int32_t expert_parallel_size = 1;
  // EPLB (expert-parallel only): every `eplb_step_interval` engine steps, the routed load measured
  // since the last rebalance is re-placed over the ranks (PlanRebalance) with
  // `num_redundant_experts` extra replicas, between steps (sequences in flight keep their KV).
  bool enable_eplb = false;
  int32_t eplb_step_interval = 256;
  int32_t num_redundant_experts = 0;
  // True for `sluice prefill` / `sluice decode`: KV blocks move between processes, and they carry
  // only the engine's cache (rank 0's), so TP must keep the KV replicated (MLA), not split by head.
  bool kv_crosses_processes = false;
  // Speculative decoding (services/serve/speculative_setup.h); off unless a method or a draft
  // model is given. With --device cuda: draft model (run on the CPU) and n-gram lookup, not MTP.
  SpeculativeFlags speculative;
};

// ParallelLayout is a checked TP/EP layout: what LoadModelRuntime will build.
struct ParallelLayout {
  CpuParallelOptions cpu;    // world_size 1: the unsharded model (LoadModel)
  std::string description;  // one line for the start-up log
};

// CheckParallelLayout validates the TP/EP/EPLB options against `<model_dir>/config.json` with the
// engine's own sharding rules (engine/parallel/sharding.h, eplb.h) before any weight is loaded.
// It first checks the backend flags (CheckDeviceOptions).
// Errors: InvalidArgument naming the flag and the constraint (sizes < 1; TP and EP both > 1 but
// different; TP not dividing num_attention_heads / intermediate_size, or KV heads that neither
// divide nor are divided by TP; TP splitting KV heads (Llama/Qwen3) when KV leaves the process
// (--kvstore, kv_crosses_processes); EP on a model without MoE layers or not dividing n_routed_experts
// + num_redundant_experts; EPLB without EP); those of ModelConfig::Load.
absl::StatusOr<ParallelLayout> CheckParallelLayout(const RuntimeOptions& options);

// CheckDeviceOptions validates --device / --load-format / --gpu-memory-utilization without
// touching the GPU or the model folder. Errors (InvalidArgument, messages start with the flag):
// an unknown device or load format; a utilization outside (0, 1]; --device cuda in a build
// without the CUDA backend ("this build has no CUDA backend (rebuild with -DSLUICE_CUDA=ON)"),
// or with what the CUDA backend does not support yet: TP/EP > 1; prefill/decode KV transfer
// (kv_crosses_processes) in a build whose UCX is not CUDA-aware.
absl::Status CheckDeviceOptions(const RuntimeOptions& options);

struct ModelRuntime {
  std::string served_model_name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;  // null when the model has none
  std::unique_ptr<LocalBackend> backend;        // owns the AsyncEngine (and the model)
  std::shared_ptr<KvConnector> kv_connector;    // --kvstore (also held by the engine), or null
};

// LoadModelRuntime loads `<model_dir>`: config + weights (LoadModel, LoadDummyModel for
// --load-format dummy, LoadCpuParallelModel for TP/EP > 1, after CheckParallelLayout; with
// --device cuda cuda_runner::LoadCudaModel), tokenizer.json, the chat template (optional), and
// starts the engine thread. Errors: those of CheckParallelLayout, the loaders,
// Tokenizer::FromFile, ChatTemplate (other than NotFound) and LLMEngine::Create; with --device
// cuda FailedPrecondition when no GPU is visible and ResourceExhausted when the memory left
// for KV blocks cannot hold one max_model_len sequence.
absl::StatusOr<ModelRuntime> LoadModelRuntime(const RuntimeOptions& options);

// ModelNameFromDir returns the last path component of `dir` ("a/b/model/" → "model").
std::string ModelNameFromDir(const std::string& dir);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_MODEL_RUNTIME_H_
