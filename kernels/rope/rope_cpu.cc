// Rotary embedding tables and application, following transformers' rope init functions
// (`modeling_rope_utils.py`: `_compute_default_rope_parameters`, `_compute_linear_scaling_rope_
// parameters`, `_compute_yarn_parameters`, `_compute_llama3_parameters`) and
// `apply_rotary_pos_emb` (rotate-half). Inverse frequencies are rounded to float32 like torch's,
// and each angle is position × inv_freq rounded to float32 before cos/sin, as in
// `LlamaRotaryEmbedding.forward`.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/parallel.h"
#include "kernels/rope/rope.h"

namespace sluice::kernels {
namespace {

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double FindCorrectionDim(double num_rotations, double dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

}  // namespace

absl::StatusOr<RopeTable> MakeRopeTable(const RopeParams& p) {
  if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotary_dim must be positive and even, got ", p.rotary_dim));
  }
  const int64_t half = p.rotary_dim / 2;
  RopeTable table;
  table.inv_freq.resize(static_cast<size_t>(half));
  // pos_freqs[i] = base ** (2i / dim), computed in float32 as torch does.
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(p.rotary_dim);
    pos_freqs[i] = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(p.theta)),
                                               static_cast<double>(exponent)));
  }
  if (p.rope_type == "default" || p.rope_type == "linear") {
    for (int64_t i = 0; i < half; ++i) {
      float f = 1.0f / pos_freqs[i];
      if (p.rope_type == "linear") f = f / static_cast<float>(p.factor);
      table.inv_freq[i] = f;
    }
    return table;
  }
  if (p.rope_type == "llama3") {
    if (p.original_max_position_embeddings <= 0) {
      return absl::InvalidArgumentError("llama3 rope needs original_max_position_embeddings");
    }
    const double old_len = static_cast<double>(p.original_max_position_embeddings);
    const double low_wavelen = old_len / p.low_freq_factor;
    const double high_wavelen = old_len / p.high_freq_factor;
    for (int64_t i = 0; i < half; ++i) {
      const double inv = 1.0f / pos_freqs[i];
      const double wavelen = 2.0 * M_PI / inv;
      double out = wavelen > low_wavelen ? inv / p.factor : inv;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth =
            (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
        out = (1.0 - smooth) * out / p.factor + smooth * out;
      }
      table.inv_freq[i] = static_cast<float>(out);
    }
    return table;
  }
  if (p.rope_type == "yarn") {
    if (p.original_max_position_embeddings <= 0) {
      return absl::InvalidArgumentError("yarn rope needs original_max_position_embeddings");
    }
    const double dim = static_cast<double>(p.rotary_dim);
    double low = std::floor(FindCorrectionDim(p.beta_fast, dim, p.theta,
                                              static_cast<double>(p.original_max_position_embeddings)));
    double high = std::ceil(FindCorrectionDim(p.beta_slow, dim, p.theta,
                                              static_cast<double>(p.original_max_position_embeddings)));
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const float extrapolation = 1.0f / pos_freqs[i];
      const float interpolation = 1.0f / (static_cast<float>(p.factor) * pos_freqs[i]);
      float ramp = static_cast<float>((static_cast<double>(i) - low) / (high - low));
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      const float extrapolation_factor = 1.0f - ramp;
      table.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) +
                          extrapolation * extrapolation_factor;
    }
    if (p.mscale != 0.0 && p.mscale_all_dim != 0.0) {
      table.attention_scaling = static_cast<float>(YarnGetMscale(p.factor, p.mscale) /
                                                   YarnGetMscale(p.factor, p.mscale_all_dim));
    } else {
      table.attention_scaling = static_cast<float>(YarnGetMscale(p.factor, 1.0));
    }
    return table;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported rope_type ", p.rope_type));
}

void RopeCpu(float* x, int64_t num_tokens, int64_t num_heads, int64_t token_stride,
             int64_t head_stride, int64_t offset, const int32_t* positions,
             const RopeTable& table, bool interleave) {
  const int64_t half = static_cast<int64_t>(table.inv_freq.size());
  const int64_t dim = 2 * half;
  const int64_t min_tokens = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, num_heads * dim));
  ParallelFor(num_tokens, min_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
    std::vector<float> tmp(static_cast<size_t>(dim));
    for (int64_t t = begin; t < end; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * table.inv_freq[i];
        cos_v[i] = static_cast<float>(std::cos(static_cast<double>(angle))) *
                   table.attention_scaling;
        sin_v[i] = static_cast<float>(std::sin(static_cast<double>(angle))) *
                   table.attention_scaling;
      }
      for (int64_t h = 0; h < num_heads; ++h) {
        float* v = x + t * token_stride + h * head_stride + offset;
        if (interleave) {
          // (x0,x1),(x2,x3).. → [x0,x2,..,x1,x3,..] (DeepSeek `apply_rotary_pos_emb_interleave`).
          for (int64_t i = 0; i < half; ++i) {
            tmp[i] = v[2 * i];
            tmp[half + i] = v[2 * i + 1];
          }
          std::copy(tmp.begin(), tmp.end(), v);
        }
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i];
          const float x2 = v[i + half];
          v[i] = x1 * cos_v[i] - x2 * sin_v[i];
          v[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
        }
      }
    }
  });
}

}  // namespace sluice::kernels
