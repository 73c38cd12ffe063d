// MoeRouterLogitsCuda / MoeRoutingCuda / MoeExpertsCuda against the CPU references
// (moe_routing.h, moe_experts.h) on fresh random bf16-valued inputs. Needs a GPU: part of
// kernels_cuda_test, skipped without a device (the argument checks run everywhere).
#include "kernels/moe/moe_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/moe/moe_experts.h"
#include "kernels/moe/moe_routing.h"

namespace sluice::kernels {
namespace {

using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

// Two GEMMs with bf16-rounded activations and expert outputs, then a bf16 output.
constexpr double kExpertsRtol = 1.0 / 64;
constexpr double kExpertsAtol = 1.0 / 256;
// Routing weights: fp32 operations in the CPU's order; CUDA's expf may differ by an ulp or two.
constexpr float kWeightRtol = 4e-6f;

struct MoeConfig {
  std::string name;
  MoeRoutingParams routing;
  bool bias;
  int64_t hidden, intermediate;
};

// DeepSeek-V3-like routing (sigmoid, correction bias, 8 groups keep 4, top-8 of 256, scaling
// 2.5) with small expert matrices; V2-Lite-like (softmax, greedy top-6 of 64, no
// normalization) with dims that leave partial tiles in every direction.
// DeepSeek-V3's kind of routing: sigmoid scores, group-limited, normalized and scaled.
MoeRoutingParams GroupedSigmoid(int64_t experts, int64_t top_k, int64_t groups, int64_t keep,
                                float scale) {
  MoeRoutingParams p;
  p.num_experts = experts;
  p.top_k = top_k;
  p.n_group = groups;
  p.topk_group = keep;
  p.scoring = MoeScoring::kSigmoid;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = scale;
  return p;
}

std::vector<MoeConfig> Configs() {
  MoeConfig v3{"deepseek-v3-like", GroupedSigmoid(256, 8, 8, 4, 2.5f), true, 256, 128};
  MoeConfig v2{"v2-lite-like", {}, false, 200, 88};
  v2.routing.num_experts = 64;
  v2.routing.top_k = 6;
  v2.routing.scoring = MoeScoring::kSoftmax;
  v2.routing.norm_topk_prob = false;
  v2.routing.routed_scaling_factor = 1.0f;
  return {v3, v2};
}

constexpr int64_t kTokenCounts[] = {1, 3, 64, 300};

template <typename T>
std::vector<T> DownloadRaw(const DeviceBuffer<T>& buf) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> host(buf.size());
  const absl::Status s = buf.CopyToHost(host.data());
  EXPECT_TRUE(s.ok()) << s;
  return host;
}

// Device buffer of n elements with every byte 0xFF: NaN for floats, -1 for int32.
template <typename T>
DeviceBuffer<T> Poisoned(size_t n) {
  auto buf = DeviceBuffer<T>::Create(n);
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return DeviceBuffer<T>();
  EXPECT_EQ(cudaMemset(buf->data(), 0xFF, buf->bytes()), cudaSuccess);
  return *std::move(buf);
}

std::vector<float> RandomBf16Floats(size_t n, std::mt19937& rng, float lo, float hi) {
  return ToFloat(RandomBf16(n, rng, lo, hi));
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed RouteCpu(const std::vector<float>& logits, const std::vector<float>& bias,
                int64_t num_tokens, const MoeRoutingParams& p) {
  Routed r{std::vector<int32_t>(num_tokens * p.top_k), std::vector<float>(num_tokens * p.top_k)};
  EXPECT_TRUE(MoeRoutingCpu(logits.data(), bias.empty() ? nullptr : bias.data(), num_tokens, p,
                            r.ids.data(), r.weights.data())
                  .ok());
  return r;
}

// Runs MoeRoutingCuda (fp32 logits, and the bf16 overload) and checks it against MoeRoutingCpu:
// ids equal, weights within fp32 rounding.
void CheckRouting(const std::string& tag, const std::vector<float>& logits,
                  const std::vector<float>& bias, int64_t num_tokens, const MoeRoutingParams& p) {
  const Routed want = RouteCpu(logits, bias, num_tokens, p);
  auto d_logits = Upload(logits);
  std::vector<bf16> logits_bf16(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) logits_bf16[i] = FloatToBf16(logits[i]);
  auto d_logits_bf16 = Upload(logits_bf16);
  auto d_bias = Upload(bias);
  for (bool bf16_logits : {false, true}) {
    const size_t n = static_cast<size_t>(num_tokens * p.top_k);
    auto d_ids = Poisoned<int32_t>(n);
    auto d_w = Poisoned<float>(n);
    const float* bias_ptr = bias.empty() ? nullptr : d_bias.data();
    const absl::Status s = bf16_logits ? MoeRoutingCuda(d_logits_bf16.data(), bias_ptr, num_tokens,
                                                        p, d_ids.data(), d_w.data(), nullptr)
                                       : MoeRoutingCuda(d_logits.data(), bias_ptr, num_tokens, p,
                                                        d_ids.data(), d_w.data(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const auto ids = DownloadRaw(d_ids);
    const auto w = DownloadRaw(d_w);
    const std::string what = absl::StrCat(tag, bf16_logits ? " bf16 logits" : " fp32 logits");
    int64_t bad_ids = 0, bad_w = 0;
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] != want.ids[i]) {
        if (bad_ids++ == 0) {
          ADD_FAILURE() << what << ": token " << i / p.top_k << " rank " << i % p.top_k << " id "
                        << ids[i] << ", want " << want.ids[i];
        }
      }
      if (!(std::fabs(w[i] - want.weights[i]) <= kWeightRtol * std::fabs(want.weights[i]))) {
        if (bad_w++ == 0) {
          ADD_FAILURE() << what << ": weight " << i << " = " << w[i] << ", want "
                        << want.weights[i];
        }
      }
    }
    std::printf("[cuda-check] moe routing %s: n=%zu bad_ids=%lld bad_weights=%lld\n", what.c_str(),
                n, static_cast<long long>(bad_ids), static_cast<long long>(bad_w));
  }
}

TEST(MoeRoutingCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  std::vector<MoeConfig> configs = Configs();
  // DeepSeek-V2's group_limited_greedy: 160 experts in 8 groups ranked by their best expert.
  MoeConfig v2_grouped{"v2-grouped-like", {}, false, 200, 88};
  v2_grouped.routing.num_experts = 160;
  v2_grouped.routing.top_k = 6;
  v2_grouped.routing.n_group = 8;
  v2_grouped.routing.topk_group = 3;
  v2_grouped.routing.group_score_max = true;
  v2_grouped.routing.scoring = MoeScoring::kSoftmax;
  v2_grouped.routing.norm_topk_prob = false;
  v2_grouped.routing.routed_scaling_factor = 16.0f;
  configs.push_back(v2_grouped);
  for (const MoeConfig& cfg : configs) {
    const int64_t e = cfg.routing.num_experts;
    // bf16-valued logits: distinct logits give scores far apart, so an ulp of expf never flips
    // an order; equal logits give exact ties on both sides. The bias is a multiple of 1/8: a
    // continuous bias would make s_a + b_a and s_b + b_b agree to an ulp now and then, and
    // expf's last bit (host vs device) would then decide the order.
    std::vector<float> bias;
    std::uniform_int_distribution<int> eighths(-4, 4);
    for (int64_t i = 0; cfg.bias && i < e; ++i) bias.push_back(eighths(rng) / 8.0f);
    for (int64_t t : kTokenCounts) {
      const auto logits = RandomBf16Floats(t * e, rng, -4.0f, 4.0f);
      CheckRouting(absl::StrCat(cfg.name, " T=", t), logits, bias, t, cfg.routing);
    }
  }
}

TEST(MoeRoutingCudaTest, TiesBreakLikeCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  // Logits from {0, 1, 3} and a constant bias: many equal scores and equal group scores, while
  // distinct pair sums stay far apart (with {-1, 0, 1}, s(-1) + s(1) and 2·s(0) would both be
  // 1 up to the last bit of expf, which host and device may round differently).
  const float kValues[] = {0.0f, 1.0f, 3.0f};
  std::uniform_int_distribution<int> pick(0, 2);
  for (const MoeConfig& cfg : Configs()) {
    const int64_t e = cfg.routing.num_experts, t = 64;
    std::vector<float> logits(t * e);
    for (float& v : logits) v = kValues[pick(rng)];
    const std::vector<float> bias = cfg.bias ? std::vector<float>(e, 0.125f) : std::vector<float>();
    CheckRouting(absl::StrCat(cfg.name, " ties"), logits, bias, t, cfg.routing);
  }
}

TEST(MoeRouterLogitsCudaTest, MatchesFp32Dot) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t hidden = 264, experts = 72;
  for (int64_t t : {int64_t{1}, int64_t{9}, int64_t{300}}) {
    const auto x = RandomBf16(t * hidden, rng, -1.0f, 1.0f);
    const auto w = RandomBf16(experts * hidden, rng, -0.1f, 0.1f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    auto d_logits = Poisoned<float>(t * experts);
    ASSERT_TRUE(
        MoeRouterLogitsCuda(d_x.data(), d_w.data(), t, hidden, experts, d_logits.data(), nullptr)
            .ok());
    const auto xf = ToFloat(x), wf = ToFloat(w);
    std::vector<float> want(t * experts);
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t e = 0; e < experts; ++e) {
        double acc = 0;
        for (int64_t h = 0; h < hidden; ++h) acc += double{xf[i * hidden + h]} * wf[e * hidden + h];
        want[i * experts + e] = static_cast<float>(acc);
      }
    }
    ExpectClose(absl::StrCat("moe router logits T=", t), DownloadRaw(d_logits), want, 1e-4, 1e-5);
  }
}

