#include "services/serve/model_runtime.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/parallel/eplb.h"
#include "engine/parallel/sharding.h"
#include "engine/sched/async_engine.h"
#include "services/common/recompute_log.h"
#include "services/kvstore/kvstore_connector.h"
#include "services/serve/log.h"
#include "transfer/kv_transfer.h"

#if defined(SLUICE_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "engine/cuda/cuda_model.h"
#endif

namespace sluice {

namespace {

#if defined(SLUICE_HAVE_CUDA)
// Device memory kept out of the KV budget for what the runner allocates after the KV cache:
// the decode graphs and their attention workspace, the eager prefill workspace (grown on
// demand), the logits and cuBLASLt's workspace. vLLM measures this with a profiling run; a
// fixed margin is enough for the models we run (their activations are a few hundred MiB).
constexpr int64_t kCudaActivationReserveBytes = 2LL << 30;

// CudaKvBlocks picks the KV block count for a loaded CUDA model (vLLM's rule): the process may
// hold `utilization` x total device memory; from that, subtract what is in use now (the weights,
// the CUDA context, other processes) and the activation reserve; the rest, divided by the bytes
// of one block (the runners keep KV in bf16: 2 bytes per KvCacheSpec float), is the count. It is
// capped at twice what max_num_seqs sequences of max_model_len tokens can use at once (more only
// lengthens the prefix cache's memory, and every block costs host bookkeeping).
// Errors: Internal for a CUDA failure; ResourceExhausted when one sequence does not fit.
absl::StatusOr<int64_t> CudaKvBlocks(const Model& model, const EngineOptions& engine,
                                     int32_t max_model_len, double utilization) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemGetInfo: ", cudaGetErrorString(e)));
  }
  const int64_t used = static_cast<int64_t>(total_bytes - free_bytes);
  const int64_t budget = static_cast<int64_t>(utilization * static_cast<double>(total_bytes)) -
                         used - kCudaActivationReserveBytes;
  const int64_t block_bytes = model.kv_cache_spec().BytesPerToken() / 2 * engine.block_size;
  const int64_t per_seq = (max_model_len + engine.block_size - 1) / engine.block_size;
  const int64_t blocks = block_bytes > 0 ? std::max<int64_t>(budget, 0) / block_bytes : 0;
  if (blocks < per_seq) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--device cuda: ", std::max<int64_t>(budget, 0) >> 20, " MiB left for the KV cache (",
        total_bytes >> 20, " MiB x --gpu-memory-utilization ", utilization, " - ", used >> 20,
        " MiB in use - ", kCudaActivationReserveBytes >> 20, " MiB reserve) hold ", blocks,
        " blocks; one sequence of max_model_len ", max_model_len, " needs ", per_seq,
        " (raise --gpu-memory-utilization, or lower --max-model-len)"));
  }
  return std::min<int64_t>(blocks, 2 * int64_t{engine.max_num_seqs} * per_seq);
}
#endif

