#include "engine/cuda/cuda_vision.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/dense_attention.h"
#include "engine/cuda/runner_core.h"
#include "engine/model/safetensors.h"
#include "kernels/activation/activation_cuda.h"
#include "kernels/layer_norm/layer_norm_cuda.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/vit/vit_cuda.h"

namespace sluice::cuda_runner {
namespace {

using kernels::bf16;
using kernels::DeviceBuffer;

template <typename T>
absl::StatusOr<DeviceBuffer<T>> Alloc(int64_t n) {
  return DeviceBuffer<T>::Create(static_cast<size_t>(n));
}

// A float32 device tensor (LayerNorm parameters, class and position embeddings).
absl::Status AllocFillFloat(WeightSource& src, DeviceBuffer<float>* buf, const std::string& name,
                            const std::vector<int64_t>& shape, DummyInit init) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  SLUICE_ASSIGN_OR_RETURN(*buf, Alloc<float>(n));
  return src.FillFloat(name, shape, init, buf->data());
}

class CudaVisionBackend : public vision::VisionBackend {
 public:
  static absl::StatusOr<std::unique_ptr<vision::VisionBackend>> Create(
      const std::string& dir, const vision::LlavaConfig& config,
      const CudaVisionOptions& options);

  std::string device() const override { return "cuda"; }

  absl::StatusOr<std::vector<float>> SelectedHiddenState(absl::Span<const float> pixel_values,
                                                         int64_t num_images) const override {
    return Run(pixel_values, num_images, /*project=*/false);
  }
  absl::StatusOr<std::vector<float>> Encode(absl::Span<const float> pixel_values,
                                            int64_t num_images) const override {
    return Run(pixel_values, num_images, /*project=*/true);
  }

 private:
  struct Layer {
    DeviceBuffer<float> ln1_w, ln1_b, ln2_w, ln2_b;
    DeviceBuffer<bf16> w_qkv, b_qkv;  // [3D, D], [3D]: q rows, then k, then v
    DeviceBuffer<bf16> w_out, b_out;  // [D, D], [D]
    DeviceBuffer<bf16> w_fc1, b_fc1;  // [I, D], [I]
    DeviceBuffer<bf16> w_fc2, b_fc2;  // [D, I], [D]
  };
  // Activations for max_batch_images images (rows = images · positions).
  struct Scratch {
    DeviceBuffer<float> pixels, h;
    DeviceBuffer<bf16> cols, normed, qkv, attn, tmp, mid, proj_mid, proj_out;
  };

  CudaVisionBackend() = default;
  absl::Status LoadWeights(WeightSource& src, const std::string& root);
  absl::Status AllocScratch();
  absl::Status Activation(const std::string& act, bf16* x, int64_t n) const;
  // Run: pixels → hidden state at the feature layer (project false: [n, N, Dv]) or the
  // projected features ([n, T, Dt]), in passes of max_batch_images.
  absl::StatusOr<std::vector<float>> Run(absl::Span<const float> pixel_values,
                                         int64_t num_images, bool project) const;
  absl::Status Tower(int64_t n) const;         // scratch_.pixels → scratch_.h, n images
  absl::Status Project(int64_t n) const;       // scratch_.h → scratch_.proj_out