// Weights of one config, bf16-valued: stacked on the device, per expert (float) for the CPU.
struct ExpertWeights {
  std::vector<bf16> gate_up, down;  // [E, 2I, H], [E, H, I]
  std::vector<float> gate_up_f, down_f;
  std::vector<MoeExpertWeights> cpu;
  DeviceBuffer<bf16> d_gate_up, d_down;

  // tiled: each matrix is a random window of one shared pool of random values (model-sized
  // configs: drawing half a billion values would take seconds).
  ExpertWeights(const MoeConfig& cfg, std::mt19937& rng, bool tiled = false) {
    const int64_t e = cfg.routing.num_experts, h = cfg.hidden, i = cfg.intermediate;
    const float a = 1.0f / std::sqrt(static_cast<float>(h));
    const float b = 1.0f / std::sqrt(static_cast<float>(i));
    if (tiled) {
      gate_up = Tiled(e, 2 * i * h, a, rng);
      down = Tiled(e, h * i, b, rng);
    } else {
      gate_up = RandomBf16(e * 2 * i * h, rng, -a, a);
      down = RandomBf16(e * h * i, rng, -b, b);
    }
    gate_up_f = ToFloat(gate_up);
    down_f = ToFloat(down);
    for (int64_t x = 0; x < e; ++x) {
      cpu.push_back({gate_up_f.data() + x * 2 * i * h, down_f.data() + x * h * i});
    }
    d_gate_up = Upload(gate_up);
    d_down = Upload(down);
  }

  static std::vector<bf16> Tiled(int64_t experts, int64_t per_expert, float scale,
                                 std::mt19937& rng) {
    constexpr int64_t kPool = int64_t{1} << 20;
    const auto pool = RandomBf16(2 * kPool, rng, -scale, scale);
    std::uniform_int_distribution<int64_t> start(0, kPool - 1);
    std::vector<bf16> out(experts * per_expert);
    for (int64_t x = 0; x < experts; ++x) {
      for (int64_t at = 0; at < per_expert; at += kPool) {
        const int64_t n = std::min(kPool, per_expert - at);
        std::memcpy(out.data() + x * per_expert + at, pool.data() + start(rng), n * sizeof(bf16));
      }
    }
    return out;
  }
};

const char* PathName(MoeExpertsPath p) {
  switch (p) {
    case MoeExpertsPath::kGemv:
      return "gemv";
    case MoeExpertsPath::kGrouped:
      return "grouped";
    default:
      return "auto";
  }
}

// Runs MoeExpertsCuda into a NaN-filled output and returns it (widened to float). The ids and
// weights start `id_offset` elements into their buffers (a slice of a larger batch).
std::vector<float> RunExpertsCuda(const MoeConfig& cfg, const ExpertWeights& w,
                                  const std::vector<bf16>& x, const Routed& routed, int64_t t,
                                  MoeExpertsPath path, int64_t id_offset = 0) {
  const int64_t e = cfg.routing.num_experts, k = cfg.routing.top_k;
  auto d_x = Upload(x);
  std::vector<int32_t> ids(id_offset, 0);
  ids.insert(ids.end(), routed.ids.begin(), routed.ids.end());
  std::vector<float> weights(id_offset, 0.0f);
  weights.insert(weights.end(), routed.weights.begin(), routed.weights.end());
  auto d_ids = Upload(ids);
  auto d_w = Upload(weights);
  auto d_out = NanBuffer(static_cast<size_t>(t * cfg.hidden));
  const size_t ws_bytes = MoeCudaWorkspaceBytes(t, k, e, cfg.hidden, cfg.intermediate);
  auto d_ws = Poisoned<uint8_t>(ws_bytes);
  const absl::Status s =
      MoeExpertsCuda(d_x.data(), d_ids.data() + id_offset, d_w.data() + id_offset, t, cfg.hidden,
                     cfg.intermediate, k, e, w.d_gate_up.data(), w.d_down.data(), d_out.data(),
                     MoeCudaWorkspace{d_ws.data(), ws_bytes}, nullptr, path);
  EXPECT_TRUE(s.ok()) << s;
  return cuda_test::Download(d_out);
}

std::vector<float> RunExpertsCpu(const MoeConfig& cfg, const ExpertWeights& w,
                                 const std::vector<bf16>& x, const Routed& routed, int64_t t) {
  const auto xf = ToFloat(x);
  std::vector<float> out(t * cfg.hidden);
  MoeWorkspace ws;
  EXPECT_TRUE(MoeExpertsCpu(xf.data(), t, cfg.hidden, cfg.intermediate, routed.ids.data(),
                            routed.weights.data(), cfg.routing.top_k, w.cpu, out.data(), ws)
                  .ok());
  return out;
}