// LoadCudaBackend loads `options.model_dir` on GPU 0 and sets `engine` for it: no host KV
// cache, num_kv_blocks from --num-kv-blocks or CudaKvBlocks. The runner's limits are the
// engine's (block size, max_model_len, tokens and sequences per step), so every plan the
// scheduler makes fits the captured graphs.
absl::StatusOr<std::unique_ptr<Model>> LoadCudaBackend(const RuntimeOptions& options,
                                                       EngineOptions& engine) {
#if defined(SLUICE_HAVE_CUDA)
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(options.model_dir);
  if (!config.ok()) return config.status();
  // LlavaForConditionalGeneration: CudaLlamaRunner loads the nested language model and takes
  // the image features as input embeddings (its vision tower is the in-process encoder's,
  // services/serve/vision_device.h).
  int num_devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&num_devices); e != cudaSuccess || num_devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device cuda: no CUDA GPU is visible (",
        e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices", ")"));
  }
  const int32_t max_model_len = engine.max_model_len > 0
                                    ? engine.max_model_len
                                    : static_cast<int32_t>(config->max_position_embeddings);
  cuda_runner::CudaRunnerOptions runner;
  runner.block_size = engine.block_size;
  runner.max_model_len = max_model_len;
  runner.max_num_tokens = engine.max_num_batched_tokens;
  runner.max_num_seqs = engine.max_num_seqs;
  // A speculative verify step asks for the logits of every decode sequence's k + 1 positions.
  const int32_t verify_rows = SpeculativeVerifyRows(options.speculative);
  runner.max_num_logits = int64_t{engine.max_num_seqs} * (1 + verify_rows);
  // ... and replays decode graphs of 2..k + 1 query tokens per sequence (each sequence padded
  // to the step's longest row).
  for (int32_t q = 2; q <= 1 + verify_rows; ++q) runner.graph_query_lens.push_back(q);
  runner.gemm_tuning = options.gemm_tuning;
  runner.gemm_tuning_save = options.gemm_tuning_save;
  runner.use_cuda_graphs = !options.enforce_eager;
  runner.batch_invariant = engine.batch_invariant;
  // A kvstore block copy through pinned staging gets the store's shorter call deadline (the
  // connector's load timeout): past it the save is dropped, the load computed.
  if (!options.kvstore.empty()) {
    runner.kv_block_copy_timeout = AsyncKvConnectorOptions{}.load_timeout;
  }
  absl::StatusOr<std::unique_ptr<Model>> model;
  if (options.load_format == "dummy") {
    absl::StatusOr<std::unique_ptr<cuda_runner::CudaRunner>> dummy =
        cuda_runner::CreateDummyCudaRunner(*config, kDefaultDummySeed, runner);
    if (!dummy.ok()) return dummy.status();
    model = cuda_runner::WrapRunner(*std::move(dummy));
  } else {
    model = cuda_runner::LoadCudaModel(options.model_dir, runner);
  }
  if (!model.ok()) return model.status();
  if (engine.num_kv_blocks <= 0) {
    absl::StatusOr<int64_t> blocks =
        CudaKvBlocks(**model, engine, max_model_len, options.gpu_memory_utilization);
    if (!blocks.ok()) return blocks.status();
    engine.num_kv_blocks = *blocks;
  }
  engine.allocate_host_kv_cache = false;
  return model;
#else
  (void)engine;
  return CheckDeviceOptions(options);  // the no-CUDA-backend error
#endif
}

// CudaDraftModel: a draft model on GPU 0 beside the target, with the target's step limits
// (its forwards hold at most a step's tokens; one logits row per sequence and round) and decode
// graphs for its rounds; its KV gets at most kCudaDraftKvBytes of the activation reserve.
constexpr int64_t kCudaDraftKvBytes = 512LL << 20;
DraftModelOnDevice CudaDraftModel(const RuntimeOptions& options, const EngineOptions& engine,
                                  int64_t max_model_len) {
  DraftModelOnDevice d;
  d.max_tokens_per_forward = engine.max_num_batched_tokens;
  d.kv_bytes = kCudaDraftKvBytes;
#if defined(SLUICE_HAVE_CUDA)
  cuda_runner::CudaRunnerOptions runner;
  runner.block_size = engine.block_size;
  runner.max_model_len = max_model_len;
  runner.max_num_tokens = engine.max_num_batched_tokens;
  runner.max_num_seqs = engine.max_num_seqs;
  runner.gemm_tuning = options.gemm_tuning;
  runner.use_cuda_graphs = !options.enforce_eager;
  d.load = [runner](const std::string& dir) mutable -> absl::StatusOr<std::unique_ptr<Model>> {
    // The drafter never feeds positions past the draft's own max_position_embeddings.
    absl::StatusOr<ModelConfig> config = ModelConfig::Load(dir);
    if (!config.ok()) return config.status();
    runner.max_model_len = std::min<int64_t>(runner.max_model_len, config->max_position_embeddings);
    return cuda_runner::LoadCudaModel(dir, runner);
  };
#else
  d.load = [options](const std::string&) -> absl::StatusOr<std::unique_ptr<Model>> {
    return CheckDeviceOptions(options);
  };
#endif
  return d;
}

