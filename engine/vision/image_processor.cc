#include "engine/vision/image_processor.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace sluice::vision {
namespace {

using json = nlohmann::json;

absl::Status FieldError(const std::string& key, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat("preprocessor_config.json: field ", key, " must be ", want));
}

absl::Status GetBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(key, "a boolean");
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status GetPositiveInt(const json& j, const char* key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
    return FieldError(key, "a positive integer");
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status GetTriple(const json& j, const char* key, std::array<float, 3>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number()) {
    out->fill(it->get<float>());
    return absl::OkStatus();
  }
  if (!it->is_array() || it->size() != 3) return FieldError(key, "a number or 3 numbers");
  for (size_t c = 0; c < 3; ++c) {
    if (!(*it)[c].is_number()) return FieldError(key, "a number or 3 numbers");
    // The reference builds a float32 tensor from the Python floats.
    (*out)[c] = (*it)[c].get<float>();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImageProcessorConfig> ImageProcessorConfig::FromJsonText(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("preprocessor_config.json: not a valid JSON object");
  }
  ImageProcessorConfig c;
  if (auto it = j.find("image_processor_type"); it != j.end() && it->is_string()) {
    const std::string t = it->get<std::string>();
    if (t != "CLIPImageProcessor" && t != "CLIPImageProcessorFast") {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported image_processor_type ", t, " (CLIPImageProcessor only)"));
    }
  }
  absl::Status s;
  if (!(s = GetBool(j, "do_resize", &c.do_resize)).ok()) return s;
  if (!(s = GetBool(j, "do_center_crop", &c.do_center_crop)).ok()) return s;
  if (!(s = GetBool(j, "do_rescale", &c.do_rescale)).ok()) return s;
  if (!(s = GetBool(j, "do_normalize", &c.do_normalize)).ok()) return s;
  if (!(s = GetTriple(j, "image_mean", &c.image_mean)).ok()) return s;
  if (!(s = GetTriple(j, "image_std", &c.image_std)).ok()) return s;
  if (auto it = j.find("rescale_factor"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0) return FieldError("rescale_factor", "> 0");
    c.rescale_factor = it->get<double>();
  }
  if (auto it = j.find("resample"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return FieldError("resample", "an integer");
    const int r = it->get<int>();
    if (r == 3) {
      c.filter = ResizeFilter::kBicubic;
    } else if (r == 2) {
      c.filter = ResizeFilter::kBilinear;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "preprocessor_config.json: unsupported resample ", r, " (2 bilinear, 3 bicubic)"));
    }
  }
  if (c.do_resize) {
    auto it = j.find("size");
    if (it != j.end() && it->is_number_integer()) {
      c.shortest_edge = it->get<int64_t>();  // an int size means shortest_edge for CLIP
    } else if (it != j.end() && it->is_object()) {
      if (!(s = GetPositiveInt(*it, "shortest_edge", &c.shortest_edge)).ok()) return s;
      if (!(s = GetPositiveInt(*it, "height", &c.resize_height)).ok()) return s;
      if (!(s = GetPositiveInt(*it, "width", &c.resize_width)).ok()) return s;
    }
    if (c.shortest_edge <= 0 && (c.resize_height <= 0 || c.resize_width <= 0)) {
      return absl::InvalidArgumentError(
          "preprocessor_config.json: size must have shortest_edge or height and width");
    }
  }
  if (c.do_center_crop) {
    auto it = j.find("crop_size");
    if (it != j.end() && it->is_number_integer()) {
      c.crop_height = c.crop_width = it->get<int64_t>();
    } else if (it != j.end() && it->is_object()) {
      if (!(s = GetPositiveInt(*it, "height", &c.crop_height)).ok()) return s;
      if (!(s = GetPositiveInt(*it, "width", &c.crop_width)).ok()) return s;
    }
    if (c.crop_height <= 0 || c.crop_width <= 0) {
      return absl::InvalidArgumentError(
          "preprocessor_config.json: crop_size must have height and width");
    }
  }
  return c;
}

absl::StatusOr<ImageProcessorConfig> ImageProcessorConfig::Load(const std::string& dir) {
  const std::string path = dir + "/preprocessor_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return FromJsonText(ss.str());
}