  vision::LlavaConfig config_;
  CudaVisionOptions options_;
  int64_t num_layers_ = 0;
  kernels::CudaStream stream_;
  std::unique_ptr<kernels::CublasLt> lt_;
  std::unique_ptr<DenseAttention> attention_;
  int64_t patch_k_ = 0;         // C·P·P rounded up to 8: 16-byte GEMM rows
  DeviceBuffer<bf16> patch_w_;  // [D, patch_k_] (conv weight flattened (c, ky, kx), zero pad)
  DeviceBuffer<float> class_emb_, pos_emb_, pre_ln_w_, pre_ln_b_;
  std::vector<Layer> layers_;
  DeviceBuffer<bf16> w1_, b1_, w2_, b2_;  // projector (biases empty without bias)
  mutable std::mutex mu_;  // one pass at a time: the activations and the stream are shared
  mutable Scratch scratch_;
  mutable std::vector<bf16> host_bits_;
};

absl::StatusOr<std::unique_ptr<vision::VisionBackend>> CudaVisionBackend::Create(
    const std::string& dir, const vision::LlavaConfig& config,
    const CudaVisionOptions& options) {
  const vision::ClipVisionConfig& v = config.vision;
  if (options.max_batch_images < 1 || options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA vision tower: max_batch_images ",
                                                   options.max_batch_images, ", device ",
                                                   options.device));
  }
  if (v.num_attention_heads < 1 || v.hidden_size % v.num_attention_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA vision tower: hidden_size ", v.hidden_size,
                     " is not a multiple of num_attention_heads ", v.num_attention_heads));
  }
  std::unique_ptr<CudaVisionBackend> b(new CudaVisionBackend());
  b->config_ = config;
  b->options_ = options;
  b->num_layers_ = config.FeatureLayerIndex();
  b->patch_k_ = (v.num_channels * v.patch_size * v.patch_size + 7) / 8 * 8;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device), "cudaSetDevice");
  SLUICE_ASSIGN_OR_RETURN(b->stream_, kernels::CudaStream::Create());
  SLUICE_ASSIGN_OR_RETURN(b->lt_, kernels::CublasLt::Create());
  SLUICE_ASSIGN_OR_RETURN(b->attention_, DenseAttention::Create(b->stream_.get()));
  if (options.dummy_weights) {
    DummySource src(options.dummy_seed);
    SLUICE_RETURN_IF_ERROR(b->LoadWeights(src, ""));
  } else {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
    const std::string root = vision::VisionWeightRoot(
        ckpt->Contains("model.vision_tower.embeddings.class_embedding"));
    CheckpointSource src(std::move(ckpt));
    SLUICE_RETURN_IF_ERROR(b->LoadWeights(src, root));
  }
  SLUICE_RETURN_IF_ERROR(b->AllocScratch());
  // Every weight copy done, those on the legacy stream (CheckpointSource, FillFloat) included.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return std::unique_ptr<vision::VisionBackend>(std::move(b));
}

