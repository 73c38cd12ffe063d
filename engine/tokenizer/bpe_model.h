// BpeModel: the BPE "model" stage of a HF tokenizer.json (Sennrich et al. 2016; merge order
// and tie-breaking as in HF tokenizers' `bpe/word.rs`: lowest merge rank first, leftmost
// position among equal ranks).
//
// The model works on raw bytes. In byte-level mode (a ByteLevel pre-tokenizer is present) the
// vocabulary strings are mapped back through the GPT-2 byte alphabet, so a word's initial
// symbols are its bytes and no byte->unicode string is ever built at encode time. Otherwise the
// initial symbols are the word's UTF-8 characters.
#ifndef SLUICE_ENGINE_TOKENIZER_BPE_MODEL_H_
#define SLUICE_ENGINE_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_word_cache.h"

namespace sluice {

// BpeModelOptions mirrors the BPE fields of tokenizer.json's "model" object.
struct BpeModelOptions {
  bool byte_level = true;      // initial symbols are bytes (see file comment)
  bool ignore_merges = false;  // a word found whole in the vocabulary is emitted as is
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;       // unknown characters become <0xXX> tokens
  size_t cache_capacity = 1 << 16;  // words; 0 disables the cache
};

class BpeModel {
 public:
  // Create builds the model. `vocab` holds (token string as in tokenizer.json, id); `merges`
  // holds the pairs in rank order. Errors: InvalidArgument when a merge names a token that is
  // not in the vocabulary, or when the unk token is unknown.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const std::vector<std::pair<std::string, int32_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeModelOptions options);

  // Tokenize appends the ids of one pre-tokenized word (raw bytes, any content) to `out`.
  // Thread-safe.
  void Tokenize(std::string_view word, std::vector<int32_t>* out) const;

  // TokenToId looks up a vocabulary string (tokenizer.json form, e.g. "Ġworld").
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // IdToToken returns the vocabulary string of `id`, or nullptr.
  const std::string* IdToToken(int32_t id) const;
  // max_id: the largest id in the vocabulary (-1 when empty).
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };

  explicit BpeModel(BpeModelOptions options);

  // InitialSymbols appends the ids of the word's bytes/characters (unknowns handled per
  // options) to `symbols`.
  void InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;
  const Merge* FindMerge(int32_t left, int32_t right) const;
  // MergeSmall / MergeLarge run the merge loop in place; same result, different complexity.
  void MergeSmall(std::vector<int32_t>* symbols) const;
  void MergeLarge(std::vector<int32_t>* symbols) const;

  BpeModelOptions options_;
  std::vector<std::string> id_to_token_;  // "" for holes in the id range
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  absl::flat_hash_map<std::string, int32_t> key_to_id_;  // raw bytes (or chars) -> id
  std::array<int32_t, 256> byte_to_id_{};                // byte-level mode; -1 if absent
  std::array<int32_t, 256> fallback_byte_id_{};          // <0xXX> tokens; -1 if absent
  std::optional<int32_t> unk_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
  mutable BpeWordCache cache_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_BPE_MODEL_H_
