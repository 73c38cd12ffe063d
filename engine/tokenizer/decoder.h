// Decoder: the `decoder` stage of a HF tokenizer.json, turning token strings back into text
// (tokenizers' `decoders/*.rs` decode_chain semantics, applied in order, then concatenated).
//
// Supported types: ByteLevel, Replace {pattern: String|Regex, content}, ByteFallback (<0xXX>
// tokens become bytes; a run that is not valid UTF-8 becomes one U+FFFD per byte), Fuse, Strip
// {content, start, stop}, Metaspace {replacement, prepend_scheme|add_prefix_space}, and
// Sequence of these; null joins the tokens with spaces, as HF does. Others are
// InvalidArgument naming the type.
#ifndef SLUICE_ENGINE_TOKENIZER_DECODER_H_
#define SLUICE_ENGINE_TOKENIZER_DECODER_H_

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_regex.h"

namespace sluice {

class Decoder {
 public:
  static absl::StatusOr<std::unique_ptr<Decoder>> FromJson(const nlohmann::json& config);
  ~Decoder();

  // byte_level_only: the decoder is exactly ByteLevel, so a sequence's text is the UTF-8
  // repair of the concatenated TokenBytes (the fast path).
  bool byte_level_only() const { return byte_level_only_; }

  // Decode returns the text of `tokens` (vocabulary strings, in order), exactly as HF's
  // `decoder.decode(tokens)` (or the space join without a decoder).
  std::string Decode(const std::vector<std::string_view>& tokens) const;

  // TokenBytes returns the raw bytes `token` adds to a text it continues: the per-token steps
  // (ByteLevel and ByteFallback to bytes, Replace, Metaspace's replacement to a space), but not
  // the rules that only apply at the start of a text (Strip, Metaspace's first-token prefix)
  // nor UTF-8 repair. Incremental detokenization concatenates these.
  std::string TokenBytes(std::string_view token) const;

  // joins_with_spaces: no decoder at all (HF joins token strings with " ").
  bool joins_with_spaces() const { return steps_.empty() && !has_config_; }

 private:
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  struct Step {
    Kind kind;
    std::string pattern;              // kReplace literal; kStrip / kMetaspace: the character
    std::unique_ptr<BpeRegex> regex;  // kReplace with a Regex pattern
    std::string content;              // kReplace
    size_t start = 0;                 // kStrip
    size_t stop = 0;                  // kStrip
    bool prepend = true;              // kMetaspace: prepend_scheme != never
  };

  Decoder() = default;
  static absl::Status AddStep(const nlohmann::json& config, Decoder* decoder);

  std::vector<Step> steps_;
  bool has_config_ = false;
  bool byte_level_only_ = false;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_DECODER_H_