absl::Status CudaVisionBackend::LoadWeights(WeightSource& src, const std::string& root) {
  const vision::ClipVisionConfig& c = config_.vision;
  const int64_t D = c.hidden_size, I = c.intermediate_size, P = c.patch_size;
  cudaStream_t st = stream_.get();
  const std::string t = root + "vision_tower.", e = t + "embeddings.";
  const auto normal = DummyInit::kNormal, ones = DummyInit::kOnes, zeros = DummyInit::kZeros;
  {
    // The conv weight [D, C·P·P] into rows of patch_k_ (16-byte aligned), the pad zero.
    const int64_t K = c.num_channels * P * P;
    DeviceBuffer<bf16> dense;
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &dense, e + "patch_embedding.weight",
                                     {D, c.num_channels, P, P}, normal, st));
    SLUICE_ASSIGN_OR_RETURN(patch_w_, Alloc<bf16>(D * patch_k_));
    // CheckpointSource fills with a synchronous cudaMemcpy from pageable memory on the legacy
    // stream, which may return before its last DMA lands; stream_ is non-blocking and would
    // not wait for it.
    SLUICE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(patch_w_.data(), 0, patch_w_.bytes(), st), "cudaMemsetAsync");
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy2DAsync(patch_w_.data(), patch_k_ * sizeof(bf16), dense.data(),
                          K * sizeof(bf16), K * sizeof(bf16), D, cudaMemcpyDeviceToDevice, st),
        "cudaMemcpy2DAsync patch weight");
    SLUICE_RETURN_IF_ERROR(stream_.Synchronize());  // before `dense` is freed
  }
  SLUICE_RETURN_IF_ERROR(AllocFillFloat(src, &class_emb_, e + "class_embedding", {D}, normal));
  SLUICE_RETURN_IF_ERROR(AllocFillFloat(src, &pos_emb_, e + "position_embedding.weight",
                                        {c.num_positions(), D}, normal));
  SLUICE_RETURN_IF_ERROR(AllocFillFloat(src, &pre_ln_w_, t + "pre_layrnorm.weight", {D}, ones));
  SLUICE_RETURN_IF_ERROR(AllocFillFloat(src, &pre_ln_b_, t + "pre_layrnorm.bias", {D}, zeros));
  layers_.resize(static_cast<size_t>(num_layers_));
  for (int64_t l = 0; l < num_layers_; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = absl::StrCat(t, "encoder.layers.", l, ".");
    const std::string a = p + "self_attn.";
    SLUICE_RETURN_IF_ERROR(AllocFillFloat(src, &L.ln1_w, p + "layer_norm1.weight", {D}, ones));
    SLUICE_RETURN_IF_ERROR(AllocFillFloat(src, &L.ln1_b, p + "layer_norm1.bias", {D}, zeros));
    SLUICE_RETURN_IF_ERROR(AllocFillFloat(src, &L.ln2_w, p + "layer_norm2.weight", {D}, ones));
    SLUICE_RETURN_IF_ERROR(AllocFillFloat(src, &L.ln2_b, p + "layer_norm2.bias", {D}, zeros));
    SLUICE_RETURN_IF_ERROR(AllocFillFused(
        src, &L.w_qkv,
        {{a + "q_proj.weight", D}, {a + "k_proj.weight", D}, {a + "v_proj.weight", D}}, D, normal,
        st));
    SLUICE_RETURN_IF_ERROR(AllocFillFused(
        src, &L.b_qkv, {{a + "q_proj.bias", D}, {a + "k_proj.bias", D}, {a + "v_proj.bias", D}},
        1, zeros, st));
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &L.w_out, a + "out_proj.weight", {D, D}, normal, st));
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &L.b_out, a + "out_proj.bias", {D}, zeros, st));
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &L.w_fc1, p + "mlp.fc1.weight", {I, D}, normal, st));
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &L.b_fc1, p + "mlp.fc1.bias", {I}, zeros, st));
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &L.w_fc2, p + "mlp.fc2.weight", {D, I}, normal, st));
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &L.b_fc2, p + "mlp.fc2.bias", {D}, zeros, st));
  }
  const int64_t dt = config_.text_hidden_size;
  const std::string m = root + "multi_modal_projector.";
  SLUICE_RETURN_IF_ERROR(AllocFill(src, &w1_, m + "linear_1.weight", {dt, D}, normal, st));
  SLUICE_RETURN_IF_ERROR(AllocFill(src, &w2_, m + "linear_2.weight", {dt, dt}, normal, st));
  if (config_.multimodal_projector_bias) {
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &b1_, m + "linear_1.bias", {dt}, zeros, st));
    SLUICE_RETURN_IF_ERROR(AllocFill(src, &b2_, m + "linear_2.bias", {dt}, zeros, st));
  }
  return absl::OkStatus();
}

absl::Status CudaVisionBackend::AllocScratch() {
  const vision::ClipVisionConfig& c = config_.vision;
  const int64_t n = options_.max_batch_images, S = c.image_size;
  const int64_t D = c.hidden_size, rows = n * c.num_positions();
  const int64_t proj_rows = n * config_.image_seq_length, dt = config_.text_hidden_size;
  Scratch& s = scratch_;
  SLUICE_ASSIGN_OR_RETURN(s.pixels, Alloc<float>(n * c.num_channels * S * S));
  SLUICE_ASSIGN_OR_RETURN(s.h, Alloc<float>(rows * D));
  SLUICE_ASSIGN_OR_RETURN(s.cols, Alloc<bf16>(n * c.num_patches() * patch_k_));
  SLUICE_ASSIGN_OR_RETURN(s.normed, Alloc<bf16>(rows * D));
  SLUICE_ASSIGN_OR_RETURN(s.qkv, Alloc<bf16>(rows * 3 * D));
  SLUICE_ASSIGN_OR_RETURN(s.attn, Alloc<bf16>(rows * D));
  SLUICE_ASSIGN_OR_RETURN(s.tmp, Alloc<bf16>(rows * D));
  SLUICE_ASSIGN_OR_RETURN(s.mid, Alloc<bf16>(rows * c.intermediate_size));
  SLUICE_ASSIGN_OR_RETURN(s.proj_mid, Alloc<bf16>(proj_rows * dt));
  SLUICE_ASSIGN_OR_RETURN(s.proj_out, Alloc<bf16>(proj_rows * dt));
  return absl::OkStatus();
}

