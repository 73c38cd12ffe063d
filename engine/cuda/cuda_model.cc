#include "engine/cuda/cuda_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice::cuda_runner {
namespace {

class CudaModel : public Model {
 public:
  explicit CudaModel(std::unique_ptr<CudaLlamaRunner> runner) : runner_(std::move(runner)) {}

  const ModelConfig& config() const override { return runner_->config(); }

  KvCacheSpec kv_cache_spec() const override {
    const ModelConfig& c = runner_->config();
    KvCacheSpec spec;
    spec.num_layers = c.num_hidden_layers;
    spec.k_floats_per_token = c.num_key_value_heads * c.head_dim;
    spec.v_floats_per_token = c.num_key_value_heads * c.head_dim;
    return spec;
  }

  int64_t WeightBytesPerToken() const override { return runner_->WeightBytesPerStep(); }

  absl::Status Forward(const ForwardInput& input, KvCache& kv_cache,
                       absl::Span<float> logits) override {
    if (kv_cache.block_size() != runner_->options().block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cache block size ", kv_cache.block_size(), " differs from the CUDA "
                       "runner's ", runner_->options().block_size));
    }
    const int64_t vocab = runner_->config().vocab_size;
    if (static_cast<int64_t>(logits.size()) !=
        static_cast<int64_t>(input.logits_indices.size()) * vocab) {
      return absl::InvalidArgumentError(absl::StrCat("logits span has ", logits.size(),
                                                     " floats, expected ",
                                                     input.logits_indices.size(), " x ", vocab));
    }
    for (int32_t id : input.token_ids) {
      // Model::Forward has no previous-step references: negative ids are plain errors here.
      if (id < 0) return absl::InvalidArgumentError(absl::StrCat("token id ", id, " < 0"));
    }
    if (runner_->num_blocks() != kv_cache.num_blocks()) {
      if (absl::Status s = runner_->AllocateKvCache(kv_cache.num_blocks()); !s.ok()) return s;
    }
    if (absl::Status s = runner_->Step(input); !s.ok()) return s;
    if (input.logits_indices.empty()) return runner_->Synchronize();
    auto out = runner_->Logits();
    if (!out.ok()) return out.status();
    std::copy(out->begin(), out->end(), logits.begin());
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<CudaLlamaRunner> runner_;
};

}  // namespace

std::unique_ptr<Model> WrapRunner(std::unique_ptr<CudaLlamaRunner> runner) {
  return std::make_unique<CudaModel>(std::move(runner));
}

absl::StatusOr<std::unique_ptr<Model>> LoadCudaModel(const std::string& dir,
                                                     const CudaRunnerOptions& options) {
  auto runner = CudaLlamaRunner::Load(dir, options);
  if (!runner.ok()) return runner.status();
  return WrapRunner(std::move(*runner));
}

}  // namespace sluice::cuda_runner