constexpr MoeExpertsPath kPaths[] = {MoeExpertsPath::kAuto, MoeExpertsPath::kGemv,
                                     MoeExpertsPath::kGrouped};
// Token counts for the experts: kAuto picks the GEMV path for 1 and 3, the grouped GEMM
// otherwise (a few rows per expert at 16 and 64, many at 300).
constexpr int64_t kExpertTokenCounts[] = {1, 3, 16, 64, 128, 300};

TEST(MoeExpertsCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const MoeConfig& cfg : Configs()) {
    const ExpertWeights w(cfg, rng);
    const int64_t e = cfg.routing.num_experts;
    const auto bias = cfg.bias ? RandomBf16Floats(e, rng, -0.5f, 0.5f) : std::vector<float>();
    for (int64_t t : kExpertTokenCounts) {
      const auto x = RandomBf16(t * cfg.hidden, rng, -1.0f, 1.0f);
      const auto logits = RandomBf16Floats(t * e, rng, -4.0f, 4.0f);
      const Routed routed = RouteCpu(logits, bias, t, cfg.routing);
      const auto want = RunExpertsCpu(cfg, w, x, routed, t);
      for (MoeExpertsPath path : kPaths) {
        ExpectClose(absl::StrCat("moe experts ", cfg.name, " T=", t, " ", PathName(path)),
                    RunExpertsCuda(cfg, w, x, routed, t, path), want, kExpertsRtol, kExpertsAtol);
      }
    }
  }
}

// Skewed routing: one expert takes every token (more rows than a GEMM tile, a GEMV pass and a
// streaming pass), most experts get none, and two rows carry ids outside [0, E), which must
// contribute nothing. Also checks batch invariance: token 0 alone gives the same bits as inside
// the batch (which also runs the GEMV path with 1 row per pass against 8, and the streaming
// path with 1 row against 2 passes of 64 and 6).
TEST(MoeExpertsCudaTest, SkewedRoutingEmptyExpertsAndInvalidIds) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const MoeConfig cfg = Configs()[1];
  const ExpertWeights w(cfg, rng);
  const int64_t t = 70, k = cfg.routing.top_k, e = cfg.routing.num_experts;
  const auto x = RandomBf16(t * cfg.hidden, rng, -1.0f, 1.0f);
  Routed routed{std::vector<int32_t>(t * k), RandomBf16Floats(t * k, rng, 0.05f, 0.5f)};
  for (int64_t i = 0; i < t; ++i) {
    routed.ids[i * k] = 5;
    for (int64_t j = 1; j < k; ++j)
      routed.ids[i * k + j] = static_cast<int32_t>(16 + (i + 7 * j) % 16);
  }
  Routed gpu_routed = routed;
  gpu_routed.ids[3 * k + 1] = static_cast<int32_t>(e);
  gpu_routed.ids[4 * k + 2] = -1;
  // The CPU reference rejects such ids: give it a valid id with weight 0 instead.
  routed.weights[3 * k + 1] = 0.0f;
  routed.weights[4 * k + 2] = 0.0f;
  const auto want = RunExpertsCpu(cfg, w, x, routed, t);
  const std::vector<bf16> x0(x.begin(), x.begin() + cfg.hidden);
  const Routed routed0{
      std::vector<int32_t>(gpu_routed.ids.begin(), gpu_routed.ids.begin() + k),
      std::vector<float>(gpu_routed.weights.begin(), gpu_routed.weights.begin() + k)};
  for (MoeExpertsPath path : {MoeExpertsPath::kGemv, MoeExpertsPath::kGrouped}) {
    // ids and weights one element into their buffers: natural alignment suffices.
    const auto got = RunExpertsCuda(cfg, w, x, gpu_routed, t, path, /*id_offset=*/1);
    ExpectClose(absl::StrCat("moe experts skewed ", PathName(path)), got, want, kExpertsRtol,
                kExpertsAtol);
    const auto alone = RunExpertsCuda(cfg, w, x0, routed0, 1, path);
    for (int64_t h = 0; h < cfg.hidden; ++h) {
      ASSERT_EQ(alone[h], got[h]) << PathName(path) << ": token 0 differs alone, column " << h;
    }
  }
}

// Runs `run` (enqueues on `stream`, writing n bf16 outputs) directly, then captured in a CUDA
// graph replayed twice, and expects the same bits (no host synchronization or allocation
// inside the calls; state left in workspaces does not leak into the next replay).
template <typename Run>
void ExpectGraphReplayEqualsDirect(const std::string& what, cudaStream_t stream, int64_t n,
                                   Run&& run) {
  auto direct = NanBuffer(n);
  run(direct.data());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  auto replayed = NanBuffer(n);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  run(replayed.data());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ExpectClose(what, cuda_test::Download(replayed), cuda_test::Download(direct), 0.0, 0.0);
}

// Routing + experts captured in a CUDA graph and replayed give the direct calls' bits (no host
// synchronization or allocation inside the calls).
TEST(MoeExpertsCudaTest, CapturesInCudaGraph) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const MoeConfig cfg = Configs()[0];
  const ExpertWeights w(cfg, rng);
  const int64_t t = 4, k = cfg.routing.top_k, e = cfg.routing.num_experts;
  auto d_x = Upload(RandomBf16(t * cfg.hidden, rng, -1.0f, 1.0f));
  auto d_logits = Upload(RandomBf16Floats(t * e, rng, -4.0f, 4.0f));
  auto d_bias = Upload(RandomBf16Floats(e, rng, -0.5f, 0.5f));
  auto d_ids = Poisoned<int32_t>(t * k);
  auto d_w = Poisoned<float>(t * k);
  const size_t ws_bytes = MoeCudaWorkspaceBytes(t, k, e, cfg.hidden, cfg.intermediate);
  auto d_ws = Poisoned<uint8_t>(ws_bytes);
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto run = [&](bf16* out) {
    EXPECT_TRUE(MoeRoutingCuda(d_logits.data(), d_bias.data(), t, cfg.routing, d_ids.data(),
                               d_w.data(), stream->get())
                    .ok());
    EXPECT_TRUE(MoeExpertsCuda(d_x.data(), d_ids.data(), d_w.data(), t, cfg.hidden,
                               cfg.intermediate, k, e, w.d_gate_up.data(), w.d_down.data(), out,
                               MoeCudaWorkspace{d_ws.data(), ws_bytes}, stream->get())
                    .ok());
  };
  ExpectGraphReplayEqualsDirect("moe graph replay vs direct", stream->get(), t * cfg.hidden,
                                run);
}