// WarmUp runs one 1-token request through `engine`, so what a CUDA model does on its first step
// (allocate the device KV cache, capture and tune the decode graphs: seconds) happens at
// start-up instead of in the first requests' latency and in `sluice generate`'s tokens/s. A
// 1-token prompt fills no block, so nothing enters the prefix cache.
// Errors: the step's (e.g. out of device memory), as the request's final status.
absl::Status WarmUp(LLMEngine& engine) {
  EngineRequest request;
  request.request_id = "sluice-warm-up";
  request.prompt_token_ids = {0};
  request.sampling.max_tokens = 1;
  request.sampling.temperature = 0.0f;
  if (absl::Status s = engine.AddRequest(std::move(request)); !s.ok()) return s;
  for (int step = 0; step < 16 && engine.HasUnfinishedRequests(); ++step) {
    for (const RequestOutput& out : engine.Step()) {
      if (out.finish_reason == FinishReason::kError) return out.status;
    }
  }
  if (engine.HasUnfinishedRequests()) {
    return absl::InternalError("warm-up request did not finish in 16 engine steps");
  }
  return absl::OkStatus();
}

// FlagError prefixes an engine sharding error with the flag that caused it.
absl::Status FlagError(const char* flag, int32_t value, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, ": ", status.message()));
}

// EplbModel drives periodic expert rebalancing for an expert-parallel replica: after every
// `interval` Forward calls it plans a placement for the load routed since the last plan
// (PlanRebalance) and applies it with UpdateExpertPlacement. It runs between steps on the
// engine thread, so no step is in flight and every sequence keeps its KV cache.
class EplbModel : public Model {
 public:
  EplbModel(std::unique_ptr<Model> inner, ExpertPlacement placement, EplbOptions options,
            int32_t interval)
      : inner_(std::move(inner)),
        placement_(std::move(placement)),
        options_(options),
        interval_(interval) {}

  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec kv_cache_spec() const override { return inner_->kv_cache_spec(); }
  int64_t WeightBytesPerToken() const override { return inner_->WeightBytesPerToken(); }
  // Rebalancing moves which rank computes an expert, not the order of any reduction.
  bool IsBatchInvariant() const override { return inner_->IsBatchInvariant(); }
  int64_t max_num_logits() const override { return inner_->max_num_logits(); }
  absl::Status UpdateExpertPlacement(absl::Span<const int32_t> slots) override {
    return inner_->UpdateExpertPlacement(slots);
  }
  std::vector<int64_t> TakeExpertLoad() override { return inner_->TakeExpertLoad(); }
  // The wrapped replica is expert-parallel (EPLB needs EP > 1) and its experts move between
  // ranks: the MTP module drafts on an unsharded model only. A checkpoint without MTP weights
  // still says so first.
  absl::Status MtpStatus() const override {
    const absl::Status inner = inner_->MtpStatus();
    if (absl::IsNotFound(inner)) return inner;
    return absl::FailedPreconditionError(
        "--enable-eplb: the model is split over expert-parallel ranks whose experts EPLB "
        "moves, and the MTP module drafts on an unsharded model only");
  }

  absl::Status Forward(const ForwardInput& input, KvCache& kv_cache,
                       absl::Span<float> logits) override {
    if (absl::Status s = inner_->Forward(input, kv_cache, logits); !s.ok()) return s;
    if (++steps_ < interval_) return absl::OkStatus();
    steps_ = 0;
    const std::vector<int64_t> counts = inner_->TakeExpertLoad();
    const std::vector<double> load(counts.begin(), counts.end());
    absl::StatusOr<RebalancePlan> plan = PlanRebalance(placement_, load, options_);
    // A failed plan (e.g. no tokens routed yet) keeps the current placement: still correct.
    if (!plan.ok() || !plan->changed) return absl::OkStatus();
    if (absl::Status s = inner_->UpdateExpertPlacement(plan->placement.physical_to_logical);
        !s.ok()) {
      return s;
    }
    spdlog::info("EPLB: rebalanced experts (max/mean rank load {:.3f} -> {:.3f}, {} copies)",
                 plan->old_imbalance, plan->new_imbalance, plan->moves.size());
    placement_ = std::move(plan->placement);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Model> inner_;
  ExpertPlacement placement_;
  EplbOptions options_;
  int32_t interval_;
  int32_t steps_ = 0;
};

// CheckTensorParallel applies the engine's head/channel split rules for `tp` ranks.
absl::Status CheckTensorParallel(const ModelConfig& c, int32_t tp) {
  if (c.architecture == Architecture::kDeepseekV3) {
    // MLA: query heads split, the latent KV is replicated (deepseek_v3.cc ShardAttentionAndDense).
    if (auto heads = EvenShard(c.num_attention_heads, 0, tp, "num_attention_heads"); !heads.ok()) {
      return heads.status();
    }
    if (c.first_k_dense_replace == 0) return absl::OkStatus();  // no dense MLP layer
  } else if (auto heads = ShardAttentionHeads(c.num_attention_heads, c.num_key_value_heads, 0, tp);
             !heads.ok()) {
    return heads.status();
  }
  return EvenShard(c.intermediate_size, 0, tp, "intermediate_size").status();
}

}  // namespace

