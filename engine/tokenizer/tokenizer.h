// Tokenizer: BPE from a Hugging Face `tokenizer.json`: byte-level (GPT-2, Llama 3, Qwen) and
// SentencePiece-style (Llama 2, Mistral, Gemma: Metaspace / byte_fallback).
//
// Pipeline (tokenizers' order): added tokens with `normalized: false` are split out first,
// then the normalizer (NFC/NFKC/..., Lowercase, Replace, Prepend, Strip), the `normalized`
// added tokens, the pre-tokenizer (regex Split, ByteLevel, Metaspace), BPE merges by rank, the
// post-processor (TemplateProcessing, e.g. prepend BOS). Every other tokenizer.json feature is
// refused at load with its name.
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

  // Decode returns the text of `ids` through the tokenizer.json decoder, exactly as HF's
  // decode (e.g. Llama 2's Strip drops the text's first space; invalid UTF-8 becomes U+FFFD).
  // skip_special_tokens drops special added tokens.
  virtual std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // DecodeBytes returns the raw bytes of `ids` as a continuation of earlier text, without
  // UTF-8 repair (for incremental detokenization, which must not emit half a character):
  // per-token decoding only, so SentencePiece's "▁Paris" gives " Paris" here, while Decode of
  // that id alone gives "Paris" (start-of-text rules such as Strip are not applied).
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