// Argument errors are found on the host from sizes and pointers alone (no device needed; the
// fake pointers are never dereferenced).
TEST(MoeCudaArgsTest, BadArgumentsAreInvalidArgument) {
  bf16* p = reinterpret_cast<bf16*>(uintptr_t{1} << 20);
  int32_t* ids = reinterpret_cast<int32_t*>(uintptr_t{2} << 20);
  float* wts = reinterpret_cast<float*>(uintptr_t{3} << 20);
  const int64_t t = 4, h = 64, i = 32, k = 2, e = 8;
  const size_t ws_bytes = MoeCudaWorkspaceBytes(t, k, e, h, i);
  ASSERT_GT(ws_bytes, 0u);
  const MoeCudaWorkspace ws{reinterpret_cast<void*>(uintptr_t{4} << 20), ws_bytes};
  auto experts = [&](const bf16* x, int64_t tt, int64_t hh, int64_t ii, int64_t kk, int64_t ee,
                     MoeCudaWorkspace w) {
    return MoeExpertsCuda(x, ids, wts, tt, hh, ii, kk, ee, p, p, p, w, nullptr).code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(experts(p, -1, h, i, k, e, ws), kInvalid);
  EXPECT_EQ(experts(p, t, 60, i, k, e, ws), kInvalid);     // hidden % 8
  EXPECT_EQ(experts(p, t, h, 0, k, e, ws), kInvalid);      // intermediate
  EXPECT_EQ(experts(p, t, h, i, 0, e, ws), kInvalid);      // top_k
  EXPECT_EQ(experts(p, t, h, i, e + 1, e, ws), kInvalid);  // top_k > experts
  EXPECT_EQ(experts(p, t, h, i, k, kMoeCudaMaxExperts + 1, ws), kInvalid);
  EXPECT_EQ(experts(nullptr, t, h, i, k, e, ws), kInvalid);
  EXPECT_EQ(experts(p + 1, t, h, i, k, e, ws), kInvalid);  // misaligned x
  EXPECT_EQ(MoeExpertsCuda(p, nullptr, wts, t, h, i, k, e, p, p, p, ws, nullptr).code(), kInvalid);
  EXPECT_EQ(experts(p, t, h, i, k, e, MoeCudaWorkspace{ws.data, ws_bytes - 1}), kInvalid);
  EXPECT_EQ(experts(p, t, h, i, k, e, MoeCudaWorkspace{nullptr, ws_bytes}), kInvalid);
  EXPECT_EQ(experts(p, 0, h, i, k, e, ws), absl::StatusCode::kOk);  // enqueues nothing
  EXPECT_GT(MoeCudaWorkspaceBytes(2 * t, k, e, h, i), ws_bytes);
  EXPECT_EQ(MoeCudaWorkspaceBytes(0, k, e, h, i), 0u);

  MoeRoutingParams r;
  r.num_experts = 64;
  r.top_k = 6;
  auto route = [&](const MoeRoutingParams& params, int64_t tt) {
    return MoeRoutingCuda(wts, nullptr, tt, params, ids, wts, nullptr).code();
  };
  EXPECT_EQ(route(r, 0), absl::StatusCode::kOk);
  EXPECT_EQ(route(r, -1), kInvalid);
  MoeRoutingParams bad = r;
  bad.n_group = 3;  // does not divide 64
  EXPECT_EQ(route(bad, t), kInvalid);
  bad = r;
  bad.top_k = 65;
  EXPECT_EQ(route(bad, t), kInvalid);
  bad = r;
  bad.num_experts = kMoeCudaMaxExperts * 2;
  EXPECT_EQ(route(bad, t), kInvalid);
  EXPECT_EQ(
      MoeRoutingCuda(static_cast<const float*>(nullptr), nullptr, t, r, ids, wts, nullptr).code(),
      kInvalid);

  EXPECT_EQ(MoeRouterLogitsCuda(p, p, t, 60, e, wts, nullptr).code(), kInvalid);
  EXPECT_EQ(MoeRouterLogitsCuda(p, p, t, h, 0, wts, nullptr).code(), kInvalid);
  EXPECT_EQ(MoeRouterLogitsCuda(p + 1, p, t, h, e, wts, nullptr).code(), kInvalid);
}

// ---- Fused decode path (MoeFusedRouteCuda + MoeFusedExpertsCuda).

// The separate path's results for one batch: routing, GEMV experts.
struct SeparateRun {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<float> out;
};

// Inputs of one fused-path case: tokens x, the router matrix and the correction bias.
struct FusedCase {
  std::vector<bf16> x, w_gate;
  std::vector<float> bias;
  DeviceBuffer<bf16> d_x, d_w_gate;
  DeviceBuffer<float> d_bias;

  FusedCase(const MoeConfig& cfg, int64_t t, std::mt19937& rng) {
    const int64_t e = cfg.routing.num_experts;
    x = RandomBf16(t * cfg.hidden, rng, -1.0f, 1.0f);
    // Router rows scaled so that logits spread over a few units (distinct scores).
    const float a = 4.0f / std::sqrt(static_cast<float>(cfg.hidden));
    w_gate = RandomBf16(e * cfg.hidden, rng, -a, a);
    std::uniform_int_distribution<int> eighths(-4, 4);
    for (int64_t i = 0; cfg.bias && i < e; ++i) bias.push_back(eighths(rng) / 8.0f);
    d_x = Upload(x);
    d_w_gate = Upload(w_gate);
    d_bias = Upload(bias.empty() ? std::vector<float>{0.0f} : bias);
  }
  const float* bias_ptr() const { return bias.empty() ? nullptr : d_bias.data(); }
};

SeparateRun RunSeparate(const MoeConfig& cfg, const ExpertWeights& w, const FusedCase& c,
                        int64_t t) {
  const int64_t e = cfg.routing.num_experts, k = cfg.routing.top_k;
  auto d_logits = Poisoned<float>(t * e);
  auto d_ids = Poisoned<int32_t>(t * k);
  auto d_w = Poisoned<float>(t * k);
  auto d_out = NanBuffer(static_cast<size_t>(t * cfg.hidden));
  const size_t ws_bytes = MoeCudaWorkspaceBytes(t, k, e, cfg.hidden, cfg.intermediate);
  auto d_ws = Poisoned<uint8_t>(ws_bytes);
  EXPECT_TRUE(MoeRouterLogitsCuda(c.d_x.data(), c.d_w_gate.data(), t, cfg.hidden, e,
                                  d_logits.data(), nullptr)
                  .ok());
  EXPECT_TRUE(MoeRoutingCuda(static_cast<const float*>(d_logits.data()), c.bias_ptr(), t,
                             cfg.routing, d_ids.data(), d_w.data(), nullptr)
                  .ok());
  EXPECT_TRUE(MoeExpertsCuda(c.d_x.data(), d_ids.data(), d_w.data(), t, cfg.hidden,
                             cfg.intermediate, k, e, w.d_gate_up.data(), w.d_down.data(),
                             d_out.data(), MoeCudaWorkspace{d_ws.data(), ws_bytes}, nullptr,
                             MoeExpertsPath::kGemv)
                  .ok());
  return {DownloadRaw(d_ids), DownloadRaw(d_w), cuda_test::Download(d_out)};
}

struct FusedRun {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<float> out;
};

// Runs the fused path (route, then experts; `add` [t, hidden] or empty) on `stream`, `calls`
// times on the same workspace with every output (and the shared activations) poisoned before
// each call. With a shared expert: route_shared, the route computes its activations (act_ready
// for the experts, as the runner does); else the experts' gate/up launch computes them.
FusedRun RunFused(const MoeConfig& cfg, const ExpertWeights& w, const FusedCase& c, int64_t t,
                  const std::vector<bf16>& add, cudaStream_t stream = nullptr,
                  const MoeSharedExpert* shared = nullptr, int calls = 1,
                  bool route_shared_act = true) {
  const int64_t e = cfg.routing.num_experts, k = cfg.routing.top_k;
  auto d_ids = Poisoned<int32_t>(t * k);
  auto d_w = Poisoned<float>(t * k);
  auto d_add = Upload(add.empty() ? std::vector<bf16>(8) : add);
  auto d_out = NanBuffer(static_cast<size_t>(t * cfg.hidden));
  const size_t ws_bytes = MoeCudaWorkspaceBytes(t, k, e, cfg.hidden, cfg.intermediate);
  auto d_ws = Poisoned<uint8_t>(ws_bytes);
  const MoeCudaWorkspace ws{d_ws.data(), ws_bytes};
  const bool route_shared = route_shared_act && shared != nullptr;
  MoeSharedExpert experts_shared = shared != nullptr ? *shared : MoeSharedExpert{};
  experts_shared.act_ready = route_shared;
  for (int call = 0; call < calls; ++call) {
    EXPECT_EQ(cudaMemsetAsync(d_ids.data(), 0xFF, d_ids.bytes(), stream), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(d_w.data(), 0xFF, d_w.bytes(), stream), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(d_out.data(), 0xFF, d_out.bytes(), stream), cudaSuccess);
    if (shared != nullptr) {
      EXPECT_EQ(cudaMemsetAsync(shared->act, 0xFF, t * shared->intermediate * sizeof(bf16),
                                stream),
                cudaSuccess);
    }
    const absl::Status route = MoeFusedRouteCuda(
        c.d_x.data(), c.d_w_gate.data(), c.bias_ptr(), t, cfg.hidden, cfg.routing, d_ids.data(),
        d_w.data(), ws, stream, route_shared ? shared : nullptr);
    EXPECT_TRUE(route.ok()) << route;
    const absl::Status experts = MoeFusedExpertsCuda(
        c.d_x.data(), d_w.data(), t, cfg.hidden, cfg.intermediate, k, e, w.d_gate_up.data(),
        w.d_down.data(), add.empty() ? nullptr : d_add.data(), d_out.data(), ws, stream,
        shared != nullptr ? &experts_shared : nullptr);
    EXPECT_TRUE(experts.ok()) << experts;
  }
  return {DownloadRaw(d_ids), DownloadRaw(d_w), cuda_test::Download(d_out)};
}

template <typename T>
int64_t CountBitDiffs(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) ++bad;
  }
  return bad;
}