absl::Status CheckDeviceOptions(const RuntimeOptions& options) {
  if (options.load_format != "auto" && options.load_format != "dummy") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--load-format ", options.load_format, ": must be auto or dummy"));
  }
  if (options.device == "cpu") return absl::OkStatus();
  if (options.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", options.device, ": must be cpu or cuda"));
  }
#if !defined(SLUICE_HAVE_CUDA)
  return absl::InvalidArgumentError(
      "--device cuda: this build has no CUDA backend (rebuild with -DSLUICE_CUDA=ON)");
#endif
  if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-memory-utilization ",
                                                   options.gpu_memory_utilization,
                                                   ": must be in (0, 1]"));
  }
  const char* unsupported = nullptr;
  // --batch-invariant: both runners plan fixed-order GEMM, attention, MLA and MoE kernels
  // (CudaRunnerOptions::batch_invariant).
  if (options.tensor_parallel_size > 1 || options.expert_parallel_size > 1) {
    unsupported = "--tensor-parallel-size / --expert-parallel-size > 1";
  }
  // --kvstore is supported: the runner's blocks move device -> pinned host -> kvstore and back
  // (CudaModel::GatherKvBlocks / ScatterKvBlocks, engine/kv/staged_kv_blocks.h).
  if (unsupported != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device cuda does not support ", unsupported, " yet"));
  }
  // sluice prefill / sluice decode register the runner's device KV with UCX: that needs the
  // CUDA-aware UCX (cmake/ucx.cmake); whether it finds a device is checked at registration.
  if (options.kv_crosses_processes && !transfer::LinkedUcxIsCudaAware()) {
    return absl::InvalidArgumentError(
        "--device cuda with prefill/decode KV transfer needs a CUDA-aware UCX, and this build "
        "links the system UCX (built without CUDA): run scripts/install_deps.sh (it installs "
        "libucx-cu13 into .deps/) and rebuild");
  }
  return absl::OkStatus();
}

