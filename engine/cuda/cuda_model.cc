#include "engine/cuda/cuda_model.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_deepseek_runner.h"
#include "engine/cuda/cuda_llama_runner.h"
#include "engine/kv/staged_kv_blocks.h"
#include "transfer/cuda/cuda_device_copier.h"

namespace sluice::cuda_runner {
namespace {

class CudaModel : public Model {
 public:
  explicit CudaModel(std::unique_ptr<CudaRunner> runner) : runner_(std::move(runner)) {}

  const ModelConfig& config() const override { return runner_->config(); }

  KvCacheSpec kv_cache_spec() const override { return runner_->kv_cache_spec(); }

  int64_t WeightBytesPerToken() const override { return runner_->WeightBytesPerStep(); }

  absl::Status Forward(const ForwardInput& input, KvCache& kv_cache,
                       absl::Span<float> logits) override {
    const int64_t vocab = runner_->config().vocab_size;
    if (static_cast<int64_t>(logits.size()) !=
        static_cast<int64_t>(input.logits_indices.size()) * vocab) {
      return absl::InvalidArgumentError(absl::StrCat("logits span has ", logits.size(),
                                                     " floats, expected ",
                                                     input.logits_indices.size(), " x ", vocab));
    }
    if (absl::Status s = RunStep(input, kv_cache); !s.ok()) return s;
    if (input.logits_indices.empty()) return runner_->Synchronize();
    auto out = runner_->Logits();
    if (!out.ok()) return out.status();
    std::copy(out->begin(), out->end(), logits.begin());
    return absl::OkStatus();
  }

  // Speculative decoding verifies drafts through Forward / ForwardGreedy (several query tokens
  // and logits rows per decode sequence; CudaRunnerOptions::max_num_logits), but the runners
  // neither load a DeepSeek MTP module nor expose the final hidden states it reads.
  absl::Status MtpStatus() const override {
    return absl::UnimplementedError(
        "the CUDA backend does not run MTP modules yet (use --device cpu for MTP drafting, or "
        "draft with --speculative-model DIR or --speculative-method ngram)");
  }

  bool SupportsDeviceGreedy() const override { return true; }
  // CudaRunnerOptions::batch_invariant: fixed-order kernels for every step (cuda_runner.h).
  bool IsBatchInvariant() const override { return runner_->options().batch_invariant; }
  // The runners record a CUDA event per layer after its K/V write (RunnerCore::LayerKvWritten).
  bool SupportsLayerKvHook() const override { return true; }
  // CudaLlamaRunner: frozen layers skip their K/V write, sliding layers of bounded sequences run
  // kernels::PagedAttentionBoundedCuda.
  bool SupportsSwaReplay() const override { return runner_->SupportsSwaReplay(); }
  // CudaLlamaRunner: LLaVA's language model takes the image features at their placeholders.
  bool SupportsInputEmbeddings() const override { return runner_->SupportsInputEmbeddings(); }
  // Steps with more logits rows are refused (RunnerCore::Validate); the engine's scheduler
  // sizes its steps to this.
  int64_t max_num_logits() const override { return runner_->max_num_logits(); }
  double kernel_setup_seconds() const override { return runner_->kernel_setup_seconds(); }