// Ids, weights and outputs of two runs (FusedRun / SeparateRun) equal bit for bit.
template <typename A, typename B>
void ExpectSameBits(const std::string& what, const A& got, const B& want) {
  const int64_t bad_ids = CountBitDiffs(got.ids, want.ids);
  const int64_t bad_w = CountBitDiffs(got.weights, want.weights);
  const int64_t bad_out = CountBitDiffs(got.out, want.out);
  std::printf("[cuda-check] %s: bad_ids=%lld bad_weights=%lld bad_out=%lld\n", what.c_str(),
              static_cast<long long>(bad_ids), static_cast<long long>(bad_w),
              static_cast<long long>(bad_out));
  EXPECT_EQ(bad_ids, 0) << what;
  EXPECT_EQ(bad_w, 0) << what;
  EXPECT_EQ(bad_out, 0) << what;
}

// The fused path gives the separate path's ids, weights and outputs bit for bit (so the CPU
// references' results within the separate path's tolerances; the experts are also checked
// directly); with a shared-expert addend, bf16(add + routed) as AddInPlaceCuda computes it.
TEST(MoeFusedDecodeCudaTest, MatchesSeparatePathBitForBitAndCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const MoeConfig& cfg : Configs()) {
    const ExpertWeights w(cfg, rng);
    for (int64_t t : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, kMoeFusedMaxTokens}) {
      ASSERT_TRUE(MoeFusedDecodeSupported(t, cfg.routing)) << cfg.name << " T=" << t;
      const std::string tag = absl::StrCat("moe fused ", cfg.name, " T=", t);
      const FusedCase c(cfg, t, rng);
      const SeparateRun want = RunSeparate(cfg, w, c, t);
      const FusedRun got = RunFused(cfg, w, c, t, {});
      ExpectSameBits(tag + " vs separate", got, want);
      // The experts against the CPU reference for the same routing (routing against the CPU:
      // the separate path's tests; fp32 logits here may tie to an ulp of expf).
      ExpectClose(tag + " vs cpu", got.out,
                  RunExpertsCpu(cfg, w, c.x, Routed{got.ids, got.weights}, t), kExpertsRtol,
                  kExpertsAtol);
      // Shared-expert addend folded into the combine.
      const auto add = RandomBf16(t * cfg.hidden, rng, -1.0f, 1.0f);
      const FusedRun with_add = RunFused(cfg, w, c, t, add);
      std::vector<float> want_add(want.out.size());
      for (size_t i = 0; i < want_add.size(); ++i) {
        want_add[i] = Bf16ToFloat(FloatToBf16(Bf16ToFloat(add[i]) + want.out[i]));
      }
      EXPECT_EQ(CountBitDiffs(with_add.out, want_add), 0) << tag << " with add";
    }
  }
}

// A shared expert's weights (gate/up [2·si, h], down [h, si]), bf16-valued.
struct SharedWeights {
  std::vector<float> gate_up_f, down_f;
  DeviceBuffer<bf16> d_gate_up, d_down;

  SharedWeights(int64_t h, int64_t si, std::mt19937& rng) {
    const float a = 1.0f / std::sqrt(static_cast<float>(h));
    const float b = 1.0f / std::sqrt(static_cast<float>(si));
    const auto gate_up = RandomBf16(2 * si * h, rng, -a, a);
    const auto down = RandomBf16(h * si, rng, -b, b);
    gate_up_f = ToFloat(gate_up);
    down_f = ToFloat(down);
    d_gate_up = Upload(gate_up);
    d_down = Upload(down);
  }
};

// bf16(s[t] + routed[t]) for the shared SwiGLU s of gate/up sgu_f [2·si, h] and down sd_f
// [h, si] in fp64 (activations and s rounded to bf16, as the kernels do); x [t, h].
std::vector<float> SharedPlusRouted(const std::vector<bf16>& x, const std::vector<float>& sgu_f,
                                    const std::vector<float>& sd_f, int64_t h, int64_t si,
                                    int64_t t, const std::vector<float>& routed) {
  const auto xf = ToFloat(x);
  std::vector<float> want(t * h);
  std::vector<float> act(si);
  for (int64_t r = 0; r < t; ++r) {
    const float* xr = xf.data() + r * h;
    for (int64_t j = 0; j < si; ++j) {
      double g = 0, u = 0;
      for (int64_t q = 0; q < h; ++q) {
        g += double{xr[q]} * sgu_f[j * h + q];
        u += double{xr[q]} * sgu_f[(si + j) * h + q];
      }
      act[j] = Bf16ToFloat(FloatToBf16(static_cast<float>(g / (1.0 + std::exp(-g)) * u)));
    }
    for (int64_t o = 0; o < h; ++o) {
      double d = 0;
      for (int64_t j = 0; j < si; ++j) d += double{act[j]} * sd_f[o * si + j];
      const float s_bf = Bf16ToFloat(FloatToBf16(static_cast<float>(d)));
      want[r * h + o] = Bf16ToFloat(FloatToBf16(s_bf + routed[r * h + o]));
    }
  }
  return want;
}

