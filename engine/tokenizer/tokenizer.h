// Tokenizer: byte-level BPE from a Hugging Face `tokenizer.json`.
//
// Pipeline (tokenizers' order): added/special tokens are split out first (when parsing
// special tokens), then normalizer, pre-tokenizer (regex split + ByteLevel byte→unicode
// mapping), BPE merges by rank, post-processor (TemplateProcessing, e.g. prepend BOS).
#ifndef SLUICE_ENGINE_TOKENIZER_TOKENIZER_H_
#define SLUICE_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // FromFile loads `tokenizer.json`. Errors: NotFound, InvalidArgument (malformed JSON, an
  // unsupported model/normalizer/pre-tokenizer/decoder type, named in the message).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJsonText(const std::string& json_text);

  // Encode tokenizes UTF-8 `text`. add_special_tokens applies the post-processor (e.g. BOS).
  // parse_special=true matches added special-token strings in the text to their ids (the HF
  // default); false tokenizes them as ordinary text (`split_special_tokens=True`).
  // Invalid UTF-8 is handled byte-wise (never an error, never a crash).
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens,
                                      bool parse_special = true) const = 0;

  // Decode returns the text of `ids` (ByteLevel decoder). Bytes that do not form valid UTF-8
  // are replaced with U+FFFD as HF does. skip_special_tokens drops special added tokens.
  virtual std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // DecodeBytes returns the raw bytes of `ids` without UTF-8 repair (for incremental
  // detokenization, which must not emit half a character).
  virtual std::string DecodeBytes(absl::Span<const int32_t> ids,
                                  bool skip_special_tokens) const = 0;

  // IdToToken returns the vocabulary string (byte-level form, e.g. "Ġworld"); "" if unknown.
  virtual std::string IdToToken(int32_t id) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  // vocab_size: 1 + the largest id in the vocabulary or the added tokens.
  virtual int32_t vocab_size() const = 0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_TOKENIZER_H_
