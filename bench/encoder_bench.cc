// encoder_bench: image encoder throughput — decode, preprocess and the vision tower +
// projector (engine/vision/vision_encoder.h) of a LLaVA model folder, on the CPU or (builds
// with the CUDA backend) the GPU.
//
//   encoder_bench --model DIR --image FILE [--image FILE ...] [--batch N] [--iters N]
//                 [--device cpu|cuda] [--load-format auto|dummy]
//
// --load-format dummy (CUDA) needs only config.json and preprocessor_config.json:
// bench/configs/llava-1.5-7b has LLaVA-1.5-7B's shapes (CLIP ViT-L/14-336, projector to 4096).
//
// Each image is decoded, preprocessed and encoded once to warm up, then `iters` timed rounds run
// on one request thread (the kernels use the process's CPU pool): per image decode,
// preprocess, encode alone (batch 1), then one Encode of `batch` images. Prints JSON:
// {"model", "device", "load_format", "images", "threads", "decode_seconds", "preprocess_seconds", "encode_seconds"
// (means per image), "images_per_second" (decode + preprocess + encode, batch 1),
// "batched_images_per_second" (encode only, batch N), "encode_share" (of the per-image time)}.
#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/vision/image.h"
#include "engine/vision/image_processor.h"
#include "engine/vision/vision_encoder.h"
#include "kernels/common/parallel.h"

#if defined(SLUICE_HAVE_CUDA)
#include "engine/cuda/cuda_vision.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"Image encoder throughput"};
  std::string model_dir, device = "cpu", load_format = "auto";
  std::vector<std::string> image_paths;
  int batch = 8;
  int iters = 20;
  app.add_option("--model", model_dir, "LlavaForConditionalGeneration folder")->required();
  app.add_option("--image", image_paths, "PNG/JPEG/WebP files")->required();
  app.add_option("--batch", batch, "images per batched Encode")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed rounds")->check(CLI::PositiveNumber);
  app.add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--load-format", load_format, "auto or dummy (random weights; cuda)")
      ->check(CLI::IsMember({"auto", "dummy"}));
  CLI11_PARSE(app, argc, argv);

  namespace vision = sluice::vision;
  absl::StatusOr<std::unique_ptr<vision::VisionEncoder>> encoder =
      absl::InvalidArgumentError("--load-format dummy needs --device cuda");
  if (device == "cpu") {
    if (load_format == "auto") encoder = vision::VisionEncoder::Load(model_dir);
  } else {
#if defined(SLUICE_HAVE_CUDA)
    sluice::cuda_runner::CudaVisionOptions options;
    options.dummy_weights = load_format == "dummy";
    options.max_batch_images = batch;
    encoder = vision::VisionEncoder::Load(
        model_dir, sluice::cuda_runner::CudaVisionBackendFactory(options));
#else
    encoder = absl::InvalidArgumentError("--device cuda: built without the CUDA backend");
#endif
  }
  if (!encoder.ok()) {
    std::cerr << encoder.status() << "\n";
    return 1;
  }
  std::vector<std::string> files;
  for (const std::string& path : image_paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::cerr << "cannot open " << path << "\n";
      return 1;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    files.push_back(ss.str());
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  double decode_s = 0, preprocess_s = 0, encode_s = 0, batched_s = 0;
  int64_t n = 0;
  std::vector<float> batch_pixels;
  int64_t per_image = 0;  // floats of one preprocessed image (the same for every image)
  for (int round = -1; round < iters; ++round) {  // round -1 warms up
    for (const std::string& bytes : files) {
      const auto t0 = Clock::now();
      auto image = vision::DecodeImage(bytes, vision::ImageDecodeLimits{});
      const auto t1 = Clock::now();
      if (!image.ok()) {
        std::cerr << image.status() << "\n";
        return 1;
      }
      const std::vector<float> pixels = vision::Preprocess(*image, (*encoder)->processor());
      const auto t2 = Clock::now();
      auto features = (*encoder)->Encode(pixels, 1);
      const auto t3 = Clock::now();
      if (!features.ok()) {
        std::cerr << features.status() << "\n";
        return 1;
      }
      per_image = static_cast<int64_t>(pixels.size());
      if (static_cast<int>(batch_pixels.size() / pixels.size()) < batch) {
        batch_pixels.insert(batch_pixels.end(), pixels.begin(), pixels.end());
      }
      if (round >= 0) {
        decode_s += seconds(t0, t1);
        preprocess_s += seconds(t1, t2);
        encode_s += seconds(t2, t3);
        ++n;
      }
    }
  }
  // Fewer images than the batch were seen (files x rounds): the batch repeats them.
  while (static_cast<int>(batch_pixels.size() / per_image) < batch) {
    batch_pixels.insert(batch_pixels.end(), batch_pixels.begin(), batch_pixels.begin() + per_image);
  }
  batch_pixels.resize(static_cast<size_t>(per_image) * batch);
  for (int round = -1; round < iters; ++round) {
    const auto t0 = Clock::now();
    auto features = (*encoder)->Encode(batch_pixels, batch);
    if (!features.ok()) {
      std::cerr << features.status() << "\n";
      return 1;
    }
    if (round >= 0) batched_s += seconds(t0, Clock::now());
  }
  const double per = (decode_s + preprocess_s + encode_s) / static_cast<double>(n);
  nlohmann::json out = {
      {"model", model_dir},
      {"device", device},
      {"load_format", load_format},
      {"images", image_paths},
      {"threads", sluice::kernels::NumCpuThreads()},
      {"tokens_per_image", (*encoder)->tokens_per_image()},
      {"decode_seconds", decode_s / n},
      {"preprocess_seconds", preprocess_s / n},
      {"encode_seconds", encode_s / n},
      {"images_per_second", 1.0 / per},
      {"batch", batch},
      {"batched_images_per_second", batch * iters / batched_s},
      {"encode_share", encode_s / n / per},
  };
  std::cout << out.dump(1) << "\n";
  return 0;
}
