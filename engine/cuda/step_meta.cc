#include "engine/cuda/step_meta.h"

#include <algorithm>
#include <cstring>

namespace sluice::cuda_runner {

MetaLayout MakeLayout(int64_t t, int64_t s, int64_t n, int64_t mb) {
  MetaLayout l;
  l.num_tokens = t;
  l.num_seqs = s;
  l.num_logits = n;
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += (bytes + 7) / 8 * 8;
    return at;
  };
  l.slots = take(t * sizeof(int64_t));
  l.ids = take(t * sizeof(int32_t));
  l.positions = take(t * sizeof(int32_t));
  l.query_start = take((s + 1) * sizeof(int32_t));
  l.context_lens = take(s * sizeof(int32_t));
  l.logits_rows = take(n * sizeof(int32_t));
  l.block_tables = take(s * mb * sizeof(int32_t));
  l.sliding_start = take(s * sizeof(int32_t));
  l.bytes = off;
  return l;
}

HostMeta HostMetaPointers(char* dst, const MetaLayout& l) {
  const auto at = [dst](size_t off) { return reinterpret_cast<int32_t*>(dst + off); };
  return {reinterpret_cast<int64_t*>(dst + l.slots), at(l.ids), at(l.positions),
          at(l.query_start), at(l.context_lens), at(l.logits_rows), at(l.block_tables),
          at(l.sliding_start)};
}

void PackStep(const ForwardInput& in, const MetaLayout& l, int64_t padded_seqs,
              const PackGeometry& g, char* dst) {
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  const int64_t S = static_cast<int64_t>(in.sequences.size());
  const int64_t N = static_cast<int64_t>(in.logits_indices.size());
  const HostMeta h = HostMetaPointers(dst, l);
  std::memcpy(h.slots, in.slot_mapping.data(), T * sizeof(int64_t));
  std::memcpy(h.ids, in.token_ids.data(), T * sizeof(int32_t));
  std::memcpy(h.positions, in.positions.data(), T * sizeof(int32_t));
  std::memcpy(h.logits_rows, in.logits_indices.data(), N * sizeof(int32_t));
  const int64_t bs = g.block_size;
  h.query_start[0] = 0;
  for (int64_t s = 0; s < S; ++s) {
    const SequenceSlice& q = in.sequences[s];
    h.query_start[s + 1] = q.query_start + q.num_query_tokens;
    h.context_lens[s] = q.num_context_tokens;
    const int64_t need = (int64_t{q.num_context_tokens} + q.num_query_tokens + bs - 1) / bs;
    std::memcpy(h.block_tables + s * g.max_blocks_per_seq, q.block_table.data(),
                need * sizeof(int32_t));
    h.sliding_start[s] = in.sliding_kv_start.empty() ? 0 : in.sliding_kv_start[s];
  }
  for (int64_t s = S; s < padded_seqs; ++s) {
    h.slots[s] = -1;
    h.ids[s] = 0;
    h.positions[s] = 0;
    h.query_start[s + 1] = static_cast<int32_t>(s + 1);
    h.context_lens[s] = 0;
    h.block_tables[s * g.max_blocks_per_seq] = 0;
    h.sliding_start[s] = 0;
  }
  for (int64_t r = N; r < l.num_logits; ++r) h.logits_rows[r] = static_cast<int32_t>(r);
}

void PackPaddedStep(const ForwardInput& in, const MetaLayout& l, int64_t batch,
                    int64_t query_len, const PackGeometry& g, char* dst) {
  const int64_t q = query_len;
  const int64_t S = static_cast<int64_t>(in.sequences.size());
  const int64_t N = static_cast<int64_t>(in.logits_indices.size());
  const HostMeta h = HostMetaPointers(dst, l);
  const int64_t bs = g.block_size;
  h.query_start[0] = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const SequenceSlice* seq = s < S ? &in.sequences[s] : nullptr;
    const int64_t n = seq != nullptr ? seq->num_query_tokens : 0;
    const int64_t c = seq != nullptr ? seq->num_context_tokens : 0;
    const int64_t row = s * q;
    if (n > 0) {
      const int64_t t = seq->query_start;
      std::memcpy(h.slots + row, in.slot_mapping.data() + t, n * sizeof(int64_t));
      std::memcpy(h.ids + row, in.token_ids.data() + t, n * sizeof(int32_t));
      std::memcpy(h.positions + row, in.positions.data() + t, n * sizeof(int32_t));
    }
    for (int64_t i = n; i < q; ++i) {
      h.slots[row + i] = -1;
      h.ids[row + i] = 0;
      h.positions[row + i] = static_cast<int32_t>(c + i);
    }
    h.query_start[s + 1] = static_cast<int32_t>(row + q);
    h.context_lens[s] = static_cast<int32_t>(c);
    const int64_t real = (c + n + bs - 1) / bs, padded = (c + q + bs - 1) / bs;
    int32_t* table = h.block_tables + s * g.max_blocks_per_seq;
    if (real > 0) std::memcpy(table, seq->block_table.data(), real * sizeof(int32_t));
    for (int64_t b = real; b < padded; ++b) table[b] = 0;
    h.sliding_start[s] = seq != nullptr && !in.sliding_kv_start.empty() ? in.sliding_kv_start[s] : 0;
  }
  for (int64_t r = 0; r < N; ++r) {
    const int32_t t = in.logits_indices[r];
    // The sequence holding token t: the last whose rows start at or before it.
    const auto it = std::upper_bound(
        in.sequences.begin(), in.sequences.end(), t,
        [](int32_t token, const SequenceSlice& seq) { return token < seq.query_start; });
    const int64_t s = (it - in.sequences.begin()) - 1;
    h.logits_rows[r] = static_cast<int32_t>(s * q + (t - in.sequences[s].query_start));
  }
  for (int64_t r = N; r < l.num_logits; ++r) h.logits_rows[r] = static_cast<int32_t>(r);
}

int FindGraphBucket(const ForwardInput& plan, absl::Span<const GraphBucket> buckets,
                    int64_t max_model_len, bool bounded, bool bounded_captured) {
  const int64_t T = static_cast<int64_t>(plan.token_ids.size());
  const int64_t S = static_cast<int64_t>(plan.sequences.size());
  const int64_t N = static_cast<int64_t>(plan.logits_indices.size());
  int best = -1;
  if (T == S) {
    if (bounded && !bounded_captured) return -1;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const GraphBucket& b = buckets[i];
      if (b.query_len == 1 && b.batch >= S && b.batch >= N &&
          (best < 0 || b.batch < buckets[best].batch)) {
        best = static_cast<int>(i);
      }
    }
    return best;
  }
  if (bounded) return -1;
  int64_t max_q = 0, max_context = 0;
  for (const SequenceSlice& q : plan.sequences) {
    max_q = std::max<int64_t>(max_q, q.num_query_tokens);
    max_context = std::max<int64_t>(max_context, q.num_context_tokens);
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    const GraphBucket& b = buckets[i];
    if (b.query_len < max_q || b.batch < S || max_context + b.query_len > max_model_len) continue;
    if (best < 0 || b.batch * b.query_len < buckets[best].batch * buckets[best].query_len) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

}  // namespace sluice::cuda_runner