  // The runner's step already ends in a device argmax; only the log-softmax of the chosen
  // tokens is added, so [rows] ids and floats cross to the host instead of [rows, vocab].
  absl::Status ForwardGreedy(const ForwardInput& input, KvCache& kv_cache,
                             absl::Span<GreedyToken> out) override {
    if (out.size() != input.logits_indices.size()) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardGreedy: ", out.size(),
                                                     " outputs for ",
                                                     input.logits_indices.size(),
                                                     " logits rows"));
    }
    if (runner_->NumUnreadSteps() > 0) {
      return absl::FailedPreconditionError("ForwardGreedy with sampled steps unread");
    }
    greedy_rows_.assign(input.logits_indices.size(), kernels::SamplingRow{});
    if (absl::Status s = EnqueueSampledStep(input, kv_cache, greedy_rows_); !s.ok()) return s;
    return runner_->ReadSampledStep(out);
  }

  bool SupportsAsyncSteps() const override { return true; }

  absl::Status EnqueueSampledStep(const ForwardInput& input, KvCache& kv_cache,
                                  absl::Span<const kernels::SamplingRow> rows) override {
    if (absl::Status s = PrepareCache(kv_cache); !s.ok()) return s;
    return runner_->EnqueueSampledStep(input, rows);
  }

  absl::Status ReadSampledStep(absl::Span<GreedyToken> out) override {
    return runner_->ReadSampledStep(out);
  }

  int NumUnreadSteps() const override { return runner_->NumUnreadSteps(); }

  std::vector<DeviceKvArray> DeviceKvArrays() const override { return runner_->KvArrays(); }
  int64_t KvDtypeBytes() const override { return 2; }  // bf16

  // The kvstore behind the device cache: blocks move through pinned staging on copy streams of
  // their own (StagedKvBlockCopier over CudaDeviceCopier), ordered on the device by the
  // runner's fences, so async steps in flight keep running (and are not waited for).
  bool SupportsKvBlockCopies() const override { return true; }

  absl::Status GatherKvBlocks(const KvCache& geometry, absl::Span<const int32_t> blocks,
                              absl::Span<const int32_t> layers,
                              absl::Span<uint8_t> out) override {
    absl::StatusOr<std::vector<DeviceKvArray>> arrays = PrepareBlockCopies(geometry, layers);
    if (!arrays.ok()) return arrays.status();
    // The engine gathers blocks its read steps committed: the step in flight writes none of
    // them, so the copies wait for the last read step only.
    return block_copier_->Gather(*arrays, blocks, out, runner_->ReadFence());
  }

  absl::Status ScatterKvBlocks(const KvCache& geometry, absl::Span<const int32_t> blocks,
                               absl::Span<const int32_t> layers,
                               absl::Span<const uint8_t> in) override {
    absl::StatusOr<std::vector<DeviceKvArray>> arrays = PrepareBlockCopies(geometry, layers);
    if (!arrays.ok()) return arrays.status();
    // The blocks were free: a step still in flight may write them (a row of a sequence that
    // finished meanwhile, a preempted one), so the copies follow every enqueued step. Returns
    // once they are done: the next step, enqueued after, reads the blocks.
    absl::StatusOr<const void*> tail = runner_->TailFence();
    if (!tail.ok()) return tail.status();
    absl::Status s = block_copier_->Scatter(*arrays, in, blocks, *tail);
    if (absl::IsDeadlineExceeded(s)) {
      // Copies past the deadline may still write the blocks, which the engine frees now:
      // every later step waits for them on the device.
      absl::StatusOr<std::vector<const void*>> fences = block_copier_->StalledFences();
      if (!fences.ok()) return fences.status();
      for (const void* f : *fences) {
        if (absl::Status w = runner_->WaitFence(f); !w.ok()) return w;
      }
    }
    return s;
  }

  bool SupportsDeviceLogitsProcessing() const override { return true; }

  absl::Status EnqueueProcessedSampledStep(const ForwardInput& input, KvCache& kv_cache,
                                           absl::Span<const kernels::SamplingRow> rows,
                                           const DeviceLogitsProcessing& processing) override {
    if (absl::Status s = PrepareCache(kv_cache); !s.ok()) return s;
    return runner_->EnqueueProcessedSampledStep(input, rows, processing);
  }

  absl::Status ReadSampledStepWithTop(
      absl::Span<GreedyToken> out, absl::Span<std::vector<kernels::TopLogprob>> top) override {
    return runner_->ReadSampledStepWithTop(out, top);
  }

  bool SupportsDeferredSampling() const override { return true; }
  absl::Status EnqueueForwardStep(const ForwardInput& input, KvCache& kv_cache) override {
    if (absl::Status s = PrepareCache(kv_cache); !s.ok()) return s;
    return runner_->EnqueueForwardStep(input);
  }
  absl::Status EnqueueStepSampling(absl::Span<const kernels::SamplingRow> rows,
                                   const DeviceLogitsProcessing& processing) override {
    return runner_->EnqueueStepSampling(rows, processing);
  }

 private:
  // Checks the KV geometry and ids, (re)allocates the device cache, enqueues the step.
  absl::Status RunStep(const ForwardInput& input, KvCache& kv_cache) {
    for (int32_t id : input.token_ids) {
      // Model::Forward has no previous-step references: negative ids are plain errors here.
      if (id < 0) return absl::InvalidArgumentError(absl::StrCat("token id ", id, " < 0"));
    }
    if (absl::Status s = PrepareCache(kv_cache); !s.ok()) return s;
    return runner_->Step(input);
  }

  // Checks the KV geometry and (re)allocates the device cache when it changed (only with no
  // sampled step unread: their fed-back tokens would refer to the old cache's steps).
  absl::Status PrepareCache(const KvCache& kv_cache) {
    if (kv_cache.block_size() != runner_->options().block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cache block size ", kv_cache.block_size(), " differs from the CUDA "
                       "runner's ", runner_->options().block_size));
    }
    if (runner_->num_blocks() == kv_cache.num_blocks()) return absl::OkStatus();
    if (runner_->NumUnreadSteps() > 0) {
      return absl::FailedPreconditionError("KV cache geometry changed with sampled steps unread");
    }
    return runner_->AllocateKvCache(kv_cache.num_blocks());
  }

  // PrepareBlockCopies allocates the device cache if needed, creates the copier on first use
  // and returns the arrays of `layers`. The copy streams are ordered after the compute stream
  // by fences (Gather/ScatterKvBlocks), not by waiting on the host.
  absl::StatusOr<std::vector<DeviceKvArray>> PrepareBlockCopies(const KvCache& geometry,
                                                                absl::Span<const int32_t> layers) {
    if (absl::Status s = PrepareCache(geometry); !s.ok()) return s;
    if (block_copier_ == nullptr) {
      absl::StatusOr<std::unique_ptr<transfer::CudaDeviceCopier>> copier =
          transfer::CudaDeviceCopier::Create(runner_->options().device, kBlockCopyLanes);
      if (!copier.ok()) return copier.status();
      StagedKvBlocksOptions options;
      options.num_slots = kBlockCopyLanes;
      options.copy_timeout = runner_->options().kv_block_copy_timeout;
      absl::StatusOr<std::unique_ptr<StagedKvBlockCopier>> staged =
          StagedKvBlockCopier::Create(*std::move(copier), options);
      if (!staged.ok()) return staged.status();
      block_copier_ = *std::move(staged);
    }
    return SelectKvArrays(runner_->KvArrays(), runner_->kv_cache_spec(), layers);
  }

  // Two lanes: one chunk's copy overlaps the host repacking of the other.
  static constexpr int kBlockCopyLanes = 2;

  std::unique_ptr<CudaRunner> runner_;
  std::vector<kernels::SamplingRow> greedy_rows_;
  // Declared after runner_: destroyed first (its lanes drain before the cache is freed).
  std::unique_ptr<StagedKvBlockCopier> block_copier_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaRunner>> LoadCudaRunner(const std::string& dir,
                                                           const CudaRunnerOptions& options) {
  auto config = ModelConfig::Load(dir);
  if (!config.ok()) return config.status();
  if (config->architecture == Architecture::kDeepseekV3) {
    auto r = CudaDeepseekRunner::Load(dir, options);
    if (!r.ok()) return r.status();
    return std::unique_ptr<CudaRunner>(std::move(*r));
  }
  auto r = CudaLlamaRunner::Load(dir, options);  // Unimplemented for other architectures
  if (!r.ok()) return r.status();
  return std::unique_ptr<CudaRunner>(std::move(*r));
}

absl::StatusOr<std::unique_ptr<CudaRunner>> CreateDummyCudaRunner(
    const ModelConfig& config, uint64_t seed, const CudaRunnerOptions& options) {
  if (config.architecture == Architecture::kDeepseekV3) {
    auto r = CudaDeepseekRunner::CreateDummy(config, seed, options);
    if (!r.ok()) return r.status();
    return std::unique_ptr<CudaRunner>(std::move(*r));
  }
  auto r = CudaLlamaRunner::CreateDummy(config, seed, options);
  if (!r.ok()) return r.status();
  return std::unique_ptr<CudaRunner>(std::move(*r));
}

std::unique_ptr<Model> WrapRunner(std::unique_ptr<CudaRunner> runner) {
  return std::make_unique<CudaModel>(std::move(runner));
}

absl::StatusOr<std::unique_ptr<Model>> LoadCudaModel(const std::string& dir,
                                                     const CudaRunnerOptions& options) {
  auto runner = LoadCudaRunner(dir, options);
  if (!runner.ok()) return runner.status();
  return WrapRunner(std::move(*runner));
}

}  // namespace sluice::cuda_runner