absl::StatusOr<ParallelLayout> CheckParallelLayout(const RuntimeOptions& options) {
  if (absl::Status s = CheckDeviceOptions(options); !s.ok()) return s;
  const int32_t tp = options.tensor_parallel_size, ep = options.expert_parallel_size;
  if (tp < 1) return FlagError("--tensor-parallel-size", tp, absl::InvalidArgumentError("must be >= 1"));
  if (ep < 1) return FlagError("--expert-parallel-size", ep, absl::InvalidArgumentError("must be >= 1"));
  if (tp > 1 && ep > 1 && tp != ep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel-size ", tp, " and --expert-parallel-size ", ep,
        " differ: when both exceed 1 the same ranks split attention and hold the experts, so "
        "they must be equal"));
  }
  if (options.enable_eplb && ep == 1) {
    return absl::InvalidArgumentError("--enable-eplb needs --expert-parallel-size > 1");
  }
  ParallelLayout layout;
  layout.cpu.world_size = std::max(tp, ep);
  layout.cpu.tensor_parallel = tp > 1;
  layout.cpu.expert_parallel = ep > 1;
  if (layout.cpu.world_size == 1) {
    layout.description = "single rank (no tensor/expert parallelism)";
    return layout;
  }
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(options.model_dir);
  if (!config.ok()) return config.status();
  const ModelConfig& c = *config;
  layout.description = absl::StrCat(layout.cpu.world_size, " ranks as threads of this process");
  if (tp > 1) {
    if (absl::Status s = CheckTensorParallel(c, tp); !s.ok()) {
      return FlagError("--tensor-parallel-size", tp, s);
    }
    if (c.architecture != Architecture::kDeepseekV3 &&
        (options.kv_crosses_processes || !options.kvstore.empty())) {
      return FlagError("--tensor-parallel-size", tp,
                       absl::InvalidArgumentError(absl::StrCat(
                           c.architecture_name, " ranks each cache their own KV heads, which KV "
                           "transfer and the kvstore do not carry yet; use it with sluice serve "
                           "without --kvstore")));
    }
    absl::StrAppend(&layout.description, "; TP=", tp, ": ", c.num_attention_heads / tp, " of ",
                    c.num_attention_heads, " attention heads per rank");
  }
  if (ep > 1) {
    if (c.architecture != Architecture::kDeepseekV3 || c.n_routed_experts == 0 ||
        c.first_k_dense_replace >= c.num_hidden_layers) {
      return FlagError("--expert-parallel-size", ep,
                       absl::InvalidArgumentError(absl::StrCat(
                           "expert parallelism needs MoE layers; ", c.architecture_name,
                           " has none")));
    }
    const int32_t experts = static_cast<int32_t>(c.n_routed_experts);
    const int32_t slots = experts + options.num_redundant_experts;
    if (options.num_redundant_experts < 0 || slots % ep != 0) {
      return FlagError("--expert-parallel-size", ep,
                       absl::InvalidArgumentError(absl::StrCat(
                           "n_routed_experts (", experts, ") + --num-redundant-experts (",
                           options.num_redundant_experts, ") is not divisible by it")));
    }
    absl::StrAppend(&layout.description, "; EP=", ep, ": ", slots / ep, " of ", experts,
                    " routed experts per rank",
                    tp > 1 ? "" : " (attention replicated)");
    if (options.enable_eplb) {
      // Start from the EPLB placement of a uniform load: with redundant slots that spreads the
      // replicas; the measured load re-places them every eplb_step_interval steps.
      const std::vector<double> uniform(static_cast<size_t>(experts), 1.0);
      absl::StatusOr<ExpertPlacement> initial =
          PlanEplb(uniform, EplbOptions{ep, options.num_redundant_experts, 1});
      if (!initial.ok()) return FlagError("--expert-parallel-size", ep, initial.status());
      layout.cpu.expert_slots = initial->physical_to_logical;
      absl::StrAppend(&layout.description, "; EPLB every ", options.eplb_step_interval,
                      " steps, ", options.num_redundant_experts, " redundant experts");
    }
  }
  return layout;
}

std::string ModelNameFromDir(const std::string& dir) {
  std::filesystem::path path(dir);
  while (!path.empty() && path.filename().empty()) path = path.parent_path();
  std::string name = path.filename().string();
  return name.empty() ? dir : name;
}

