// Decode-step fusion of RoPE and the KV-cache write into the paged attention kernel
// (PagedAttentionRopeDecodeCuda, paged_attention_cuda.h): on a decode-only step every
// sequence has one new token, whose q, k and v sit unrotated in the fused QKV row. Instead of a
// separate RopeQkWriteKvCuda launch before attention:
//  * every CTA computes the cos / sin of its token's position once into shared memory and
//    rotates q while loading its fragments (the qkv buffer is only read: several CTAs of one
//    head read the same q);
//  * the one CTA of a (sequence, KV head) whose key range holds the new position (split-KV
//    partitions are disjoint, and the causal end is that position, so exactly one CTA does)
//    rotates the new k and writes it and v to the token's cache slot, then passes a CTA barrier
//    before it issues any cache copy: its own cp.async reads (generic proxy, ordered after the
//    barrier) then see the new row, and no other CTA reads that position.
// The persistent decode warps do the same per warp: a warp owns whole units and syncs with
// __syncwarp (DecodeRopeTable / DecodeRopeWriteKv take the threads doing the work). At head
// dims ≤ 128 a warp writes each unit's new key just before it copies the slice that holds it,
// having loaded the row into registers a slice earlier (PendingKvWrite), and streams the slices
// below it from the start; at wider heads it writes all its units' new keys before its first
// copy.
// The rotation is RopeQkWriteKvCuda's (rope_cuda.h): rotate-half over the first 2·half
// channels, angle = float(pos) · inv_freq[i] in fp32, c = cos · scaling, s = sin · scaling,
// x1·c − x2·s and x2·c + x1·s in fp32, rounded once to bf16; channels past 2·half unchanged.
#ifndef SLUICE_KERNELS_ATTENTION_DECODE_ROPE_FUSION_CUH_
#define SLUICE_KERNELS_ATTENTION_DECODE_ROPE_FUSION_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sluice::kernels::attention_detail {

// Device view of the fusion; inv_freq == nullptr means no fusion (plain attention launch).
struct DecodeRopeFusion {
  const float* inv_freq = nullptr;        // [half] fp32
  const int32_t* positions = nullptr;     // [num_tokens] RoPE positions
  const int64_t* slot_mapping = nullptr;  // [num_tokens] cache slots (< 0: not cached)
  __nv_bfloat16* k_cache = nullptr;       // writable views of the kernel's caches
  __nv_bfloat16* v_cache = nullptr;
  int half = 0;        // rotary_dim / 2, even
  float scaling = 1.0f;
  int64_t k_offset = 0;  // elements from a token's q row start to its k heads
  int64_t v_offset = 0;  // ... to its v heads
};

// Shared memory the fusion needs after the kernel's own: (cos, sin) per rotation pair.
__host__ __device__ constexpr int DecodeRopeSmemBytes(int padded_head_dim) {
  return padded_head_dim / 2 * static_cast<int>(sizeof(float2));
}

// Element e of head row x after rotation (cs: the (cos, sin) table of the token's position).
static __device__ __forceinline__ __nv_bfloat16 DecodeRopeElement(const __nv_bfloat16* x, int e,
                                                                  const float2* cs, int half) {
  if (e >= 2 * half) return x[e];
  const int i = e < half ? e : e - half;
  const float x1 = __bfloat162float(x[i]);
  const float x2 = __bfloat162float(x[i + half]);
  const float2 r = cs[i];
  return __float2bfloat16_rn(e < half ? x1 * r.x - x2 * r.y : x2 * r.x + x1 * r.y);
}

// The rotated bf16 pair at even column col of head row x (4-byte aligned), packed as the mma
// A operand wants it (low half = column col). half is even, so a pair never straddles the
// rotated halves.
static __device__ __forceinline__ uint32_t DecodeRopePair(const __nv_bfloat16* x, int col,
                                                          const float2* cs, int half) {
  const auto load = [&](int c) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + c));
  };
  __nv_bfloat162 out;
  if (col >= 2 * half) {
    out = *reinterpret_cast<const __nv_bfloat162*>(x + col);
  } else {
    const int i = col < half ? col : col - half;
    const float2 a = load(i);         // x1 of pairs i, i + 1
    const float2 b = load(i + half);  // x2
    const float2 r0 = cs[i], r1 = cs[i + 1];
    if (col < half) {
      out = __floats2bfloat162_rn(a.x * r0.x - b.x * r0.y, a.y * r1.x - b.y * r1.y);
    } else {
      out = __floats2bfloat162_rn(b.x * r0.x + a.x * r0.y, b.y * r1.x + a.y * r1.y);
    }
  }
  return *reinterpret_cast<uint32_t*>(&out);
}

// DecodeRopeTable for a position already loaded (a persistent decode warp loads its next
// unit's while it attends the current one).
static __device__ __forceinline__ void DecodeRopeTableAt(const DecodeRopeFusion& f, float pos,
                                                         float2* cs, int tid, int n) {
  for (int i = tid; i < f.half; i += n) {
    float s, c;
    sincosf(pos * f.inv_freq[i], &s, &c);
    cs[i] = make_float2(c * f.scaling, s * f.scaling);
  }
}

