// Step metadata of the CUDA runners (cuda_runner.h): how one engine step's plan
// (engine/model/model.h ForwardInput) is laid out in the pinned staging buffer that one copy
// sends to the device, and which captured decode graph bucket a step replays. Host code only
// (no CUDA), so it is tested on the CPU (tests/unit/cuda_step_meta_test.cc). Internal to
// engine/cuda.
#ifndef SLUICE_ENGINE_CUDA_STEP_META_H_
#define SLUICE_ENGINE_CUDA_STEP_META_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "engine/model/model.h"

namespace sluice::cuda_runner {

// Byte offsets of one step's metadata inside its (host staging / device) buffer. Sizes:
// T tokens, S sequences, N logits rows, MB block-table width. slot_mapping comes first so the
// int64 array is 8-byte aligned.
struct MetaLayout {
  int64_t num_tokens = 0, num_seqs = 0, num_logits = 0;
  size_t slots = 0, ids = 0, positions = 0, query_start = 0, context_lens = 0, logits_rows = 0,
         block_tables = 0, sliding_start = 0, bytes = 0;
};

MetaLayout MakeLayout(int64_t t, int64_t s, int64_t n, int64_t mb);

// The arrays of a layout in a host buffer: slots [T] (-1: write no K/V), ids [T], positions [T],
// query_start [S + 1], context_lens [S], logits_rows [N], block_tables [S, MB],
// sliding_start [S].
struct HostMeta {
  int64_t* slots;
  int32_t *ids, *positions, *query_start, *context_lens, *logits_rows, *block_tables,
      *sliding_start;
};
HostMeta HostMetaPointers(char* dst, const MetaLayout& l);

// The step geometry packing needs (the runner's options).
struct PackGeometry {
  int64_t block_size = 16;
  int64_t max_blocks_per_seq = 0;  // the block-table width MB
};

// PackStep writes `plan` (already validated) into `dst` laid out as `l`, as it is: sequence s's
// tokens at plan.sequences[s].query_start. Sequences past the plan (decode graph padding, up to
// padded_seqs ≤ l.num_seqs) are inert: one token at position 0 whose K/V is not written (slot
// -1), reading block 0, its logits row its own; so are logits rows past the plan's.
void PackStep(const ForwardInput& plan, const MetaLayout& l, int64_t padded_seqs,
              const PackGeometry& g, char* dst);

// PackPaddedStep writes `plan` into a multi-token bucket's layout `l` (batch sequences of
// query_len tokens each: l.num_tokens = l.num_logits = batch · query_len): sequence s's tokens at
// rows [s · query_len, s · query_len + its count), then padding rows up to query_len: token 0 at
// the positions that follow, slot -1 (no K/V written), attending causally after the real rows
// (which never see them) over block 0 past the sequence's own blocks. Sequences past the plan
// hold query_len such tokens on no context. A logits row names the padded row of the plan's
// token. Needs every sequence's num_context_tokens + query_len ≤ MB · block_size.
void PackPaddedStep(const ForwardInput& plan, const MetaLayout& l, int64_t batch,
                    int64_t query_len, const PackGeometry& g, char* dst);

// A captured decode graph bucket: `batch` sequences of `query_len` query tokens each.
struct GraphBucket {
  int64_t batch = 0;
  int64_t query_len = 1;
};

// FindGraphBucket: the index in `buckets` of the graph `plan` replays, or -1 (an eager step).
//  * One token per sequence (a decode step): the plain bucket (query_len 1) of the smallest
//    batch ≥ the sequences and logits rows, when `bounded` (some sliding_kv_start > 0) only if
//    `bounded_captured`.
//  * Otherwise (some sequence has several query tokens, e.g. a speculative verify step), never
//    when `bounded`: the bucket of fewest tokens (batch · query_len) whose query_len holds the
//    longest row and whose batch holds the sequences, where every sequence's context plus
//    query_len stays within max_model_len (its padding rows' keys must stay in its block table).
int FindGraphBucket(const ForwardInput& plan, absl::Span<const GraphBucket> buckets,
                    int64_t max_model_len, bool bounded, bool bounded_captured);

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_STEP_META_H_
