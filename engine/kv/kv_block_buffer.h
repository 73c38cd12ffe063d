// KvBlockBuffer: host bytes of serialized KV blocks (kv_connector.h's block layout), owned and
// move-only. Either heap memory, or a lease on memory a KV connector's backend lent out
// (KvConnector::AllocateBlockBuffer), e.g. a slice of a host arena registered with its UCX
// agent: the engine gathers blocks straight into it (device -> pinned staging slots -> this
// buffer) and the kvstore client moves it to and from the store by one-sided RMA, with no
// further copy and no bytes on the gRPC path. The lease is given back when the buffer dies.
#ifndef SLUICE_ENGINE_KV_KV_BLOCK_BUFFER_H_
#define SLUICE_ENGINE_KV_KV_BLOCK_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace sluice {

class KvBlockBuffer {
 public:
  // Release gives a lent buffer back (any thread; once).
  using Release = std::function<void(uint8_t* data, size_t size)>;

  KvBlockBuffer() = default;
  explicit KvBlockBuffer(size_t size) : heap_(size), data_(heap_.data()), size_(size) {}
  explicit KvBlockBuffer(std::vector<uint8_t> bytes)
      : heap_(std::move(bytes)), data_(heap_.data()), size_(heap_.size()) {}
  // Lent memory: [data, data + size) until `release` runs (at destruction).
  KvBlockBuffer(uint8_t* data, size_t size, Release release)
      : data_(data), size_(size), lent_size_(size), release_(std::move(release)) {}
  ~KvBlockBuffer() { Reset(); }
  KvBlockBuffer(KvBlockBuffer&& other) noexcept { *this = std::move(other); }
  KvBlockBuffer& operator=(KvBlockBuffer&& other) noexcept {
    if (this == &other) return *this;
    Reset();
    const bool lent = other.release_ != nullptr;
    heap_ = std::move(other.heap_);
    data_ = lent ? other.data_ : heap_.data();
    size_ = other.size_;
    lent_size_ = other.lent_size_;
    release_ = std::move(other.release_);
    other.release_ = nullptr;
    other.heap_.clear();
    other.data_ = nullptr;
    other.size_ = 0;
    return *this;
  }
  KvBlockBuffer(const KvBlockBuffer&) = delete;
  KvBlockBuffer& operator=(const KvBlockBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // lent: memory of a backend (registered for RMA), not the heap.
  bool lent() const { return release_ != nullptr; }
  absl::Span<uint8_t> span() const { return absl::MakeSpan(data_, size_); }
  // Shrink keeps the first `size` bytes (size <= size()); lent memory stays lent as a whole.
  void Shrink(size_t size) {
    if (size < size_) size_ = size;
  }

 private:
  void Reset() {
    if (release_ != nullptr) {
      Release release = std::move(release_);
      release_ = nullptr;
      release(data_, lent_size_);
    }
    heap_.clear();
    data_ = nullptr;
    size_ = 0;
  }

  std::vector<uint8_t> heap_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t lent_size_ = 0;  // what release gives back
  Release release_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_KV_BLOCK_BUFFER_H_
