// Wider cuBLASLt algorithm search and two-part N splits for LinearCuda's autotuner
// (gemm_algo_search.h). Host code only.
#include "kernels/linear/gemm_algo_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice::kernels {
namespace {

// Output tiles (rows along cuBLAS's M = our n, columns along our m) that EnumerateAlgos sweeps:
// the cublasLtMatmulTile_t ids whose names (cublasLt.h, CUDA 13.0) give both sides in
// 64..256 and multiples of 32. Smaller tiles cannot fill an SM at m >= 64; odd sizes are left
// to the heuristic.
struct TileDims {
  uint32_t id;
  int rows, cols;
};
constexpr TileDims kTiles[] = {
    {15, 64, 64},    {17, 64, 128},   {18, 128, 64},   {19, 64, 256},   {20, 128, 128},
    {21, 256, 64},   {23, 128, 256},  {24, 256, 128},  {26, 64, 96},    {27, 96, 64},
    {28, 96, 128},   {29, 128, 160},  {30, 160, 128},  {31, 192, 128},  {32, 128, 192},
    {33, 128, 96},   {116, 64, 192},  {151, 96, 192},  {152, 96, 256},  {193, 160, 64},
    {194, 160, 192}, {195, 160, 256}, {208, 192, 64},  {209, 192, 192}, {210, 192, 256},
    {220, 224, 64},  {221, 224, 128}, {222, 224, 192}, {232, 256, 192}, {326, 64, 160},
    {333, 64, 224},  {414, 128, 224}, {458, 192, 96},  {465, 192, 160}, {472, 192, 224},
    {495, 256, 96},  {502, 256, 160}, {509, 256, 224}, {513, 256, 256}};

const TileDims* FindTile(uint32_t id) {
  for (const TileDims& t : kTiles) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

template <typename T>
bool GetConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr,
               T* value) {
  size_t written = 0;
  return cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, value, sizeof(T), &written) ==
         CUBLAS_STATUS_SUCCESS;
}

template <typename T>
bool SetConfig(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, T value) {
  return cublasLtMatmulAlgoConfigSetAttribute(algo, attr, &value, sizeof(T)) ==
         CUBLAS_STATUS_SUCCESS;
}

// A capability that is a list of uint32_t ids (tiles, stages); empty when not reported.
std::vector<uint32_t> CapIds(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) !=
          CUBLAS_STATUS_SUCCESS ||
      bytes == 0) {
    return {};
  }
  std::vector<uint32_t> ids(bytes / sizeof(uint32_t));
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), ids.size() * sizeof(uint32_t),
                                        &written) != CUBLAS_STATUS_SUCCESS) {
    return {};
  }
  ids.resize(written / sizeof(uint32_t));
  return ids;
}

template <typename T>
T CapValue(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr, T fallback) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return fallback;
  }
  return v;
}

bool SameAlgo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

}  // namespace

absl::StatusOr<int> ParseGemmAlgoSearchMask(absl::string_view text) {
  int mask = 0;
  if (!absl::SimpleAtoi(text, &mask) || mask < 0 ||
      mask > (kGemmSearchAlgos | kGemmSearchSplitN | kGemmSearchStreams)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a GEMM algorithm search mask 0..7 expected, got \"", text, "\""));
  }
  return mask;
}

