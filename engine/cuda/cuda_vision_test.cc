// The CUDA vision backend (cuda_vision.h) and its attention (dense_attention.h) against the
// float32 CPU references: DenseAttention vs BidirectionalAttentionCpu on random inputs, and the
// whole CUDA tower + projector vs the CPU VisionEncoder and the reference features on
// ../shared/fixtures/llava-tiny for each fixture image. Needs a GPU (cuda_model_test).
//
// Tolerance (bf16 weights and activations against float32; the fixture README gives bf16 bounds
// for logits only): every element within 1/16 relative + 1/64 of the largest reference value —
// about 10 bf16 roundings, while a layout or indexing bug is off by the values' own size.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_vision.h"
#include "engine/cuda/dense_attention.h"
#include "engine/model/safetensors.h"
#include "engine/vision/image.h"
#include "engine/vision/vision_encoder.h"
#include "gtest/gtest.h"
#include "kernels/attention/bidirectional_attention.h"
#include "kernels/cuda/cuda_test_util.h"
#include "tests/util/test_paths.h"

namespace sluice::cuda_runner {
namespace {

using kernels::bf16;
using kernels::cuda_test::Download;
using kernels::cuda_test::ExpectClose;
using kernels::cuda_test::NanBuffer;
using kernels::cuda_test::RandomBf16;
using kernels::cuda_test::ToFloat;
using kernels::cuda_test::Upload;

constexpr double kRtol = 1.0 / 16, kAtol = 1.0 / 64;

TEST(DenseAttentionTest, MatchesBidirectionalAttentionCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = kernels::cuda_test::Rng();
  auto stream = kernels::CudaStream::Create();
  ASSERT_TRUE(stream.ok());
  auto attention = DenseAttention::Create(stream->get());
  ASSERT_TRUE(attention.ok()) << attention.status();
  // (sequences, seq_len, heads, head_dim): CLIP ViT-L/14-336, llava-tiny, ViT-B/32-224.
  const int64_t shapes[][4] = {{2, 577, 16, 64}, {3, 17, 2, 16}, {4, 50, 12, 64}};
  for (const auto& s : shapes) {
    kernels::BidirectionalAttentionParams p;
    p.num_sequences = s[0];
    p.seq_len = s[1];
    p.num_heads = s[2];
    p.head_dim = s[3];
    p.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
    const int64_t D = p.num_heads * p.head_dim, rows = p.num_sequences * p.seq_len;
    const auto qkv = RandomBf16(static_cast<size_t>(rows * 3 * D), rng, -2.0f, 2.0f);
    auto d_qkv = Upload(qkv);
    auto d_out = NanBuffer(static_cast<size_t>(rows * D));
    ASSERT_TRUE((*attention)
                    ->Run(d_qkv.data(), d_qkv.data() + D, d_qkv.data() + 2 * D, 3 * D, p,
                          d_out.data())
                    .ok());
    const auto f = ToFloat(qkv);
    std::vector<float> want(static_cast<size_t>(rows * D));
    kernels::BidirectionalAttentionCpu(f.data(), f.data() + D, f.data() + 2 * D, 3 * D, p,
                                       want.data());
    // bf16 P and output: a few roundings of values bounded by max |v|.
    ExpectClose(absl::StrCat("dense_attention L=", p.seq_len, " heads=", p.num_heads),
                Download(d_out), want, 1.0 / 64, 1.0 / 256);
  }
  kernels::BidirectionalAttentionParams bad;
  EXPECT_EQ((*attention)->Run(nullptr, nullptr, nullptr, 0, bad, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

class CudaVisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
    dir_ = testing::FixtureDir("llava-tiny");
    auto golden = SafetensorsFile::Open(dir_ + "/golden.safetensors");
    ASSERT_TRUE(golden.ok()) << golden.status();
    golden_ = std::move(*golden);
    auto cpu = vision::VisionEncoder::Load(dir_);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    CudaVisionOptions options;
    options.max_batch_images = 2;  // three images take two passes
    auto cuda = vision::VisionEncoder::Load(dir_, CudaVisionBackendFactory(options));
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    cuda_ = std::move(*cuda);
  }
  std::vector<float> Golden(const std::string& name) {
    const TensorView* v = golden_->Find(name);
    EXPECT_NE(v, nullptr) << name;
    if (v == nullptr) return {};
    auto t = ToFloat32(*v);
    return t.ok() ? *t : std::vector<float>{};
  }
  std::string dir_;
  std::unique_ptr<SafetensorsFile> golden_;
  std::unique_ptr<vision::VisionEncoder> cpu_, cuda_;
};

TEST_F(CudaVisionTest, MatchesCpuTowerAndReferenceOnEachFixtureImage) {
  EXPECT_EQ(cuda_->device(), "cuda");
  EXPECT_EQ(cpu_->device(), "cpu");
  const char* files[] = {"image_0.png", "image_1.png", "image_2.jpg"};
  std::vector<float> batch_pixels, batch_want;
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(files[k]);
    // The serving path: bytes → decode → preprocess (host) → the CUDA tower.
    auto image = vision::DecodeImage(testing::ReadFileBytes(dir_ + "/" + files[k]),
                                     vision::ImageDecodeLimits{});
    ASSERT_TRUE(image.ok()) << image.status();
    const std::vector<float> pixels = vision::Preprocess(*image, cuda_->processor());
    auto hidden = cuda_->SelectedHiddenState(pixels, 1);
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    auto cpu_hidden = cpu_->SelectedHiddenState(pixels, 1);
    ASSERT_TRUE(cpu_hidden.ok());
    ExpectClose(absl::StrCat("llava-tiny hidden ", k, " vs cpu"), *hidden, *cpu_hidden, kRtol,
                kAtol);
    ExpectClose(absl::StrCat("llava-tiny hidden ", k, " vs reference"), *hidden,
                Golden(absl::StrCat("vision_hidden_", k)), kRtol, kAtol);
    auto features = cuda_->EncodeImage(*image);
    ASSERT_TRUE(features.ok()) << features.status();
    auto cpu_features = cpu_->EncodeImage(*image);
    ASSERT_TRUE(cpu_features.ok());
    const std::vector<float> want = Golden(absl::StrCat("image_features_", k));
    ExpectClose(absl::StrCat("llava-tiny features ", k, " vs cpu"), *features, *cpu_features,
                kRtol, kAtol);
    ExpectClose(absl::StrCat("llava-tiny features ", k, " vs reference"), *features, want, kRtol,
                kAtol);
    batch_pixels.insert(batch_pixels.end(), pixels.begin(), pixels.end());
    batch_want.insert(batch_want.end(), want.begin(), want.end());
  }
  // Three images in one call (two passes of max_batch_images 2): each image's own features.
  auto batch = cuda_->Encode(batch_pixels, 3);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ExpectClose("llava-tiny features batch of 3", *batch, batch_want, kRtol, kAtol);
  // Bad input is the encoder's error, before the device.
  EXPECT_EQ(cuda_->Encode(batch_pixels, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaVisionLoadTest, RejectsNonLlavaFolderAndBadOptions) {
  SLUICE_SKIP_WITHOUT_CUDA();
  // llama-tiny is no LLaVA folder: the config parser refuses it by architecture.
  auto enc = vision::VisionEncoder::Load(testing::FixtureDir("llama-tiny"),
                                         CudaVisionBackendFactory({}));
  EXPECT_EQ(enc.status().code(), absl::StatusCode::kInvalidArgument) << enc.status();
  CudaVisionOptions bad;
  bad.max_batch_images = 0;
  auto none = vision::VisionEncoder::Load(testing::FixtureDir("llava-tiny"),
                                          CudaVisionBackendFactory(bad));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << none.status();
}

}  // namespace
}  // namespace sluice::cuda_runner
