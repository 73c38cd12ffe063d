// GemmTuningTable: LinearCuda's autotuner choices kept across processes, per GPU model.
//
// The autotuner (CublasLt::set_autotune) times candidate kernels for every decode-bucket GEMM
// shape when a runner captures its graphs: about a second for an 8B model with the default
// candidates, ~30 s with the wider search (LinearOptions::algo_search), which at Llama-3-8B
// batch 256 on an H200 is what brings decode within 1.3× of the roofline. A table holds the
// winners, so a process that finds its shape there skips the timing and runs the same kernel
// (also during stream capture). This is the practice of vLLM's per-GPU fused-MoE configs
// (`configs/E=..,device_name=NVIDIA_H200.json`) and Triton's autotune cache, applied to
// cuBLASLt: its docs state that a cublasLtMatmulAlgo_t "can be trivially serialized and later
// restored for use with the same version of cuBLAS library".
//
// File format (JSON; one file per GPU model, GemmTuningFileName):
//   {"format": "sluice-gemm-tuning-v1", "device": "NVIDIA H200", "compute_capability": 90,
//    "sms": 132, "cublaslt_version": 130000,
//    "entries": [{"m": 256, "n": 6144, "k": 4096, "bias": false, "glu": false,
//                 "align": [x, w, y, bias], "search": 3, "us": 24.1, "kind": "cublaslt",
//                 "algo": "<8 words of 16 hex digits, space-separated>",
//                 "describe": "..."}, ...]}
// kind "gemv": "gemv_unroll", "gemv_split"; kind "skinny" (SkinnyGemmCuda): "skinny_split",
// "skinny_stages"; kind "split": "n1", "two_streams",
// "algo_parts": [two algo strings]. "describe" is for people and ignored when read.
// This file is host-only and CUDA-free, so CI tests it without a GPU; the CUDA side
// (linear.cu: LoadGemmTuning / SaveGemmTuning) applies it.
#ifndef SLUICE_KERNELS_LINEAR_GEMM_TUNING_TABLE_H_
#define SLUICE_KERNELS_LINEAR_GEMM_TUNING_TABLE_H_

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::kernels {

// The shape a choice was tuned for: LinearCuda's plan key (m, n, k, bias, operand alignments in
// bytes: the largest power of two ≤ 256 dividing each pointer) plus whether the SiLU·mul
// epilogue was timed with it (LinearSiluMulCuda), which changes the winner.
struct GemmTuningKey {
  int64_t m = 0, n = 0, k = 0;
  bool bias = false;
  uint32_t align_x = 256, align_w = 256, align_y = 256, align_bias = 256;
  bool glu = false;

  auto Tie() const { return std::tie(m, n, k, bias, align_x, align_w, align_y, align_bias, glu); }
  friend bool operator==(const GemmTuningKey& a, const GemmTuningKey& b) {
    return a.Tie() == b.Tie();
  }
  friend bool operator<(const GemmTuningKey& a, const GemmTuningKey& b) { return a.Tie() < b.Tie(); }
  template <typename H>
  friend H AbslHashValue(H h, const GemmTuningKey& key) {
    return H::combine(std::move(h), key.m, key.n, key.k, key.bias, key.align_x, key.align_w,
                      key.align_y, key.align_bias, key.glu);
  }
};

// The bytes of one cublasLtMatmulAlgo_t (its `uint64_t data[8]`).
using CublasLtAlgoWords = std::array<uint64_t, 8>;

// What the autotuner picked for a key.
struct GemmTuningChoice {
  enum class Kind { kCublasLt, kGemv, kSplit, kSkinny };
  Kind kind = Kind::kCublasLt;
  CublasLtAlgoWords algo{};  // kCublasLt
  int gemv_unroll = 0;       // kGemv: GemvCuda's (unroll, split)
  int gemv_split = 0;
  int skinny_split = 0;      // kSkinny: SkinnyGemmCuda's (split, stages)
  int skinny_stages = 0;
  int64_t split_n1 = 0;                   // kSplit: gemm_search::SplitGemm at n1,
  bool split_two_streams = false;         // its parts on two streams or serial,
  std::array<CublasLtAlgoWords, 2> split_algos{};  // and each part's algorithm
  float us = 0.0f;      // the winner's tuned time, microseconds (informational)
  int search_mask = 0;  // LinearOptions::algo_search when it was tuned
  std::string describe;  // human-readable (DescribeAlgo / plan line); not parsed back
};

// The GPU and library a table was tuned on. Entries of another device never apply; cuBLASLt
// choices (kinds kCublasLt and kSplit) apply only with the same cublaslt_version.
struct GemmTuningDevice {
  std::string name;            // cudaDeviceProp::name, e.g. "NVIDIA H200"
  int compute_capability = 0;  // 10 · major + minor
  int sms = 0;                 // multiprocessor count
  int cublaslt_version = 0;    // cublasLtGetVersion()
};

class GemmTuningTable {
 public:
  GemmTuningTable() = default;
  explicit GemmTuningTable(GemmTuningDevice device) : device_(std::move(device)) {}

  // Parse reads the JSON format above. Errors: InvalidArgument naming the first bad field
  // (not JSON, wrong "format", a missing or mistyped field, an algo string that is not 8
  // hex words, an unknown kind, non-positive shapes, alignments that are not powers of two
  // ≤ 256, a split n1 outside (0, n)).
  static absl::StatusOr<GemmTuningTable> Parse(absl::string_view json);
  // Serialize writes the format above, entries sorted by key (stable diffs).
  std::string Serialize() const;

  const GemmTuningDevice& device() const { return device_; }
  // Applies: entries of this table may be used on `device` (same name, compute capability and
  // SM count). CublasLtApplies: its cuBLASLt choices too (also the same cublaslt_version).
  bool Applies(const GemmTuningDevice& device) const;
  bool CublasLtApplies(const GemmTuningDevice& device) const;

  // Find: the choice for `key` tuned with at least the search bits of `search_mask`
  // ((choice.search_mask & search_mask) == search_mask), else nullptr.
  const GemmTuningChoice* Find(const GemmTuningKey& key, int search_mask) const;
  // Insert adds or replaces the choice for `key`.
  void Insert(const GemmTuningKey& key, GemmTuningChoice choice);
  size_t size() const { return entries_.size(); }
  const absl::flat_hash_map<GemmTuningKey, GemmTuningChoice>& entries() const { return entries_; }

 private:
  GemmTuningDevice device_;
  absl::flat_hash_map<GemmTuningKey, GemmTuningChoice> entries_;
};

// GemmTuningFileName: the file a directory of tables holds for `device_name`: the name with
// every character outside [A-Za-z0-9._-] replaced by '_', plus ".json"
// ("NVIDIA H200" → "NVIDIA_H200.json").
std::string GemmTuningFileName(absl::string_view device_name);

// FormatAlgoWords / ParseAlgoWords: the "algo" string form (8 space-separated 16-digit hex
// words). ParseAlgoWords errors: InvalidArgument.
std::string FormatAlgoWords(const CublasLtAlgoWords& words);
absl::StatusOr<CublasLtAlgoWords> ParseAlgoWords(absl::string_view text);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LINEAR_GEMM_TUNING_TABLE_H_