namespace gemm_search {

absl::Status EnumerateAlgos(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                            cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                            cublasLtMatrixLayout_t c, size_t workspace_bytes, int max_new,
                            std::vector<cublasLtMatmulAlgo_t>* out) {
  if (max_new <= 0) return absl::OkStatus();
  int ids[256];
  int count = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F,
                                                    CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                                                    CUDA_R_16BF, 256, ids, &count);
  if (s != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cublasLtMatmulAlgoGetIds: ", cublasLtGetStatusName(s)));
  }
  struct Found {
    cublasLtMatmulAlgo_t algo;
    float efficiency;  // waves / ceil(waves): how full the last wave is
    int area;          // tile rows x columns: larger tiles reuse operands more
  };
  auto better = [](const Found& x, const Found& y) {
    return x.efficiency != y.efficiency ? x.efficiency > y.efficiency : x.area > y.area;
  };
  // Grouped by (algo id, tile) so that a cap keeps every kernel family's best configurations
  // (round robin below) rather than many split/swizzle variants of one.
  std::map<std::pair<int, uint32_t>, std::vector<Found>> groups;
  auto check = [&](cublasLtMatmulAlgo_t* algo, float* eff) {
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(handle, op, a, b, c, c, algo, &r) != CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > workspace_bytes || r.wavesCount <= 0.0f) {
      return false;
    }
    *eff = r.wavesCount / std::ceil(r.wavesCount);
    return true;
  };
  for (int i = 0; i < count; ++i) {
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                               CUDA_R_16BF, CUDA_R_16BF, ids[i], &base) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    const std::vector<uint32_t> tiles = CapIds(base, CUBLASLT_ALGO_CAP_TILE_IDS);
    const std::vector<uint32_t> stages = CapIds(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    const int32_t splitk_ok = CapValue<int32_t>(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, 0);
    const uint32_t reductions =
        CapValue<uint32_t>(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, 0);
    const uint32_t swizzle_ok = CapValue<uint32_t>(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, 0);
    // Custom options (kernel-specific variants): the first few only, to bound the sweep.
    const int32_t custom_max =
        std::clamp(CapValue<int32_t>(base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, 0), 0, 2);
    // Split-K only with an fp32 reduction in the workspace (COMPUTE_TYPE), so the sum is still
    // rounded to bf16 once, as with split-K 1.
    const bool splitk = splitk_ok != 0 && (reductions & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) != 0;
    for (uint32_t tile : tiles) {
      const TileDims* dims = FindTile(tile);
      if (dims == nullptr) continue;
      for (int32_t sk = 1; sk <= (splitk ? 4 : 1); ++sk) {
        for (uint32_t sw = 0; sw <= (swizzle_ok != 0 ? 1u : 0u); ++sw) {
         for (uint32_t custom = 0; custom <= static_cast<uint32_t>(custom_max); ++custom) {
          cublasLtMatmulAlgo_t algo = base;
          SetConfig<uint32_t>(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom);
          SetConfig<uint32_t>(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, tile);
          SetConfig<int32_t>(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sk);
          SetConfig<uint32_t>(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                              sk > 1 ? static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
                                     : static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE));
          SetConfig<uint32_t>(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, sw);
          SetConfig<uint32_t>(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                              static_cast<uint32_t>(CUBLASLT_MATMUL_STAGES_UNDEFINED));
          SetConfig<uint16_t>(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                              static_cast<uint16_t>(CUBLASLT_CLUSTER_SHAPE_AUTO));
          float eff = 0.0f;
          bool ok = check(&algo, &eff);
          if (!ok) {
            // Automatic cluster rejected: a 1x1x1 cluster; automatic stages rejected: the
            // deepest listed stage count that passes.
            SetConfig<uint16_t>(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                static_cast<uint16_t>(CUBLASLT_CLUSTER_SHAPE_1x1x1));
            ok = check(&algo, &eff);
          }
          int tried = 0;
          for (auto it = stages.rbegin(); !ok && it != stages.rend() && tried < 2; ++it) {
            if (*it == CUBLASLT_MATMUL_STAGES_UNDEFINED) continue;
            ++tried;
            SetConfig<uint32_t>(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, *it);
            SetConfig<uint16_t>(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                static_cast<uint16_t>(CUBLASLT_CLUSTER_SHAPE_AUTO));
            ok = check(&algo, &eff);
            if (!ok) {
              SetConfig<uint16_t>(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                  static_cast<uint16_t>(CUBLASLT_CLUSTER_SHAPE_1x1x1));
              ok = check(&algo, &eff);
            }
          }
          if (ok) groups[{ids[i], tile}].push_back({algo, eff, dims->rows * dims->cols});
         }
        }
      }
    }
  }
  for (auto& [key, list] : groups) std::stable_sort(list.begin(), list.end(), better);
  // Round r takes every group's r-th best, best first across groups.
  int added = 0;
  for (size_t round = 0; added < max_new; ++round) {
    std::vector<Found> this_round;
    for (const auto& [key, list] : groups) {
      if (round < list.size()) this_round.push_back(list[round]);
    }
    if (this_round.empty()) break;
    std::stable_sort(this_round.begin(), this_round.end(), better);
    for (const Found& f : this_round) {
      if (added >= max_new) break;
      if (std::none_of(out->begin(), out->end(),
                       [&](const cublasLtMatmulAlgo_t& o) { return SameAlgo(o, f.algo); })) {
        out->push_back(f.algo);
        ++added;
      }
    }
  }
  return absl::OkStatus();
}

std::string DescribeAlgo(const cublasLtMatmulAlgo_t& algo) {
  int32_t id = -1, splitk = 1;
  uint32_t tile = 0, stages = 0, swizzle = 0, custom = 0;
  uint16_t cluster = 0;
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_ID, &id);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster);
  const TileDims* t = FindTile(tile);
  const std::string tile_s =
      t != nullptr ? absl::StrCat(t->rows, "x", t->cols) : absl::StrCat("#", tile);
  return absl::StrCat("algo ", id, " tile ", tile_s, " stages ", stages, " splitK ", splitk,
                      " swizzle ", swizzle, " cluster ", cluster, " custom ", custom);
}