// A shared expert folded into the fused launches: bf16(shared + routed), the shared SwiGLU
// against a host fp64 reference (activations rounded to bf16, as the kernels do).
TEST(MoeFusedDecodeCudaTest, SharedExpertFolded) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const MoeConfig cfg = Configs()[1];
  const ExpertWeights w(cfg, rng);
  const int64_t h = cfg.hidden, si = 2 * cfg.intermediate;  // two shared experts' width
  const SharedWeights sw(h, si, rng);
  const auto &sgu_f = sw.gate_up_f, &sd_f = sw.down_f;
  const auto &d_sgu = sw.d_gate_up, &d_sd = sw.d_down;
  for (int64_t t : {int64_t{1}, int64_t{3}, kMoeFusedMaxTokens}) {
    const std::string tag = absl::StrCat("moe fused shared expert T=", t);
    const FusedCase c(cfg, t, rng);
    const SeparateRun routed = RunSeparate(cfg, w, c, t);
    auto d_act = NanBuffer(static_cast<size_t>(t * si));
    const MoeSharedExpert shared{d_sgu.data(), d_sd.data(), si, d_act.data()};
    const FusedRun got = RunFused(cfg, w, c, t, {}, nullptr, &shared);
    EXPECT_EQ(CountBitDiffs(got.ids, routed.ids), 0) << tag;
    ExpectClose(tag, got.out, SharedPlusRouted(c.x, sgu_f, sd_f, h, si, t, routed.out),
                kExpertsRtol, kExpertsAtol);
  }
}

// Route + experts captured in a CUDA graph and replayed give the direct calls' bits.
TEST(MoeFusedDecodeCudaTest, CapturesInCudaGraph) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const MoeConfig cfg = Configs()[1];
  const ExpertWeights w(cfg, rng);
  const int64_t t = 1, k = cfg.routing.top_k, e = cfg.routing.num_experts;
  const FusedCase c(cfg, t, rng);
  auto d_ids = Poisoned<int32_t>(t * k);
  auto d_w = Poisoned<float>(t * k);
  const size_t ws_bytes = MoeCudaWorkspaceBytes(t, k, e, cfg.hidden, cfg.intermediate);
  auto d_ws = Poisoned<uint8_t>(ws_bytes);
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  // The route launch's arrival counter, the persistent gate/up grid and the programmatic
  // launches (sm_90+) replayed from a graph.
  auto run = [&](bf16* out) {
    const MoeCudaWorkspace ws{d_ws.data(), ws_bytes};
    EXPECT_TRUE(MoeFusedRouteCuda(c.d_x.data(), c.d_w_gate.data(), c.bias_ptr(), t, cfg.hidden,
                                  cfg.routing, d_ids.data(), d_w.data(), ws, stream->get())
                    .ok());
    EXPECT_TRUE(MoeFusedExpertsCuda(c.d_x.data(), d_w.data(), t, cfg.hidden, cfg.intermediate, k,
                                    e, w.d_gate_up.data(), w.d_down.data(), nullptr, out, ws,
                                    stream->get())
                    .ok());
  };
  ExpectGraphReplayEqualsDirect("moe fused graph replay vs direct", stream->get(),
                                t * cfg.hidden, run);
}

// ---- More fused-path shapes: routing over many blocks against the CPU reference.

// Configs(), DeepSeek-V2-Lite's own MoE shapes (64 experts, softmax top-6, hidden 2048, moe
// intermediate 1408) and a small odd one (24 experts in 4 groups keep 2, sigmoid top-3 with a
// bias, hidden 136: a partial weight chunk, intermediate 40).
std::vector<MoeConfig> MultiBlockConfigs() {
  std::vector<MoeConfig> cfgs = Configs();
  cfgs.push_back(MoeConfig{"v2-lite-shapes", cfgs[1].routing, false, 2048, 1408});
  cfgs.push_back(MoeConfig{"odd", GroupedSigmoid(24, 3, 4, 2, 1.5f), true, 136, 40});
  return cfgs;
}

// MoeRoutingCpu on the device's fp32 router logits (MoeRouterLogitsCuda: the fused kernels'
// sums bit for bit).
Routed RouteDeviceLogitsOnCpu(const MoeConfig& cfg, const FusedCase& c, int64_t t,
                              std::vector<float>* logits) {
  const int64_t e = cfg.routing.num_experts;
  auto d_logits = Poisoned<float>(t * e);
  EXPECT_TRUE(MoeRouterLogitsCuda(c.d_x.data(), c.d_w_gate.data(), t, cfg.hidden, e,
                                  d_logits.data(), nullptr)
                  .ok());
  *logits = DownloadRaw(d_logits);
  return RouteCpu(*logits, c.bias, t, cfg.routing);
}

// Expert e's selection score (softmax or sigmoid, + bias) from one token's logits, in fp64:
// tells a near tie, which the last bit of expf (host vs device) may decide either way, from a
// real difference.
double ChoiceScore(const float* logits, const MoeConfig& cfg, const std::vector<float>& bias,
                   int64_t e) {
  double score = 0;
  if (cfg.routing.scoring == MoeScoring::kSigmoid) {
    score = 1.0 / (1.0 + std::exp(-double{logits[e]}));
  } else {
    const int64_t n = cfg.routing.num_experts;
    const double max = *std::max_element(logits, logits + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - max);
    score = std::exp(logits[e] - max) / sum;
  }
  return score + (bias.empty() ? 0.0 : bias[e]);
}

// The ids and weights of a fused run against MoeRoutingCpu on the device's fp32 router logits:
// ids equal, except where the two experts' scores agree to ~1e-6 (a near tie that the last
// bit of expf decides; exact ties must break alike); weights (where ids agree) within fp32
// rounding.
void ExpectRoutingMatchesCpu(const std::string& tag, const MoeConfig& cfg, const FusedCase& c,
                             int64_t t, const FusedRun& got) {
  const int64_t k = cfg.routing.top_k;
  std::vector<float> logits;
  const Routed want = RouteDeviceLogitsOnCpu(cfg, c, t, &logits);
  int64_t cpu_bad_ids = 0, cpu_bad_w = 0, near_ties = 0;
  const int64_t e = cfg.routing.num_experts;
  for (int64_t i = 0; i < t * k; ++i) {
    if (got.ids[i] != want.ids[i]) {
      const float* row = logits.data() + (i / k) * e;
      const bool valid = got.ids[i] >= 0 && got.ids[i] < e;
      const double a = valid ? ChoiceScore(row, cfg, c.bias, got.ids[i]) : -1e9;
      const double b = ChoiceScore(row, cfg, c.bias, want.ids[i]);
      if (valid && a != b && std::fabs(a - b) <= 1e-6 * (1.0 + std::fabs(b))) {
        ++near_ties;
      } else {
        ++cpu_bad_ids;
      }
      continue;
    }
    if (!(std::fabs(got.weights[i] - want.weights[i]) <=
          kWeightRtol * std::fabs(want.weights[i]))) {
      ++cpu_bad_w;
    }
  }
  std::printf("[cuda-check] %s vs cpu routing: bad_ids=%lld bad_weights=%lld near_ties=%lld\n",
              tag.c_str(), static_cast<long long>(cpu_bad_ids), static_cast<long long>(cpu_bad_w),
              static_cast<long long>(near_ties));
  EXPECT_EQ(cpu_bad_ids, 0) << tag;
  EXPECT_EQ(cpu_bad_w, 0) << tag;
}