// Threads tid = 0..n−1 (a CTA or a warp) fill cs (half entries of shared memory) with the
// (cos, sin) table of token `token`'s position; the caller syncs them before cs is read.
static __device__ __forceinline__ void DecodeRopeTable(const DecodeRopeFusion& f, int token,
                                                       float2* cs, int tid, int n) {
  DecodeRopeTableAt(f, static_cast<float>(f.positions[token]), cs, tid, n);
}

// Threads tid = 0..n−1 write token `token`'s rotated k and its v of head kv_head to its cache
// slot (none when the slot is < 0). cs: the token's table (DecodeRopeTable, synced). q_row:
// the token's qkv row.
static __device__ __forceinline__ void DecodeRopeWriteKv(const DecodeRopeFusion& f,
                                                         const __nv_bfloat16* q_row, int token,
                                                         int kv_head, int num_kv_heads,
                                                         int head_dim, const float2* cs, int tid,
                                                         int n) {
  const int64_t slot = f.slot_mapping[token];
  if (slot < 0) return;
  const int64_t head = static_cast<int64_t>(kv_head) * head_dim;
  const int64_t row = slot * num_kv_heads * head_dim + head;
  const __nv_bfloat16* k = q_row + f.k_offset + head;
  const __nv_bfloat16* v = q_row + f.v_offset + head;
  for (int e = tid; e < head_dim; e += n) {
    f.k_cache[row + e] = DecodeRopeElement(k, e, cs, f.half);
    f.v_cache[row + e] = v[e];
  }
}

// One lane's share of a token's new K/V row for head kv_head, loaded ahead of its store
// (DecodeKvWriteLoad → DecodeKvWriteStore): the persistent decode warps load it while the slice
// before the one holding the new key is copied, so the store finds its inputs in registers
// rather than waiting on the qkv / metadata loads. Lane l holds elements e = l + 32·j
// (j < kPerLane, e < head_dim): k[e], its rotation partner k[e ± half] and v[e].
template <int kPerLane>
struct PendingKvWrite {
  int64_t slot;
  float pos;
  __nv_bfloat16 k[kPerLane], partner[kPerLane], v[kPerLane];
  float inv_freq[kPerLane];
};

template <int kPerLane>
static __device__ __forceinline__ void DecodeKvWriteLoad(const DecodeRopeFusion& f,
                                                         const __nv_bfloat16* q_row, int token,
                                                         int kv_head, int head_dim, int lane,
                                                         PendingKvWrite<kPerLane>& w) {
  w.slot = f.slot_mapping[token];
  w.pos = static_cast<float>(f.positions[token]);
  const __nv_bfloat16* k = q_row + f.k_offset + static_cast<int64_t>(kv_head) * head_dim;
  const __nv_bfloat16* v = q_row + f.v_offset + static_cast<int64_t>(kv_head) * head_dim;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e >= head_dim) continue;
    w.k[j] = k[e];
    w.v[j] = v[e];
    if (e < 2 * f.half) {
      w.partner[j] = k[e < f.half ? e + f.half : e - f.half];
      w.inv_freq[j] = f.inv_freq[e < f.half ? e : e - f.half];
    }
  }
}

// Rotates the loaded k elements (DecodeRopeElement's formula, the angle and scaling of
// DecodeRopeTable) and stores them and v to the token's cache slot (none when it is < 0).
template <int kPerLane>
static __device__ __forceinline__ void DecodeKvWriteStore(const DecodeRopeFusion& f, int kv_head,
                                                          int num_kv_heads, int head_dim, int lane,
                                                          const PendingKvWrite<kPerLane>& w) {
  if (w.slot < 0) return;
  const int64_t row = w.slot * num_kv_heads * head_dim + static_cast<int64_t>(kv_head) * head_dim;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e >= head_dim) continue;
    __nv_bfloat16 out = w.k[j];
    if (e < 2 * f.half) {
      float sn, cs;
      sincosf(w.pos * w.inv_freq[j], &sn, &cs);
      const float c = cs * f.scaling, s = sn * f.scaling;
      const float self = __bfloat162float(w.k[j]), partner = __bfloat162float(w.partner[j]);
      out = __float2bfloat16_rn(e < f.half ? self * c - partner * s : self * c + partner * s);
    }
    f.k_cache[row + e] = out;
    f.v_cache[row + e] = w.v[j];
  }
}

// The prologue every thread of a CTA runs before its first cache copy: fills cs (half entries
// of shared memory) for token `token`, and when `owns_new_key` writes that token's rotated k
// and its v of head kv_head to its cache slot. q_row: the token's qkv row. Ends with a CTA
// barrier (see the file comment for why that suffices).
static __device__ __forceinline__ void DecodeRopePrologue(const DecodeRopeFusion& f,
                                                          const __nv_bfloat16* q_row, int token,
                                                          int kv_head, int num_kv_heads,
                                                          int head_dim, bool owns_new_key,
                                                          float2* cs) {
  DecodeRopeTable(f, token, cs, threadIdx.x, blockDim.x);
  __syncthreads();
  if (owns_new_key) {
    DecodeRopeWriteKv(f, q_row, token, kv_head, num_kv_heads, head_dim, cs, threadIdx.x,
                      blockDim.x);
  }
  __syncthreads();
}

}  // namespace sluice::kernels::attention_detail

#endif  // SLUICE_KERNELS_ATTENTION_DECODE_ROPE_FUSION_CUH_