absl::Status CudaVisionBackend::Activation(const std::string& act, bf16* x, int64_t n) const {
  return act == "gelu" ? kernels::GeluCuda(x, x, n, stream_.get())
                       : kernels::QuickGeluCuda(x, x, n, stream_.get());
}

absl::Status CudaVisionBackend::Tower(int64_t n) const {
  const vision::ClipVisionConfig& c = config_.vision;
  const int64_t D = c.hidden_size, I = c.intermediate_size, N = c.num_positions();
  const int64_t patches = c.num_patches(), K = patch_k_;
  const int64_t rows = n * N;
  const float eps = static_cast<float>(c.layer_norm_eps);
  cudaStream_t st = stream_.get();
  Scratch& s = scratch_;
  kernels::CublasLt& lt = *lt_;
  // Patch embedding: a GEMM over the unfolded patches (the conv has no bias); tmp holds them.
  SLUICE_RETURN_IF_ERROR(kernels::PatchUnfoldCuda(s.pixels.data(), n, c.num_channels,
                                                  c.image_size, c.patch_size, K, s.cols.data(),
                                                  st));
  SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(lt, s.cols.data(), patch_w_.data(), nullptr,
                                             s.tmp.data(), n * patches, D, K, st));
  SLUICE_RETURN_IF_ERROR(kernels::ClipEmbeddingsCuda(s.tmp.data(), class_emb_.data(),
                                                     pos_emb_.data(), n, patches, D, s.h.data(),
                                                     st));
  SLUICE_RETURN_IF_ERROR(kernels::LayerNormCuda(s.h.data(), pre_ln_w_.data(), pre_ln_b_.data(),
                                                s.h.data(), rows, D, eps, st));
  kernels::BidirectionalAttentionParams ap;
  ap.num_sequences = n;
  ap.seq_len = N;
  ap.num_heads = c.num_attention_heads;
  ap.head_dim = D / c.num_attention_heads;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(ap.head_dim));
  for (int64_t l = 0; l < num_layers_; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    // h += the previous layer's MLP output (none before layer 0), then LN1.
    SLUICE_RETURN_IF_ERROR(kernels::AddLayerNormCuda(s.h.data(), l > 0 ? s.tmp.data() : nullptr,
                                                     L.ln1_w.data(), L.ln1_b.data(),
                                                     s.normed.data(), rows, D, eps, st));
    SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(lt, s.normed.data(), L.w_qkv.data(),
                                               L.b_qkv.data(), s.qkv.data(), rows, 3 * D, D, st));
    SLUICE_RETURN_IF_ERROR(attention_->Run(s.qkv.data(), s.qkv.data() + D, s.qkv.data() + 2 * D,
                                           3 * D, ap, s.attn.data()));
    SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(lt, s.attn.data(), L.w_out.data(), L.b_out.data(),
                                               s.tmp.data(), rows, D, D, st));
    SLUICE_RETURN_IF_ERROR(kernels::AddLayerNormCuda(s.h.data(), s.tmp.data(), L.ln2_w.data(),
                                                     L.ln2_b.data(), s.normed.data(), rows, D,
                                                     eps, st));
    SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(lt, s.normed.data(), L.w_fc1.data(),
                                               L.b_fc1.data(), s.mid.data(), rows, I, D, st));
    SLUICE_RETURN_IF_ERROR(Activation(c.hidden_act, s.mid.data(), rows * I));
    SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(lt, s.mid.data(), L.w_fc2.data(), L.b_fc2.data(),
                                               s.tmp.data(), rows, D, I, st));
  }
  if (num_layers_ > 0) {  // the last layer's MLP residual, no norm after it
    SLUICE_RETURN_IF_ERROR(kernels::AddLayerNormCuda(s.h.data(), s.tmp.data(), nullptr, nullptr,
                                                     nullptr, rows, D, eps, st));
  }
  return absl::OkStatus();
}

