// BpePreTokenizer: the `pre_tokenizer` stage of a HF tokenizer.json, splitting text into the
// words the BPE model tokenizes one by one.
//
// Supported (HF tokenizers semantics, `pre_tokenizers/{split,byte_level,metaspace,sequence}.rs`):
//   * Split {pattern: {Regex|String}, behavior: Removed|Isolated|MergedWithPrevious|
//            MergedWithNext|Contiguous, invert};
//   * ByteLevel {add_prefix_space, use_regex (GPT-2 pattern)}: the byte->unicode mapping itself
//     is implicit, because BpeModel works on raw bytes;
//   * Metaspace {replacement, prepend_scheme: always|first|never (or the older
//     add_prefix_space), split}: spaces become the replacement character, which is prepended
//     (scheme "first": only to the text's first piece) and, with split, starts each word;
//   * Sequence of the above; null (the whole text is one word).
// ByteLevel must come last in a Sequence (its output is in the byte alphabet, which a later
// regex would see differently); other types are InvalidArgument.
#ifndef SLUICE_ENGINE_TOKENIZER_BPE_PRETOKENIZER_H_
#define SLUICE_ENGINE_TOKENIZER_BPE_PRETOKENIZER_H_

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_regex.h"

namespace sluice {

class BpePreTokenizer {
 public:
  // How a Split step treats the matches (tokenizers' SplitDelimiterBehavior).
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

  // FromJson builds the pre-tokenizer from tokenizer.json's "pre_tokenizer" value (may be
  // null). Errors: InvalidArgument naming an unsupported type or behavior, or a bad regex.
  static absl::StatusOr<std::unique_ptr<BpePreTokenizer>> FromJson(const nlohmann::json& config);

  // byte_level: whether a ByteLevel step is present (the model then works on bytes).
  bool byte_level() const { return byte_level_; }

  // Split calls `on_word` for every word of `text`, in order; the views are valid only during
  // the call. `at_start`: `text` begins the input (Metaspace's scheme "first"). Thread-safe.
  void Split(std::string_view text, bool at_start,
             absl::FunctionRef<void(std::string_view)> on_word) const;

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel, kMetaspace } kind;
    std::unique_ptr<BpeRegex> regex;  // kSplit; kByteLevel with use_regex; kMetaspace with split
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // kByteLevel
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;  // kMetaspace
    std::string replacement;                                                 // kMetaspace
  };

  BpePreTokenizer() = default;
  static absl::Status AddStep(const nlohmann::json& config, BpePreTokenizer* pre);
  void Run(size_t step, std::string_view piece, bool at_start,
           absl::FunctionRef<void(std::string_view)> on_word) const;
  void RunSplit(const Step& step, size_t index, std::string_view piece, bool at_start,
                absl::FunctionRef<void(std::string_view)> on_word) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_BPE_PRETOKENIZER_H_
