// SampleRowsCuda (sampling_cuda.h): one CTA per row, for bf16 or fp32 logits.
//
// Every ordering question is answered by a radix select over 64-bit composite keys that are
// unique per token, so there are no ties to resolve and no sort:
//  - rank order (x descending, lower id first): comp = key16(raw) << idbits | (idmask - id),
//    where key16 orders the raw bf16 values: x = raw / T is monotone in raw and, as distinct
//    bf16 values are >= 2^-8 apart relatively while fp32 keeps 2^-24, distinct raw values give
//    distinct x (for |x| < FLT_MAX), so ranking raw is ranking x, ties (equal x) included;
//  - ascending-id order (the draw without top_k/top_p): comp = idmask - id.
// fp32 rows (processed logits: penalties make values no bf16 holds) rank by key32(x) instead,
// x = raw / T as the CPU computes it, so equal x tie to the lower id as on the CPU.
// comp is shifted left so that its width is a multiple of the 8-bit digit (vocab 152k: 34
// bits → 5 passes of a rank select, 18 → 3 of an id select).
// A select finds the member c* with M(comp > c*) < G <= M(comp >= c*), where M sums a metric
// (1 for top_k; the probability in fixed point for top_p and the draw) and G is derived
// from the members' total: top_k → k, top_p → ceil(top_p · total), draw → floor(u · total) + 1
// (the first member whose cumulative mass exceeds u · total). Each pass histograms one 8-bit
// digit of the members still matching the chosen prefix (integer shared-memory atomics: exact
// and order-independent, hence deterministic) and one warp picks the digit. The kept sets are
// then "comp >= c*" bounds for the next select; after a top_k or top_p cut that leaves at most
// kListCap members, they are copied into a shared-memory list and the later selects read it
// instead of the row (CompactMembers).
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/sampling/sampling_cuda.h"

