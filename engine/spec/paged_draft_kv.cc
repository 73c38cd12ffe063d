#include "engine/spec/paged_draft_kv.h"

#include <optional>

#include "engine/kv/kv_block_allocator.h"

namespace sluice {

PagedDraftKv::PagedDraftKv(const KvCacheSpec& spec, const std::string& identity,
                           int64_t block_size, int64_t num_kv_blocks, bool enable_prefix_caching,
                           bool host_storage)
    : block_size_(block_size),
      kv_cache_(spec, num_kv_blocks, block_size, host_storage),
      hasher_(KvLayoutIdentity(identity, block_size, "f32", spec.num_layers,
                               spec.k_floats_per_token, spec.v_floats_per_token),
              block_size),
      cache_(num_kv_blocks, enable_prefix_caching, nullptr) {}

int32_t PagedDraftKv::AcquirePrefix(Blocks& b, absl::Span<const int32_t> hashed,
                                    int64_t max_blocks) {
  if (!b.table.empty() || !cache_.enabled()) return 0;
  hasher_.ExtendFullBlockHashes(b.root, hashed, b.hashes);
  b.table = cache_.AcquirePrefix(b.hashes, max_blocks);
  b.num_committed = static_cast<int32_t>(b.table.size());
  b.hashes.resize(b.table.size());
  return b.num_committed * static_cast<int32_t>(block_size_);
}

void PagedDraftKv::Commit(Blocks& b, absl::Span<const int32_t> hashed, int32_t full) {
  if (!cache_.enabled() || full <= b.num_committed) return;
  hasher_.ExtendFullBlockHashes(b.root, hashed.first(static_cast<size_t>(full * block_size_)),
                                b.hashes);
  const int32_t from = b.num_committed;
  const std::optional<BlockHash> parent =
      from == 0 ? std::nullopt : std::optional<BlockHash>(b.hashes[from - 1]);
  cache_.Register(absl::MakeConstSpan(b.table).subspan(from, full - from),
                  absl::MakeConstSpan(b.hashes).subspan(from, full - from), parent);
  b.num_committed = full;
}

bool PagedDraftKv::Grow(Blocks& b, int64_t num_kv_tokens) {
  const int64_t needed =
      NumBlocksFor(num_kv_tokens, block_size_) - static_cast<int64_t>(b.table.size());
  return needed <= 0 || cache_.Allocate(needed, b.table);
}

void PagedDraftKv::Free(Blocks& b) {
  cache_.Free(b.table);
  b.table.clear();
  b.hashes.clear();
  b.num_committed = 0;
}

}  // namespace sluice