std::array<int64_t, 2> ImageProcessorConfig::OutputSize(int64_t h, int64_t w) const {
  if (do_resize) {
    if (shortest_edge > 0) {
      const int64_t s = shortest_edge;
      // Python's int(s * long / short): float64 true division, truncated.
      if (w <= h) {
        h = static_cast<int64_t>(static_cast<double>(s * h) / static_cast<double>(w));
        w = s;
      } else {
        w = static_cast<int64_t>(static_cast<double>(s * w) / static_cast<double>(h));
        h = s;
      }
    } else {
      h = resize_height;
      w = resize_width;
    }
  }
  if (do_center_crop) return {crop_height, crop_width};
  return {h, w};
}

std::string ImageProcessorConfig::Fingerprint() const {
  return absl::StrFormat(
      "clip;resize=%d;se=%d;h=%d;w=%d;filter=%d;crop=%d;ch=%d;cw=%d;rescale=%d;rf=%.17g;"
      "norm=%d;mean=%.9g,%.9g,%.9g;std=%.9g,%.9g,%.9g",
      do_resize, shortest_edge, resize_height, resize_width, static_cast<int>(filter),
      do_center_crop, crop_height, crop_width, do_rescale, rescale_factor, do_normalize,
      image_mean[0], image_mean[1], image_mean[2], image_std[0], image_std[1], image_std[2]);
}

absl::Status CheckResizedSize(const ImageProcessorConfig& config, int64_t image_size,
                              int64_t height, int64_t width) {
  ImageProcessorConfig no_crop = config;
  no_crop.do_center_crop = false;
  const auto resized = no_crop.OutputSize(height, width);
  const double limit = static_cast<double>(kMaxResizedTiles * image_size * image_size);
  if (static_cast<double>(resized[0]) * static_cast<double>(resized[1]) <= limit) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "image of ", width, "x", height, " pixels: its aspect ratio is too extreme ",
      "(preprocessing would resize it to ", resized[1], "x", resized[0],
      " before cropping; at most ", kMaxResizedTiles * image_size * image_size, " pixels)"));
}

std::vector<float> Preprocess(const RgbImage& image, const ImageProcessorConfig& config) {
  int64_t h = image.height, w = image.width;
  std::vector<uint8_t> resized;
  const uint8_t* px = image.pixels.data();
  if (config.do_resize) {
    int64_t nh = h, nw = w;
    if (config.shortest_edge > 0) {
      ImageProcessorConfig no_crop = config;
      no_crop.do_center_crop = false;
      const auto size = no_crop.OutputSize(h, w);
      nh = size[0];
      nw = size[1];
    } else {
      nh = config.resize_height;
      nw = config.resize_width;
    }
    if (nh != h || nw != w) {
      resized = ResizeAntialiasU8(px, h, w, 3, nh, nw, config.filter);
      px = resized.data();
      h = nh;
      w = nw;
    }
  }
  // Center crop as a window [top, top + oh) x [left, left + ow) over the (virtually) zero-padded
  // image.
  int64_t oh = h, ow = w, top = 0, left = 0;
  if (config.do_center_crop) {
    oh = config.crop_height;
    ow = config.crop_width;
    const int64_t pad_top = oh > h ? (oh - h) / 2 : 0;
    const int64_t pad_left = ow > w ? (ow - w) / 2 : 0;
    const int64_t padded_h = oh > h ? oh : h;
    const int64_t padded_w = ow > w ? ow : w;
    top = (padded_h - oh) / 2 - pad_top;
    left = (padded_w - ow) / 2 - pad_left;
  }
  // Fused rescale + normalize (float32 like the reference's tensors).
  std::array<float, 3> mean{}, stdev{};
  const bool fused = config.do_rescale && config.do_normalize;
  const float inv_rescale = static_cast<float>(1.0 / config.rescale_factor);
  for (int c = 0; c < 3; ++c) {
    mean[c] = fused ? config.image_mean[c] * inv_rescale : config.image_mean[c];
    stdev[c] = fused ? config.image_std[c] * inv_rescale : config.image_std[c];
  }
  const float rescale = static_cast<float>(config.rescale_factor);
  std::vector<float> out(static_cast<size_t>(3 * oh * ow));
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t y = 0; y < oh; ++y) {
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t sy = top + y, sx = left + x;
        const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
        float v = inside ? static_cast<float>(px[(sy * w + sx) * 3 + c]) : 0.0f;
        if (config.do_normalize) {
          v = (v - mean[c]) / stdev[c];
        } else if (config.do_rescale) {
          v = v * rescale;
        }
        out[(c * oh + y) * ow + x] = v;
      }
    }
  }
  return out;
}

}  // namespace sluice::vision