// Near ties: the router keeps only E / 4 distinct rows, each at four random positions, so
// many logits, scores and group scores are exactly equal (the lower index must win).
void DuplicateRouterRows(const MoeConfig& cfg, FusedCase& c, std::mt19937& rng) {
  const int64_t e = cfg.routing.num_experts, h = cfg.hidden;
  std::vector<int64_t> order(e);
  for (int64_t i = 0; i < e; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  const std::vector<bf16> src = c.w_gate;
  for (int64_t i = 0; i < e; ++i) {
    std::memcpy(c.w_gate.data() + order[i] * h, src.data() + order[i % (e / 4)] * h,
                h * sizeof(bf16));
  }
  c.d_w_gate = Upload(c.w_gate);
}

// The fused route called twice in a row on one workspace (the arrival counter is back at 0
// after each launch; every output is poisoned before each call) gives the same bits both times
// and the separate path's (MoeRouterLogitsCuda → MoeRoutingCuda → MoeExpertsCuda kGemv); its ids
// equal MoeRoutingCpu's and its weights agree to fp32 rounding; the experts agree with the CPU
// reference. With a shared expert, the output is the same whether the route launch or the
// experts' gate/up launch computes the shared activations, and equals the fp64 reference within
// bf16.
TEST(MoeFusedDecodeCudaTest, RouteMatchesSeparatePathAndCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const MoeConfig& cfg : MultiBlockConfigs()) {
    const ExpertWeights w(cfg, rng, /*tiled=*/cfg.hidden >= 1024);
    const int64_t h = cfg.hidden, si = 2 * cfg.intermediate;
    const SharedWeights sw(h, si, rng);
    const auto &sgu_f = sw.gate_up_f, &sd_f = sw.down_f;
    const auto &d_sgu = sw.d_gate_up, &d_sd = sw.d_down;
    for (int64_t t : {int64_t{1}, int64_t{4}, kMoeFusedMaxTokens}) {
      for (bool ties : {false, true}) {
        const std::string tag =
            absl::StrCat("moe fused route ", cfg.name, " T=", t, ties ? " ties" : "");
        FusedCase c(cfg, t, rng);
        if (ties) DuplicateRouterRows(cfg, c, rng);
        const SeparateRun separate = RunSeparate(cfg, w, c, t);
        const FusedRun got = RunFused(cfg, w, c, t, {}, nullptr, nullptr, /*calls=*/2);
        ExpectSameBits(tag + " vs separate", got, separate);
        ExpectRoutingMatchesCpu(tag, cfg, c, t, got);
        ExpectClose(tag + " experts vs cpu", got.out,
                    RunExpertsCpu(cfg, w, c.x, Routed{got.ids, got.weights}, t), kExpertsRtol,
                    kExpertsAtol);

        auto d_act = NanBuffer(static_cast<size_t>(t * si));
        const MoeSharedExpert shared{d_sgu.data(), d_sd.data(), si, d_act.data()};
        const FusedRun got_sh = RunFused(cfg, w, c, t, {}, nullptr, &shared, /*calls=*/2);
        const FusedRun experts_sh = RunFused(cfg, w, c, t, {}, nullptr, &shared, /*calls=*/1,
                                             /*route_shared_act=*/false);
        EXPECT_EQ(CountBitDiffs(got_sh.ids, got.ids), 0) << tag << " shared";
        EXPECT_EQ(CountBitDiffs(experts_sh.out, got_sh.out), 0)
            << tag << " shared activations from the experts' launch";
        ExpectClose(tag + " shared vs fp64", got_sh.out,
                    SharedPlusRouted(c.x, sgu_f, sd_f, h, si, t, got.out), kExpertsRtol,
                    kExpertsAtol);
      }
    }
  }
}

// ---- The `pdl` of MoeFusedRouteCuda / MoeFusedExpertsCuda (decode PDL level 3): every
// fused-path launch a programmatic dependent of the one before.