SplitResources::~SplitResources() {
  if (join != nullptr) cudaEventDestroy(join);
  if (fork != nullptr) cudaEventDestroy(fork);
  if (side != nullptr) cudaStreamDestroy(side);
}

// One row range [n0, n0 + rows) of W: its own descriptors (the bias pointer lives in the
// operation descriptor, offset by n0) and algorithm.
struct SplitGemm::Part {
  int64_t n0 = 0, rows = 0;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  float us = -1.0f;
  ~Part() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

SplitGemm::~SplitGemm() = default;

absl::StatusOr<std::unique_ptr<SplitGemm>> SplitGemm::Make(int64_t m, int64_t n, int64_t k,
                                                           int64_t n1, bool has_bias) {
  if (n1 <= 0 || n1 >= n || n1 % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("SplitGemm: bad split ", n1, " of n=", n));
  }
  std::unique_ptr<SplitGemm> g(new SplitGemm());
  g->m_ = m;
  g->n_ = n;
  g->k_ = k;
  g->n1_ = n1;
  g->has_bias_ = has_bias;
  for (int i = 0; i < 2; ++i) {
    auto part = std::make_unique<Part>();
    part->n0 = i == 0 ? 0 : n1;
    part->rows = i == 0 ? n1 : n - n1;
    bool ok = cublasLtMatmulDescCreate(&part->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
              CUBLAS_STATUS_SUCCESS;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    ok = ok && cublasLtMatmulDescSetAttribute(part->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                              sizeof(ta)) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(part->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                              sizeof(tb)) == CUBLAS_STATUS_SUCCESS;
    if (has_bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = CUDA_R_16BF;
      ok = ok && cublasLtMatmulDescSetAttribute(part->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                &epilogue, sizeof(epilogue)) ==
                     CUBLAS_STATUS_SUCCESS;
      ok = ok && cublasLtMatmulDescSetAttribute(part->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)) ==
                     CUBLAS_STATUS_SUCCESS;
    }
    // Same column-major view as LinearCuda's plan: A = W rows as k x rows (ld k), op T;
    // B = x as k x m; C = yᵀ as rows x m with y's full leading dimension n.
    ok = ok && cublasLtMatrixLayoutCreate(&part->a, CUDA_R_16BF, k, part->rows, k) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&part->b, CUDA_R_16BF, k, m, k) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&part->c, CUDA_R_16BF, part->rows, m, n) ==
                   CUBLAS_STATUS_SUCCESS;
    if (!ok) return absl::InternalError("SplitGemm: cuBLASLt descriptor setup failed");
    g->parts_[i] = std::move(part);
  }
  return g;
}

cublasStatus_t SplitGemm::RunPart(cublasLtHandle_t handle, Part& p,
                                  const cublasLtMatmulAlgo_t& algo, const bf16* x, const bf16* w,
                                  const bf16* bias, bf16* y, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream) {
  if (has_bias_) {
    const bf16* b = bias + p.n0;
    const cublasStatus_t s =
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b));
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  const float alpha = 1.0f, beta = 0.0f;
  bf16* yp = y + p.n0;
  return cublasLtMatmul(handle, p.op, &alpha, w + p.n0 * k_, p.a, x, p.b, &beta, yp, p.c, yp,
                        p.c, &algo, workspace, workspace_bytes, stream);
}