absl::StatusOr<ModelRuntime> LoadModelRuntime(const RuntimeOptions& options) {
  ModelRuntime runtime;
  runtime.served_model_name = options.served_model_name.empty()
                                  ? ModelNameFromDir(options.model_dir)
                                  : options.served_model_name;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFile(options.model_dir + "/tokenizer.json");
  if (!tokenizer.ok()) return tokenizer.status();
  runtime.tokenizer = *std::move(tokenizer);

  absl::StatusOr<std::unique_ptr<ChatTemplate>> chat_template =
      ChatTemplate::FromModelDir(options.model_dir);
  if (chat_template.ok()) {
    runtime.chat_template = *std::move(chat_template);
  } else if (absl::IsNotFound(chat_template.status())) {
    spdlog::warn("model has no chat template; /v1/chat/completions will answer 400");
  } else {
    return chat_template.status();
  }

  absl::StatusOr<ParallelLayout> layout = CheckParallelLayout(options);
  if (!layout.ok()) return layout.status();
  spdlog::info("loading model from {}; parallel layout: {}", options.model_dir,
               layout->description);
  EngineOptions engine_options = options.engine;
  // Every recompute (preemption, failed sliding-window replay) gets a log line with its cause.
  if (!engine_options.on_recompute) engine_options.on_recompute = LogRecomputeEvent;
  absl::StatusOr<std::unique_ptr<Model>> model;
  if (options.device == "cuda") {
    model = LoadCudaBackend(options, engine_options);
  } else if (options.load_format == "dummy") {
    if (layout->cpu.world_size != 1) {
      return absl::InvalidArgumentError(
          "--load-format dummy needs --tensor-parallel-size 1 and --expert-parallel-size 1");
    }
    model = LoadDummyModel(options.model_dir);
  } else {
    model = layout->cpu.world_size == 1 ? LoadModel(options.model_dir)
                                        : LoadCpuParallelModel(options.model_dir, layout->cpu);
  }
  if (!model.ok()) return model.status();
  if (options.enable_eplb) {
    const int32_t ep = layout->cpu.world_size;
    absl::StatusOr<ExpertPlacement> placement = PlacementFromSlots(
        layout->cpu.expert_slots, static_cast<int32_t>((*model)->config().n_routed_experts), ep);
    if (!placement.ok()) return placement.status();
    model = std::unique_ptr<Model>(new EplbModel(
        *std::move(model), *std::move(placement),
        EplbOptions{ep, options.num_redundant_experts, 1}, options.eplb_step_interval));
  }
  // The served name seeds the block hashes, so every worker of a deployment (and the kvstore)
  // agrees on them while another model never shares an address.
  if (engine_options.model_id.empty()) engine_options.model_id = runtime.served_model_name;
  if (!options.kvstore.empty()) {
    if (!engine_options.enable_prefix_caching) {
      // Blocks are looked up and stored by their prefix-cache hashes.
      return absl::InvalidArgumentError("--kvstore needs prefix caching (drop --no-prefix-caching)");
    }
    absl::StatusOr<std::vector<std::string>> shards = kvstore::ParseKvStoreShards(options.kvstore);
    if (!shards.ok()) return shards.status();
    absl::StatusOr<std::shared_ptr<KvConnector>> connector =
        kvstore::CreateKvStoreConnector(*shards, {}, options.kvstore_credentials);
    if (!connector.ok()) return connector.status();
    engine_options.kv_connector = *std::move(connector);
    runtime.kv_connector = engine_options.kv_connector;
    spdlog::info("kvstore connector: {} shard(s) {}", shards->size(), options.kvstore);
  }
  // On --device cuda the target verifies drafts in multi-token decode graphs
  // (CudaRunnerOptions::graph_query_lens), the draft model runs on the same GPU and MTP is
  // refused by the CUDA model's MtpStatus (engine/spec/README.md).
  std::optional<DraftModelOnDevice> draft_on_device;
  if (options.device == "cuda") {
    draft_on_device = CudaDraftModel(options, engine_options,
                                     engine_options.max_model_len > 0
                                         ? engine_options.max_model_len
                                         : (*model)->config().max_position_embeddings);
  }
  if (absl::Status s = ConfigureSpeculative(
          options.speculative, options.model_dir, (*model)->config().vocab_size,
          *runtime.tokenizer,
          (*model)->kv_cache_spec().BytesPerToken() * engine_options.block_size, model->get(),
          &engine_options, draft_on_device ? &*draft_on_device : nullptr);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<LLMEngine>> engine =
      LLMEngine::Create(*std::move(model), engine_options);
  if (!engine.ok()) return engine.status();
  if (options.device == "cuda") {
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = WarmUp(**engine); !s.ok()) return s;
    spdlog::info("CUDA warm-up (KV cache allocation, decode graph capture) took {:.1f}s",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  // A KV connector keeps async steps: its block copies are ordered on the device (model.h).
  const bool async = engine_options.async_scheduling && (*engine)->model().SupportsAsyncSteps();
  spdlog::info("engine ready on {}: {} KV blocks of {} tokens, max_model_len {}, prefix caching {}, "
               "async scheduling {}, batch invariant {}",
               options.device, (*engine)->num_total_blocks(), (*engine)->block_size(),
               (*engine)->max_model_len(), engine_options.enable_prefix_caching ? "on" : "off",
               async ? "on" : "off", engine_options.batch_invariant ? "on" : "off");
  runtime.backend =
      std::make_unique<LocalBackend>(std::make_unique<AsyncEngine>(*std::move(engine)));
  return runtime;
}

}  // namespace sluice