// kLayers chained MoE "layers" on one stream, no host or memset node between them: layer l
// routes and runs the experts on x_l (x_0 = c's tokens) into x_{l+1} (the shared expert folded
// when `shared`; act scratch shared by the layers, as the runner's). So each layer's route
// launch reads what the previous layer's down launch wrote, and overwrites the sort, logits and
// shared activations that launch read: under PDL the waits must order them. Returns the last
// layer's output; direct calls, or (graph) a capture replayed twice.
constexpr int kPdlLayers = 3;
std::vector<float> RunChain(const MoeConfig& cfg, const ExpertWeights& w, const FusedCase& c,
                            int64_t t, const MoeSharedExpert* shared, cudaStream_t stream,
                            bool graph, bool pdl) {
  const int64_t e = cfg.routing.num_experts, k = cfg.routing.top_k;
  auto d_ids = Poisoned<int32_t>(t * k);
  auto d_w = Poisoned<float>(t * k);
  std::vector<DeviceBuffer<bf16>> xs;
  for (int l = 0; l < kPdlLayers; ++l) xs.push_back(NanBuffer(static_cast<size_t>(t * cfg.hidden)));
  const size_t ws_bytes = MoeCudaWorkspaceBytes(t, k, e, cfg.hidden, cfg.intermediate);
  auto d_ws = Poisoned<uint8_t>(ws_bytes);
  const MoeCudaWorkspace ws{d_ws.data(), ws_bytes};
  const bool route_shared = shared != nullptr;
  MoeSharedExpert experts_shared = shared != nullptr ? *shared : MoeSharedExpert{};
  experts_shared.act_ready = route_shared;
  auto run = [&] {
    const bf16* x = c.d_x.data();
    for (int l = 0; l < kPdlLayers; ++l) {
      EXPECT_TRUE(MoeFusedRouteCuda(x, c.d_w_gate.data(), c.bias_ptr(), t, cfg.hidden,
                                    cfg.routing, d_ids.data(), d_w.data(), ws, stream,
                                    route_shared ? shared : nullptr, pdl)
                      .ok());
      EXPECT_TRUE(MoeFusedExpertsCuda(x, d_w.data(), t, cfg.hidden, cfg.intermediate, k, e,
                                      w.d_gate_up.data(), w.d_down.data(), nullptr,
                                      xs[l].data(), ws, stream,
                                      shared != nullptr ? &experts_shared : nullptr, pdl)
                      .ok());
      x = xs[l].data();
    }
  };
  if (!graph) {
    run();
  } else {
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    run();
    EXPECT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    for (int rep = 0; rep < 2; ++rep) EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return cuda_test::Download(xs.back());
}

// With pdl (the route launch, too, a programmatic dependent) the chained fused path gives the
// bits of the launches without it, with and without a folded shared expert, directly
// and replayed from a graph (the serial launches themselves are checked against the CPU
// references above).
TEST(MoeFusedDecodeCudaTest, DecodePdlMatchesSerialLaunches) {
  SLUICE_SKIP_WITHOUT_CUDA();
  if (!PdlSupported()) GTEST_SKIP() << "no griddepcontrol below sm_90";
  auto rng = cuda_test::Rng();
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (const MoeConfig& cfg : MultiBlockConfigs()) {
    const ExpertWeights w(cfg, rng, /*tiled=*/cfg.hidden >= 1024);
    const int64_t h = cfg.hidden, si = 2 * cfg.intermediate;
    const SharedWeights sw(h, si, rng);
    for (int64_t t : {int64_t{1}, int64_t{3}, kMoeFusedMaxTokens}) {
      const FusedCase c(cfg, t, rng);
      auto d_act = NanBuffer(static_cast<size_t>(t * si));
      const MoeSharedExpert shared{sw.d_gate_up.data(), sw.d_down.data(), si, d_act.data()};
      for (bool with_shared : {false, true}) {
        const std::string tag =
            absl::StrCat("moe decode pdl ", cfg.name, " T=", t, with_shared ? " shared" : "");
        const MoeSharedExpert* sh = with_shared ? &shared : nullptr;
        const auto want = RunChain(cfg, w, c, t, sh, stream->get(), false, false);
        const auto got = RunChain(cfg, w, c, t, sh, stream->get(), false, true);
        const auto got_graph = RunChain(cfg, w, c, t, sh, stream->get(), true, true);
        int64_t nan = 0;
        for (float v : want) nan += std::isnan(v) ? 1 : 0;
        EXPECT_EQ(nan, 0) << tag;  // the chain wrote every output
        const int64_t bad = CountBitDiffs(got, want);
        const int64_t bad_graph = CountBitDiffs(got_graph, want);
        std::printf("[cuda-check] %s: bad=%lld bad_graph=%lld\n", tag.c_str(),
                    static_cast<long long>(bad), static_cast<long long>(bad_graph));
        EXPECT_EQ(bad, 0) << tag;
        EXPECT_EQ(bad_graph, 0) << tag;
      }
    }
  }
}

// The fused path's bounds (host-side checks, no device needed).
TEST(MoeCudaArgsTest, FusedDecodeArguments) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;

  const MoeRoutingParams v2 = Configs()[1].routing;  // top-6 of 64
  EXPECT_TRUE(MoeFusedDecodeSupported(1, v2));
  EXPECT_TRUE(MoeFusedDecodeSupported(kMoeFusedMaxTokens, v2));
  EXPECT_FALSE(MoeFusedDecodeSupported(0, v2));
  EXPECT_FALSE(MoeFusedDecodeSupported(kMoeFusedMaxTokens + 1, v2));
  MoeRoutingParams wide = v2;
  wide.num_experts = 1024;  // 8 tokens · 3 · 1024 floats of shared memory: too much
  EXPECT_TRUE(MoeFusedDecodeSupported(1, wide));
  EXPECT_FALSE(MoeFusedDecodeSupported(8, wide));
  MoeRoutingParams many = v2;
  many.top_k = 16;  // 8 · 16 rows > kMoeFusedMaxRows
  EXPECT_FALSE(MoeFusedDecodeSupported(8, many));

  bf16* p = reinterpret_cast<bf16*>(uintptr_t{1} << 20);
  int32_t* ids = reinterpret_cast<int32_t*>(uintptr_t{2} << 20);
  float* wts = reinterpret_cast<float*>(uintptr_t{3} << 20);
  const int64_t h = 64, i = 32;
  const size_t ws_bytes = MoeCudaWorkspaceBytes(2, v2.top_k, v2.num_experts, h, i);
  const MoeCudaWorkspace ws{reinterpret_cast<void*>(uintptr_t{4} << 20), ws_bytes};
  auto route = [&](int64_t t, int64_t hh, const bf16* x, MoeCudaWorkspace w) {
    return MoeFusedRouteCuda(x, p, nullptr, t, hh, v2, ids, wts, w, nullptr).code();
  };
  EXPECT_EQ(route(0, h, p, ws), kInvalid);
  EXPECT_EQ(route(kMoeFusedMaxTokens + 1, h, p, ws), kInvalid);
  EXPECT_EQ(route(2, 60, p, ws), kInvalid);      // hidden % 8
  EXPECT_EQ(route(2, h, p + 1, ws), kInvalid);   // misaligned x
  EXPECT_EQ(route(2, h, nullptr, ws), kInvalid);
  EXPECT_EQ(route(2, h, p, MoeCudaWorkspace{ws.data, 16}), kInvalid);
  MoeRoutingParams bad = v2;
  bad.n_group = 3;
  EXPECT_EQ(MoeFusedRouteCuda(p, p, nullptr, 2, h, bad, ids, wts, ws, nullptr).code(), kInvalid);
  auto experts = [&](int64_t t, int64_t k, const bf16* out, MoeCudaWorkspace w) {
    return MoeFusedExpertsCuda(p, wts, t, h, i, k, v2.num_experts, p, p, nullptr,
                               const_cast<bf16*>(out), w, nullptr)
        .code();
  };
  EXPECT_EQ(experts(0, v2.top_k, p, ws), kInvalid);
  EXPECT_EQ(experts(kMoeFusedMaxTokens + 1, v2.top_k, p, ws), kInvalid);
  EXPECT_EQ(experts(8, 9, p, ws), kInvalid);  // 72 rows > kMoeFusedMaxRows
  EXPECT_EQ(experts(2, v2.top_k, p + 1, ws), kInvalid);
  EXPECT_EQ(experts(2, v2.top_k, p, MoeCudaWorkspace{ws.data, ws_bytes - 1}), kInvalid);
  const MoeSharedExpert bad_shared{p, p, 60, p};  // intermediate % 8
  EXPECT_EQ(MoeFusedExpertsCuda(p, wts, 2, h, i, v2.top_k, v2.num_experts, p, p, nullptr, p, ws,
                                nullptr, &bad_shared)
                .code(),
            kInvalid);
  // A shared expert with bad sizes is rejected by the route too.
  EXPECT_EQ(MoeFusedRouteCuda(p, p, nullptr, 2, h, v2, ids, wts, ws, nullptr, &bad_shared).code(),
            kInvalid);
  const MoeSharedExpert null_act{p, p, 64, nullptr};
  EXPECT_EQ(MoeFusedExpertsCuda(p, wts, 2, h, i, v2.top_k, v2.num_experts, p, p, nullptr, p, ws,
                                nullptr, &null_act)
                .code(),
            kInvalid);
}

}  // namespace
}  // namespace sluice::kernels