float SplitGemm::Tune(cublasLtHandle_t handle, const bf16* x, const bf16* w, const bf16* bias,
                      bf16* y, void* workspace, size_t workspace_bytes, SplitResources* res,
                      cudaStream_t stream, int heuristic, int enumerated, const TimeFn& time,
                      const std::function<bool()>& finish) {
  for (auto& part : parts_) {
    Part& p = *part;
    std::vector<cublasLtMatmulAlgo_t> cands;
    cublasLtMatmulPreference_t pref = nullptr;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
      const uint64_t ws = workspace_bytes;
      const uint32_t aw = Alignment(w + p.n0 * k_), ax = Alignment(x), ay = Alignment(y + p.n0);
      bool ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &ws, sizeof(ws)) == CUBLAS_STATUS_SUCCESS;
      const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, aw},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, ax},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, ay},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, ay}};
      for (const auto& [attr, v] : aligns) {
        ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)) ==
                       CUBLAS_STATUS_SUCCESS;
      }
      cublasLtMatmulHeuristicResult_t results[64];
      int count = 0;
      if (ok && cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref,
                                               std::clamp(heuristic, 1, 64), results,
                                               &count) == CUBLAS_STATUS_SUCCESS) {
        for (int i = 0; i < count; ++i) {
          if (results[i].state == CUBLAS_STATUS_SUCCESS) cands.push_back(results[i].algo);
        }
      }
      cublasLtMatmulPreferenceDestroy(pref);
    }
    (void)EnumerateAlgos(handle, p.op, p.a, p.b, p.c, workspace_bytes, enumerated, &cands);
    p.us = -1.0f;
    for (const cublasLtMatmulAlgo_t& algo : cands) {
      const float us = time([&] {
        return RunPart(handle, p, algo, x, w, bias, y, workspace, workspace_bytes, stream) ==
               CUBLAS_STATUS_SUCCESS;
      });
      if (us >= 0.0f && (p.us < 0.0f || us < p.us)) {
        p.us = us;
        p.algo = algo;
      }
    }
    if (p.us < 0.0f) return -1.0f;
  }
  two_streams_ = false;
  serial_us_ = time([&] {
    return Run(handle, x, w, bias, y, workspace, workspace_bytes, res, stream) ==
               CUBLAS_STATUS_SUCCESS &&
           (!finish || finish());
  });
  streams_us_ = -1.0f;
  if (res != nullptr && res->side != nullptr && res->workspace.size() > 0) {
    two_streams_ = true;
    streams_us_ = time([&] {
      return Run(handle, x, w, bias, y, workspace, workspace_bytes, res, stream) ==
                 CUBLAS_STATUS_SUCCESS &&
             (!finish || finish());
    });
    two_streams_ = streams_us_ >= 0.0f && (serial_us_ < 0.0f || streams_us_ < serial_us_);
  }
  if (serial_us_ < 0.0f && streams_us_ < 0.0f) return -1.0f;
  return two_streams_ ? streams_us_ : serial_us_;
}

absl::Status SplitGemm::Restore(cublasLtHandle_t handle, const cublasLtMatmulAlgo_t& part0,
                               const cublasLtMatmulAlgo_t& part1, bool two_streams,
                               size_t workspace_bytes) {
  const cublasLtMatmulAlgo_t* algos[2] = {&part0, &part1};
  for (int i = 0; i < 2; ++i) {
    Part& p = *parts_[i];
    if (!CheckAlgo(handle, p.op, p.a, p.b, p.c, *algos[i], workspace_bytes)) {
      return absl::FailedPreconditionError(
          absl::StrCat("SplitGemm: cuBLASLt rejects the saved algorithm of part ", i));
    }
    p.algo = *algos[i];
    p.us = -1.0f;
  }
  two_streams_ = two_streams;
  return absl::OkStatus();
}

const cublasLtMatmulAlgo_t& SplitGemm::part_algo(int i) const { return parts_[i]->algo; }