absl::Status CudaVisionBackend::Project(int64_t n) const {
  const int64_t N = config_.vision.num_positions(), dv = config_.vision.hidden_size;
  const int64_t T = config_.image_seq_length, dt = config_.text_hidden_size;
  cudaStream_t st = stream_.get();
  Scratch& s = scratch_;
  // Feature selection (skip 1: CLS dropped, "default"; 0: "full") into bf16; normed is free.
  SLUICE_RETURN_IF_ERROR(
      kernels::SelectFeatureRowsCuda(s.h.data(), n, N, N - T, T, dv, s.normed.data(), st));
  SLUICE_RETURN_IF_ERROR(kernels::LinearCuda(*lt_, s.normed.data(), w1_.data(), b1_.data(),
                                             s.proj_mid.data(), n * T, dt, dv, st));
  SLUICE_RETURN_IF_ERROR(Activation(config_.projector_hidden_act, s.proj_mid.data(), n * T * dt));
  return kernels::LinearCuda(*lt_, s.proj_mid.data(), w2_.data(), b2_.data(), s.proj_out.data(),
                             n * T, dt, dt, st);
}

absl::StatusOr<std::vector<float>> CudaVisionBackend::Run(absl::Span<const float> pixel_values,
                                                          int64_t num_images,
                                                          bool project) const {
  const vision::ClipVisionConfig& c = config_.vision;
  const int64_t per_image = c.num_channels * c.image_size * c.image_size;
  const int64_t out_rows = project ? config_.image_seq_length : c.num_positions();
  const int64_t out_dim = project ? config_.text_hidden_size : c.hidden_size;
  const int64_t out_per_image = out_rows * out_dim;
  std::vector<float> out(static_cast<size_t>(num_images * out_per_image));
  std::lock_guard<std::mutex> lock(mu_);
  SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  cudaStream_t st = stream_.get();
  for (int64_t first = 0; first < num_images; first += options_.max_batch_images) {
    const int64_t n = std::min(options_.max_batch_images, num_images - first);
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(scratch_.pixels.data(), pixel_values.data() + first * per_image,
                        static_cast<size_t>(n * per_image) * sizeof(float),
                        cudaMemcpyHostToDevice, st),
        "cudaMemcpyAsync pixels");
    SLUICE_RETURN_IF_ERROR(Tower(n));
    float* dst = out.data() + first * out_per_image;
    const size_t count = static_cast<size_t>(n * out_per_image);
    if (project) {
      SLUICE_RETURN_IF_ERROR(Project(n));
      host_bits_.resize(count);
      SLUICE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(host_bits_.data(), scratch_.proj_out.data(), count * sizeof(bf16),
                          cudaMemcpyDeviceToHost, st),
          "cudaMemcpyAsync features");
      SLUICE_RETURN_IF_ERROR(stream_.Synchronize());
      for (size_t i = 0; i < count; ++i) dst[i] = kernels::Bf16ToFloat(host_bits_[i]);
    } else {
      SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, scratch_.h.data(), count * sizeof(float),
                                                  cudaMemcpyDeviceToHost, st),
                                  "cudaMemcpyAsync hidden state");
      SLUICE_RETURN_IF_ERROR(stream_.Synchronize());
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<vision::VisionBackend>> LoadCudaVisionBackend(
    const std::string& dir, const vision::LlavaConfig& config, const CudaVisionOptions& options) {
  return CudaVisionBackend::Create(dir, config, options);
}

vision::VisionBackendFactory CudaVisionBackendFactory(const CudaVisionOptions& options) {
  return [options](const std::string& dir, const vision::LlavaConfig& config) {
    return LoadCudaVisionBackend(dir, config, options);
  };
}

}  // namespace sluice::cuda_runner