namespace sluice::kernels {
namespace {

using u64 = unsigned long long;  // the type of CUDA's 64-bit atomicAdd / shuffles

constexpr int kThreads = 512;
constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerLane = kBins / 32;

// Element access per logits type: bf16 rows load 8 values per 16-byte vector, fp32 rows 4.
__device__ __forceinline__ float ToFloat(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(float v) { return v; }

template <typename T>
struct VecLoad;
template <>
struct VecLoad<bf16> {
  static constexpr int kWidth = 8;
  using Type = cuda_detail::Bf16x8;
  __device__ __forceinline__ static void Unpack(const Type& v, float (&out)[kWidth]) {
    cuda_detail::ToFloat8(v, out);
  }
};
template <>
struct VecLoad<float> {
  static constexpr int kWidth = 4;
  using Type = float4;
  __device__ __forceinline__ static void Unpack(const Type& v, float (&out)[kWidth]) {
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
};

// Per-row constants of the sampled path.
template <typename T>
struct RowCtx {
  const T* row;
  int64_t vocab;
  bool vec;
  bool scale;          // temperature != 1
  float temperature;
  bool use_min_p;
  double log_min_p;
  float max_scaled;    // max over x (finite)
  int idbits;
  uint32_t idmask;
  double fixed_one;    // 2^(63 - idbits): vocab weights of at most 1 sum below 2^63
};

// Calls f(id, raw logit) for every id of the row, a 16-byte vector at a time where aligned.
template <typename T, typename F>
__device__ __forceinline__ void ForEachLogit(const T* row, int64_t vocab, bool vec, F&& f) {
  using V = VecLoad<T>;
  constexpr int kW = V::kWidth;
  int64_t scalar_begin = 0;
  if (vec) {
    const auto* rowv = reinterpret_cast<const typename V::Type*>(row);
    const int64_t nv = vocab / kW;
    for (int64_t c = threadIdx.x; c < nv; c += blockDim.x) {
      float v[kW];
      V::Unpack(rowv[c], v);
#pragma unroll
      for (int e = 0; e < kW; ++e) f(static_cast<uint32_t>(c * kW + e), v[e]);
    }
    scalar_begin = nv * kW;
  }
  for (int64_t j = scalar_begin + threadIdx.x; j < vocab; j += blockDim.x) {
    f(static_cast<uint32_t>(j), ToFloat(row[j]));
  }
}

struct NeverStop {
  __device__ __forceinline__ bool operator()() const { return false; }
};

// ForEachLogit with the same trip count on every thread (out-of-range lanes see id 0 and raw
// -inf, which is never a candidate), so `f` may use full-warp collectives. `stop` (warp-uniform)
// is asked before each step; true ends this warp's walk.
template <typename T, typename F, typename Stop = NeverStop>
__device__ __forceinline__ void ForEachLogitWarpUniform(const T* row, int64_t vocab, bool vec,
                                                        F&& f, Stop stop = {}) {
  using V = VecLoad<T>;
  constexpr int kW = V::kWidth;
  int64_t scalar_begin = 0;
  if (vec) {
    const auto* rowv = reinterpret_cast<const typename V::Type*>(row);
    const int64_t nv = vocab / kW;
    for (int64_t base = 0; base < nv; base += blockDim.x) {
      if (stop()) return;
      const int64_t c = base + threadIdx.x;
      float v[kW];
      if (c < nv) {
        V::Unpack(rowv[c], v);
      } else {
#pragma unroll
        for (int e = 0; e < kW; ++e) v[e] = -INFINITY;
      }
#pragma unroll
      for (int e = 0; e < kW; ++e) f(c < nv ? static_cast<uint32_t>(c * kW + e) : 0u, v[e]);
    }
    scalar_begin = nv * kW;
  }
  for (int64_t base = scalar_begin; base < vocab; base += blockDim.x) {
    if (stop()) return;
    const int64_t j = base + threadIdx.x;
    f(j < vocab ? static_cast<uint32_t>(j) : 0u, j < vocab ? ToFloat(row[j]) : -INFINITY);
  }
}

// x = raw / T exactly as the CPU's float division (round-to-nearest whatever the flags).
template <typename T>
__device__ __forceinline__ float Scaled(const RowCtx<T>& c, float raw) {
  return c.scale ? __fdiv_rn(raw, c.temperature) : raw;
}

// A candidate: finite and kept by min_p (sampler.cc: dropped when double(x) - max <
// log(min_p)). NaN is never one; raw > -inf ⇔ x > -inf as T > 0.
template <typename T>
__device__ __forceinline__ bool Candidate(const RowCtx<T>& c, float raw) {
  if (!(raw > -INFINITY)) return false;
  return !(c.use_min_p && static_cast<double>(Scaled(c, raw)) -
                                  static_cast<double>(c.max_scaled) <
                              c.log_min_p);
}

// Monotone map of the (bf16-valued) finite `raw` to 16 bits: larger value → larger key, -0 and
// +0 equal (the CPU compares them equal).
__device__ __forceinline__ uint32_t Key16(float raw) {
  const uint32_t u = __float_as_uint(raw == 0.0f ? 0.0f : raw) >> 16;
  return (u & 0x8000u) ? (~u & 0xFFFFu) : (u | 0x8000u);
}

// Monotone map of a finite fp32 value to 32 bits (larger → larger, -0 == +0).
__device__ __forceinline__ uint32_t Key32(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The rank key of a candidate: bf16 rows rank the raw value (16 bits; distinct bf16 values stay
// distinct after the fp32 division, see the file comment), fp32 rows the scaled value x itself
// (32 bits: distinct fp32 logits may round to equal x, which the CPU then ranks by id).
template <typename T>
struct RankKey;
template <>
struct RankKey<bf16> {
  static constexpr int kBits = 16;
  __device__ __forceinline__ static uint32_t Of(const RowCtx<bf16>&, float raw) {
    return Key16(raw);
  }
};
template <>
struct RankKey<float> {
  static constexpr int kBits = 32;
  __device__ __forceinline__ static uint32_t Of(const RowCtx<float>& c, float raw) {
    return Key32(Scaled(c, raw));
  }
};

// Probability relative to the maximum, exp(double(x) - max) as the CPU computes it, in fixed
// point with 63 - idbits fraction bits (>= 39 for vocab < 2^24): the per-token rounding
// (<= 2^-40) is far below the float64 reference's own summation error, so device and CPU
// disagree only on draws within ~1e-10 (relative) of a CDF boundary.
template <typename T>
__device__ __forceinline__ u64 FixedWeight(const RowCtx<T>& c, float x) {
  return __double2ull_rn(
      exp(static_cast<double>(x) - static_cast<double>(c.max_scaled)) * c.fixed_one);
}

struct SelectShared {
  // Per-bin metric sums as two 32-bit words: 32-bit shared atomics are native, 64-bit adds may
  // become compare-and-swap loops, which crawl when most tokens share a bin (the first digits).
  uint32_t hist_lo[kBins];
  uint32_t hist_hi[kBins];
  u64 prefix;  // chosen high digits of c*
  u64 goal;    // G minus the mass above the chosen prefix
  u64 total;   // members' total metric (first pass)
};

__device__ __forceinline__ u64 Hist(const SelectShared& sh, int bin) {
  return (static_cast<u64>(sh.hist_hi[bin]) << 32) + sh.hist_lo[bin];
}

// Adds v to a bin exactly: the low word's carry (seen in the value atomicAdd returns) goes to
// the high word. The final words are the exact sum whatever the order (deterministic).
__device__ __forceinline__ void HistAdd(SelectShared& sh, int bin, u64 v) {
  const uint32_t lo = static_cast<uint32_t>(v);
  uint32_t hi = static_cast<uint32_t>(v >> 32);
  if (lo != 0) {
    const uint32_t old = atomicAdd(&sh.hist_lo[bin], lo);
    hi += old + lo < old ? 1u : 0u;
  }
  if (hi != 0) atomicAdd(&sh.hist_hi[bin], hi);
}

// HistAdd for a whole warp (all 32 lanes must call it; metric 0 = nothing to add). When every
// contributing lane hits the same bin — the id-order select's first digit (a warp covers 256
// consecutive ids), a peaked row's leading digits — one lane adds the warp's sum instead of
// 32 atomics serializing on one address.
__device__ __forceinline__ void WarpHistAdd(SelectShared& sh, int bin, u64 metric) {
  const unsigned contributing = __ballot_sync(0xffffffffu, metric != 0);
  if (contributing == 0) return;
  const int leader = __ffs(contributing) - 1;
  const int leader_bin = __shfl_sync(0xffffffffu, bin, leader);
  if (__all_sync(0xffffffffu, metric == 0 || bin == leader_bin)) {
    u64 sum = metric;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (static_cast<int>(threadIdx.x % 32) == leader) HistAdd(sh, leader_bin, sum);
  } else if (metric != 0) {
    HistAdd(sh, bin, metric);
  }
}

// Members copied out of the row (CompactMembers): once a cut has left at most kListCap members
// (top_k <= kListCap always does; top_p where it keeps few tokens), the later selects read this
// list instead of the whole row. 16 KiB of shared memory: two CTAs a SM still fit.
constexpr int kListCap = 2048;
struct ListShared {
  uint32_t id[kListCap];
  float raw[kListCap];
  int count;  // members found (> kListCap: overflow, the list is not used)
};

// The elements a select visits: the whole row (warp-uniform trip counts, ForEachLogitWarpUniform)
// or the compacted list (padding lanes see id 0 and raw -inf, never a candidate).
template <typename T>
struct RowSource {
  const RowCtx<T>& c;
  template <typename F>
  __device__ __forceinline__ void operator()(F&& f) const {
    ForEachLogitWarpUniform(c.row, c.vocab, c.vec, f);
  }
};
struct ListSource {
  const ListShared& list;
  template <typename F>
  __device__ __forceinline__ void operator()(F&& f) const {
    const int n = list.count;
    for (int base = 0; base < n; base += blockDim.x) {
      const int i = base + static_cast<int>(threadIdx.x);
      f(i < n ? list.id[i] : 0u, i < n ? list.raw[i] : -INFINITY);
    }
  }
};

// Which order and metric a select uses.
enum class SelectKind { kRankCount, kRankMass, kIdMass };

// Warp 0: finds the bin of the current digit where the cumulative metric from the top reaches
// the goal; on the first pass (`goal_of_total` set) it first turns the total into the goal.
template <typename GoalOf>
__device__ void PickDigit(SelectShared& sh, int shift, bool first, GoalOf goal_of_total) {
  const int lane = threadIdx.x;
  u64 sum = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerLane; ++j) sum += Hist(sh, kBins - 1 - kBinsPerLane * lane - j);
  u64 goal;
  if (first) {
    u64 total = sum;
    for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
    // Every lane derives the same goal; only the picking lane stores it (below), so there is
    // one writer of sh.goal per pass.
    goal = total == 0 ? 0 : min(max(goal_of_total(total), u64{1}), total);
    if (lane == 0) sh.total = total;
    if (total == 0) return;
  } else {
    goal = sh.goal;
  }
  // Inclusive scan over lanes; lane 0 holds the highest bins.
  u64 inclusive = sum;
  for (int off = 1; off < 32; off <<= 1) {
    const u64 up = __shfl_up_sync(0xffffffffu, inclusive, off);
    if (lane >= off) inclusive += up;
  }
  const u64 exclusive = inclusive - sum;
  const unsigned hit = __ballot_sync(0xffffffffu, exclusive < goal && inclusive >= goal);
  if (lane == __ffs(hit) - 1) {  // exactly one lane: the scan is monotone and goal <= total
    u64 acc = exclusive;
    for (int j = 0; j < kBinsPerLane; ++j) {
      const int bin = kBins - 1 - kBinsPerLane * lane - j;
      const u64 count = Hist(sh, bin);
      if (acc + count >= goal) {
        sh.prefix |= static_cast<u64>(bin) << shift;
        sh.goal = goal - acc;
        break;
      }
      acc += count;
    }
  }
}

// Copies the members (candidates with rank comp >= bound) of the row into `list`, one
// shared-memory atomic per warp and step. Returns whether they fit (at most kListCap); a warp
// stops reading the row once the list has overflowed, so a cut that keeps thousands of tokens
// costs a small part of a pass. Slots follow arrival order, which no select depends on (its
// sums are exact integers). Must be reached by the whole block.
template <typename T>
__device__ bool CompactMembers(const RowCtx<T>& c, u64 bound, ListShared& list) {
  __syncthreads();  // earlier readers of the list are done
  if (threadIdx.x == 0) list.count = 0;
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const auto overflowed = [&list, lane]() {
    const int full = lane == 0 ? (*reinterpret_cast<volatile int*>(&list.count) > kListCap) : 0;
    return __shfl_sync(0xffffffffu, full, 0) != 0;
  };
  ForEachLogitWarpUniform(
      c.row, c.vocab, c.vec,
      [&](uint32_t id, float raw) {
        bool member = false;
        if (Candidate(c, raw)) {
          const u64 comp =
              (static_cast<u64>(RankKey<T>::Of(c, raw)) << c.idbits) | (c.idmask - id);
          member = comp >= bound;
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, member);
        if (ballot == 0) return;
        const int leader = __ffs(ballot) - 1;
        int base = 0;
        if (lane == leader) base = atomicAdd(&list.count, __popc(ballot));
        base = __shfl_sync(0xffffffffu, base, leader);
        const int slot = base + __popc(ballot & ((1u << lane) - 1u));
        if (member && slot < kListCap) {
          list.id[slot] = id;
          list.raw[slot] = raw;
        }
      },
      overflowed);
  __syncthreads();
  return list.count <= kListCap;
}

// Radix select over the members (candidates with comp >= lower_bound) among the elements `each`
// visits (RowSource / ListSource). Returns c*, or sets *empty when there are no members (mass
// totals are >= 1 otherwise: the maximum weighs fixed_one).
// With `list` (rank selects over the row), once the digits of the rank key's top 16 bits are
// chosen (the whole bf16 value; sign, exponent and 7 mantissa bits of an fp32 x), the
// candidates at or above that prefix, a superset of this select's final members, are copied
// into *list (CompactMembers); where they fit, the remaining passes read the list and *listed
// is set.
// Must be reached by the whole block.
template <SelectKind kKind, typename T, typename GoalOf, typename Source>
__device__ u64 RadixSelect(const RowCtx<T>& c, const Source& each, u64 lower_bound,
                           GoalOf goal_of_total, SelectShared& sh, bool* empty,
                           ListShared* list = nullptr, bool* listed = nullptr) {
  constexpr bool kRank = kKind != SelectKind::kIdMass;
  constexpr bool kMass = kKind != SelectKind::kRankCount;
  const int bits = kRank ? RankKey<T>::kBits + c.idbits : c.idbits;
  const int digits = (bits + kDigitBits - 1) / kDigitBits;
  const int pad = digits * kDigitBits - bits;
  const u64 padded_bound = lower_bound << pad;
  // The digit after which the top 16 rank-key bits are known.
  const int compact_digit = kRank ? (bits + pad - 16) / kDigitBits : -1;
  bool use_list = false;
  __syncthreads();  // earlier readers of sh are done
  if (threadIdx.x == 0) sh.prefix = 0;
  for (int d = digits - 1; d >= 0; --d) {
    const int shift = d * kDigitBits;
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) sh.hist_lo[b] = sh.hist_hi[b] = 0;
    __syncthreads();
    const u64 prefix = sh.prefix;
    const int high = shift + kDigitBits;
    const u64 high_mask = high >= 64 ? 0 : (~u64{0} << high);
    auto visit = [&](uint32_t id, float raw) {
      u64 metric = 0;
      int bin = 0;
      if (Candidate(c, raw)) {
        const u64 comp = (kRank ? (static_cast<u64>(RankKey<T>::Of(c, raw)) << c.idbits) |
                                      (c.idmask - id)
                                : static_cast<u64>(c.idmask - id))
                         << pad;
        if (comp >= padded_bound && (comp & high_mask) == prefix) {
          metric = kMass ? FixedWeight(c, Scaled(c, raw)) : 1;
          bin = static_cast<int>((comp >> shift) & (kBins - 1));
        }
      }
      WarpHistAdd(sh, bin, metric);
    };
    if (use_list) {
      ListSource{*list}(visit);
    } else {
      each(visit);
    }
    __syncthreads();
    if (threadIdx.x < 32) PickDigit(sh, shift, d == digits - 1, goal_of_total);
    __syncthreads();
    if (sh.total == 0) break;  // uniform: every thread reads the same value
    if (list != nullptr && d == compact_digit && d > 0) {
      // Members from here on match the prefix: comp >= prefix (its lower digits zero).
      const u64 at_prefix = sh.prefix >> pad;
      use_list = CompactMembers(c, at_prefix > lower_bound ? at_prefix : lower_bound, *list);
    }
  }
  *empty = sh.total == 0;
  if (listed != nullptr) *listed = use_list;
  return sh.prefix >> pad;
}

// The sampled path of one row (temperature >= 1e-5, some finite logit). Returns the token.
// The top_k and top_p selects copy their candidates into `list` once the cut's value is known
// (after 2 of their 5 digit passes at bf16; RadixSelect), or their members after the select,
// where at most kListCap exist (CompactMembers), and the remaining passes and selects read the
// list: a row with top_k (and top_p), or with top_p where it keeps few tokens, reads the logits
// 5 times instead of 12-17.
template <typename T>
__device__ int32_t SampleRow(const RowCtx<T>& c, const SamplingRow& p, SelectShared& sh,
                             ListShared& list) {
  bool empty = false;
  const double u = p.uniform;
  const auto draw_goal = [u](u64 total) {
    return static_cast<u64>(floor(u * static_cast<double>(total))) + 1;
  };
  const RowSource<T> row{c};
  const ListSource listed_members{list};
  const bool use_top_k = p.top_k > 0 && p.top_k < c.vocab;
  if (!use_top_k && p.top_p >= 1.0f) {
    const u64 comp = RadixSelect<SelectKind::kIdMass>(c, row, 0, draw_goal, sh, &empty);
    return empty ? 0 : static_cast<int32_t>(c.idmask - static_cast<uint32_t>(comp));
  }
  u64 bound = 0;        // members so far: comp >= bound
  bool listed = false;  // `list` holds every member
  if (use_top_k) {
    const u64 k = static_cast<u64>(p.top_k);
    const bool fits = p.top_k <= kListCap;
    bound = RadixSelect<SelectKind::kRankCount>(
        c, row, bound, [k](u64 total) { return min(k, total); }, sh, &empty,
        fits ? &list : nullptr, &listed);
    if (empty) return 0;
    // The value at the cut may be shared by more tokens than the list holds; the top_k
    // members themselves always fit.
    if (fits && !listed) listed = CompactMembers(c, bound, list);
  }
  if (p.top_p < 1.0f) {
    const double top_p = p.top_p;
    const auto top_p_goal = [top_p](u64 total) {
      const double goal = ceil(top_p * static_cast<double>(total));
      return goal < 1.0 ? u64{1} : static_cast<u64>(goal);
    };
    if (listed) {
      bound = RadixSelect<SelectKind::kRankMass>(c, listed_members, bound, top_p_goal, sh,
                                                 &empty);
    } else {
      bound = RadixSelect<SelectKind::kRankMass>(c, row, bound, top_p_goal, sh, &empty, &list,
                                                 &listed);
      if (!empty && !listed) listed = CompactMembers(c, bound, list);
    }
    if (empty) return 0;
  }
  const u64 comp =
      listed ? RadixSelect<SelectKind::kRankMass>(c, listed_members, bound, draw_goal, sh, &empty)
             : RadixSelect<SelectKind::kRankMass>(c, row, bound, draw_goal, sh, &empty);
  return empty ? 0 : static_cast<int32_t>(c.idmask - (static_cast<uint32_t>(comp) & c.idmask));
}

// Argmax with the lowest id on ties; NaN/-inf never win.
__device__ __forceinline__ void ArgmaxCombine(float& best, int32_t& best_id, float v, int32_t id) {
  if (v > best || (v == best && id < best_id)) {
    best = v;
    best_id = id;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const T* logits, int64_t vocab, bool vec, int idbits,
                     const SamplingRow* params, int32_t* tokens, float* logprobs) {
  __shared__ SelectShared sh;
  __shared__ ListShared list;
  __shared__ float s_best[kThreads / 32];
  __shared__ int32_t s_best_id[kThreads / 32];
  __shared__ float s_scratch[32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const SamplingRow p = params[blockIdx.x];

  // Pass 1: argmax of the raw logits (also the raw maximum).
  float best = -INFINITY;
  int32_t best_id = INT32_MAX;
  ForEachLogit(row, vocab, vec, [&](uint32_t id, float raw) {
    if (raw > -INFINITY) ArgmaxCombine(best, best_id, raw, static_cast<int32_t>(id));
  });
  for (int off = 16; off > 0; off >>= 1) {
    ArgmaxCombine(best, best_id, __shfl_xor_sync(0xffffffffu, best, off),
                  __shfl_xor_sync(0xffffffffu, best_id, off));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_best[warp] = best;
    s_best_id[warp] = best_id;
  }
  __syncthreads();
  best = -INFINITY;
  best_id = INT32_MAX;
  for (int w = 0; w < kThreads / 32; ++w) ArgmaxCombine(best, best_id, s_best[w], s_best_id[w]);
  const bool any_finite = best_id != INT32_MAX;
  const float raw_max = best;

  // Pass 2: log-sum-exp of the raw logits for the logprob.
  float sum = 0.0f;
  if (any_finite) {
    ForEachLogit(row, vocab, vec, [&](uint32_t, float raw) {
      if (raw > -INFINITY) sum += expf(raw - raw_max);
    });
  }
  sum = cuda_detail::BlockSum(sum, s_scratch);

  int32_t token = any_finite ? best_id : 0;
  if (!(p.temperature < kGreedyTemperature) && any_finite) {
    RowCtx<T> c;
    c.row = row;
    c.vocab = vocab;
    c.vec = vec;
    c.scale = p.temperature != 1.0f;
    c.temperature = p.temperature;
    c.use_min_p = p.min_p > 0.0f;
    c.log_min_p = c.use_min_p ? log(static_cast<double>(p.min_p)) : 0.0;
    // Division by T > 0 is monotone, so the scaled maximum is the scaled raw maximum.
    c.max_scaled = c.scale ? __fdiv_rn(raw_max, p.temperature) : raw_max;
    c.idbits = idbits;
    c.idmask = static_cast<uint32_t>((u64{1} << idbits) - 1);
    c.fixed_one = ldexp(1.0, 63 - idbits);
    // The CPU falls back to argmax (0 here: nothing finite) when the scaled maximum is not
    // finite; NaN temperatures land here.
    token = c.max_scaled > -INFINITY ? SampleRow(c, p, sh, list) : 0;
  }
  if (threadIdx.x == 0) {
    tokens[blockIdx.x] = token;
    // log_softmax(raw)[token] = (raw[token] - max) - log(Σ exp(raw - max)); NaN for a row with
    // nothing finite (the CPU's raw[0] - (-inf) is NaN or inf - inf).
    logprobs[blockIdx.x] =
        any_finite ? (ToFloat(row[token]) - raw_max) - logf(sum) : NAN;
  }
}

int IdBits(int64_t vocab) {
  int bits = 1;
  while ((int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

}  // namespace

size_t SampleRowsCudaWorkspaceBytes(int64_t /*rows*/, int64_t /*vocab*/) { return 0; }

namespace {

template <typename T>
absl::Status LaunchSampleRows(const T* logits, int64_t rows, int64_t vocab,
                              const SamplingRow* params, int32_t* tokens, float* logprobs,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || vocab > kSampleRowsCudaMaxVocab || rows > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleRowsCuda: rows ", rows, " vocab ", vocab));
  }
  if (workspace_bytes < SampleRowsCudaWorkspaceBytes(rows, vocab)) {
    return absl::InvalidArgumentError(absl::StrCat("SampleRowsCuda: workspace ", workspace_bytes,
                                                   " bytes < ",
                                                   SampleRowsCudaWorkspaceBytes(rows, vocab)));
  }
  (void)workspace;
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || params == nullptr || tokens == nullptr || logprobs == nullptr) {
    return absl::InvalidArgumentError("SampleRowsCuda: null pointer");
  }
  const bool vec = cuda_detail::Aligned16(logits) && vocab % VecLoad<T>::kWidth == 0;
  SampleRowsKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, vocab, vec, IdBits(vocab), params, tokens, logprobs);
  return CudaLaunchStatus("SampleRowsKernel");
}

}  // namespace

absl::Status SampleRowsCuda(const bf16* logits, int64_t rows, int64_t vocab,
                            const SamplingRow* params, int32_t* tokens, float* logprobs,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return LaunchSampleRows(logits, rows, vocab, params, tokens, logprobs, workspace,
                          workspace_bytes, stream);
}

absl::Status SampleRowsCuda(const float* logits, int64_t rows, int64_t vocab,
                            const SamplingRow* params, int32_t* tokens, float* logprobs,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return LaunchSampleRows(logits, rows, vocab, params, tokens, logprobs, workspace,
                          workspace_bytes, stream);
}

}  // namespace sluice::kernels