cublasStatus_t SplitGemm::Run(cublasLtHandle_t handle, const bf16* x, const bf16* w,
                              const bf16* bias, bf16* y, void* workspace, size_t workspace_bytes,
                              SplitResources* res, cudaStream_t stream) {
  if (!two_streams_ || res == nullptr) {
    cublasStatus_t s = RunPart(handle, *parts_[0], parts_[0]->algo, x, w, bias, y, workspace,
                               workspace_bytes, stream);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    return RunPart(handle, *parts_[1], parts_[1]->algo, x, w, bias, y, workspace,
                   workspace_bytes, stream);
  }
  // Fork: the second part on the side stream (its own workspace) after everything queued on
  // `stream`; join: `stream` waits for it. Event record/wait pairs are captured as graph edges.
  if (cudaEventRecord(res->fork, stream) != cudaSuccess ||
      cudaStreamWaitEvent(res->side, res->fork, 0) != cudaSuccess) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const cublasStatus_t s1 = RunPart(handle, *parts_[1], parts_[1]->algo, x, w, bias, y,
                                    res->workspace.data(), res->workspace.bytes(), res->side);
  const cublasStatus_t s0 = RunPart(handle, *parts_[0], parts_[0]->algo, x, w, bias, y,
                                    workspace, workspace_bytes, stream);
  // Join even after a failure so that a capture is never left with a dangling fork.
  const bool joined = cudaEventRecord(res->join, res->side) == cudaSuccess &&
                      cudaStreamWaitEvent(stream, res->join, 0) == cudaSuccess;
  if (s1 != CUBLAS_STATUS_SUCCESS) return s1;
  if (s0 != CUBLAS_STATUS_SUCCESS) return s0;
  return joined ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

std::string SplitGemm::Describe() const {
  return absl::StrCat("split n1=", n1_, two_streams_ ? " 2 streams" : " serial", " (serial ",
                      absl::StrFormat("%.1f", serial_us_), " us, 2 streams ",
                      absl::StrFormat("%.1f", streams_us_), " us) [", DescribeAlgo(parts_[0]->algo),
                      absl::StrFormat(" %.1f us", parts_[0]->us), " | ",
                      DescribeAlgo(parts_[1]->algo), absl::StrFormat(" %.1f us", parts_[1]->us),
                      "]");
}

std::vector<int64_t> SplitPoints(int64_t m, int64_t n, int sms, int max_points) {
  struct Point {
    int64_t waves, area, n1;
  };
  std::vector<Point> points;
  for (int64_t tile_n : {64, 96, 128, 160, 192, 224, 256}) {
    for (int64_t tile_m : {64, 128, 256}) {
      const int64_t m_tiles = (m + tile_m - 1) / tile_m;
      if (sms % m_tiles != 0) continue;  // a wave must hold whole columns of tiles
      const int64_t wave_rows = tile_n * (sms / m_tiles);
      for (int64_t waves = 1; waves <= 3 && waves * wave_rows < n; ++waves) {
        const int64_t n1 = waves * wave_rows;
        if (n1 >= n / 8 && n1 <= n - n / 8 && n1 % 16 == 0) {
          points.push_back({waves, tile_n * tile_m, n1});
        }
      }
    }
  }
  // Fewest waves first (the first part is one full wave when possible), then larger tiles.
  std::stable_sort(points.begin(), points.end(), [](const Point& x, const Point& y) {
    return x.waves != y.waves ? x.waves < y.waves : x.area > y.area;
  });
  std::vector<int64_t> kept;
  for (const Point& p : points) {
    if (static_cast<int>(kept.size()) >= max_points) break;
    if (std::find(kept.begin(), kept.end(), p.n1) == kept.end()) kept.push_back(p.n1);
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

SplitResources* EnsureSplitResources(std::unique_ptr<SplitResources>* res,
                                     size_t workspace_bytes) {
  if (*res == nullptr) {
    auto made = std::make_unique<SplitResources>();
    auto ws = DeviceBuffer<uint8_t>::Create(workspace_bytes);
    if (ws.ok() && cudaStreamCreateWithFlags(&made->side, cudaStreamNonBlocking) == cudaSuccess &&
        cudaEventCreateWithFlags(&made->fork, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventCreateWithFlags(&made->join, cudaEventDisableTiming) == cudaSuccess) {
      made->workspace = *std::move(ws);
      *res = std::move(made);
    }
    (void)cudaGetLastError();
  }
  return res->get();
}

bool CheckAlgo(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
               cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, const cublasLtMatmulAlgo_t& algo,
               size_t workspace_bytes) {
  cublasLtMatmulHeuristicResult_t r{};
  return cublasLtMatmulAlgoCheck(handle, op, a, b, c, c, &algo, &r) == CUBLAS_STATUS_SUCCESS &&
         r.workspaceSize <= workspace_bytes;
}

std::unique_ptr<SplitGemm> TuneBestSplit(cublasLtHandle_t handle, int64_t m, int64_t n,
                                         int64_t k, const bf16* x, const bf16* w,
                                         const bf16* bias, bf16* y, void* workspace,
                                         size_t workspace_bytes,
                                         std::unique_ptr<SplitResources>* res,
                                         cudaStream_t stream, int mask, int heuristic,
                                         const TimeFn& time, const std::function<bool()>& finish,
                                         float* best_us) {
  if ((mask & kGemmSearchSplitN) == 0 || m < kGemmSearchMinRows) return nullptr;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms <= 0) {
    return nullptr;
  }
  SplitResources* r =
      (mask & kGemmSearchStreams) != 0 ? EnsureSplitResources(res, workspace_bytes) : nullptr;
  const int enumerated = (mask & kGemmSearchAlgos) != 0 ? kMaxEnumeratedPerPart : 0;
  std::unique_ptr<SplitGemm> best;
  for (int64_t n1 : SplitPoints(m, n, sms, kMaxSplitPoints)) {
    auto split = SplitGemm::Make(m, n, k, n1, bias != nullptr);
    if (!split.ok()) continue;
    const float us = (*split)->Tune(handle, x, w, bias, y, workspace, workspace_bytes, r, stream,
                                    heuristic, enumerated, time, finish);
    if (us >= 0.0f && (*best_us < 0.0f || us < *best_us)) {
      *best_us = us;
      best = *std::move(split);
    }
  }
  return best;
}

}  // namespace gemm_search
}  // namespace sluice::kernels
