#include "engine/tokenizer/bpe_pretokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_json_util.h"

namespace sluice {
namespace {

absl::StatusOr<BpePreTokenizer::Behavior> ParseBehavior(const nlohmann::json& config) {
  const nlohmann::json* v = bpe_json::Field(config, "behavior");
  const std::string name = v != nullptr && v->is_string() ? v->get<std::string>() : "";
  using B = BpePreTokenizer::Behavior;
  if (name == "Removed") return B::kRemoved;
  if (name == "Isolated") return B::kIsolated;
  if (name == "MergedWithPrevious") return B::kMergedWithPrevious;
  if (name == "MergedWithNext") return B::kMergedWithNext;
  if (name == "Contiguous") return B::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported Split pre-tokenizer behavior '", name, "'"));
}

// A span of a piece with whether it is a delimiter (a match, after `invert`).
struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpePreTokenizer>> BpePreTokenizer::FromJson(
    const nlohmann::json& config) {
  std::unique_ptr<BpePreTokenizer> pre(new BpePreTokenizer());
  if (!config.is_null()) {
    absl::Status status = AddStep(config, pre.get());
    if (!status.ok()) return status;
  }
  for (size_t i = 0; i + 1 < pre->steps_.size(); ++i) {
    if (pre->steps_[i].kind == Step::Kind::kByteLevel) {
      return absl::InvalidArgumentError(
          "unsupported pre-tokenizer: ByteLevel must be the last step of a Sequence");
    }
  }
  return pre;
}

absl::Status BpePreTokenizer::AddStep(const nlohmann::json& config, BpePreTokenizer* pre) {
  const std::string type = bpe_json::Type(config);
  if (type == "Sequence") {
    const nlohmann::json* list = bpe_json::Field(config, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("Sequence pre-tokenizer without 'pretokenizers' list");
    }
    for (const nlohmann::json& item : *list) {
      absl::Status status = AddStep(item, pre);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "Split") {
    step.kind = Step::Kind::kSplit;
    const nlohmann::json* pattern = bpe_json::Field(config, "pattern");
    const nlohmann::json* regex = pattern != nullptr ? bpe_json::Field(*pattern, "Regex") : nullptr;
    const nlohmann::json* literal =
        pattern != nullptr ? bpe_json::Field(*pattern, "String") : nullptr;
    absl::StatusOr<std::unique_ptr<BpeRegex>> compiled;
    if (regex != nullptr && regex->is_string()) {
      compiled = BpeRegex::Compile(regex->get<std::string>(), /*literal=*/false);
    } else if (literal != nullptr && literal->is_string()) {
      compiled = BpeRegex::Compile(literal->get<std::string>(), /*literal=*/true);
    } else {
      return absl::InvalidArgumentError("Split pre-tokenizer needs a Regex or String pattern");
    }
    if (!compiled.ok()) return compiled.status();
    step.regex = *std::move(compiled);
    absl::StatusOr<Behavior> behavior = ParseBehavior(config);
    if (!behavior.ok()) return behavior.status();
    step.behavior = *behavior;
    step.invert = bpe_json::Bool(config, "invert", false);
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    step.add_prefix_space = bpe_json::Bool(config, "add_prefix_space", true);
    if (bpe_json::Bool(config, "use_regex", true)) {
      absl::StatusOr<std::unique_ptr<BpeRegex>> compiled =
          BpeRegex::Compile(kGpt2SplitPattern, /*literal=*/false);
      if (!compiled.ok()) return compiled.status();
      step.regex = *std::move(compiled);
    }
    pre->byte_level_ = true;
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    absl::StatusOr<std::string> replacement =
        bpe_json::String(config, "replacement", "Metaspace pre-tokenizer");
    if (!replacement.ok()) return replacement.status();
    if (replacement->empty()) {
      return absl::InvalidArgumentError("Metaspace pre-tokenizer with an empty replacement");
    }
    step.replacement = *std::move(replacement);
    const nlohmann::json* scheme = bpe_json::Field(config, "prepend_scheme");
    if (scheme != nullptr && scheme->is_string()) {
      const std::string name = scheme->get<std::string>();
      if (name == "always") {
        step.prepend = Step::Prepend::kAlways;
      } else if (name == "first") {
        step.prepend = Step::Prepend::kFirst;
      } else if (name == "never") {
        step.prepend = Step::Prepend::kNever;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("unsupported Metaspace prepend_scheme '", name, "'"));
      }
    } else {
      // Files written before prepend_scheme existed carry add_prefix_space instead.
      step.prepend = bpe_json::Bool(config, "add_prefix_space", true) ? Step::Prepend::kAlways
                                                                      : Step::Prepend::kNever;
    }
    if (bpe_json::Bool(config, "split", true)) {
      absl::StatusOr<std::unique_ptr<BpeRegex>> compiled =
          BpeRegex::Compile(step.replacement, /*literal=*/true);
      if (!compiled.ok()) return compiled.status();
      step.regex = *std::move(compiled);
      step.behavior = Behavior::kMergedWithNext;
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unsupported pre-tokenizer type '", type, "'"));
  }
  pre->steps_.push_back(std::move(step));
  return absl::OkStatus();
}

void BpePreTokenizer::Split(std::string_view text, bool at_start,
                            absl::FunctionRef<void(std::string_view)> on_word) const {
  if (text.empty()) return;
  Run(0, text, at_start, on_word);
}

void BpePreTokenizer::Run(size_t index, std::string_view piece, bool at_start,
                          absl::FunctionRef<void(std::string_view)> on_word) const {
  if (piece.empty()) return;
  if (index == steps_.size()) {
    on_word(piece);
    return;
  }
  const Step& step = steps_[index];
  if (step.kind == Step::Kind::kSplit) {
    RunSplit(step, index, piece, at_start, on_word);
    return;
  }
  if (step.kind == Step::Kind::kMetaspace) {
    // Spaces become the replacement, then the prefix (unless the piece already starts with it).
    std::string replaced;
    replaced.reserve(piece.size() + step.replacement.size() + 8);
    for (char c : piece) {
      if (c == ' ') {
        replaced.append(step.replacement);
      } else {
        replaced.push_back(c);
      }
    }
    if ((step.prepend == Step::Prepend::kAlways ||
         (step.prepend == Step::Prepend::kFirst && at_start)) &&
        replaced.compare(0, step.replacement.size(), step.replacement) != 0) {
      replaced.insert(0, step.replacement);
    }
    if (step.regex == nullptr) {
      Run(index + 1, replaced, at_start, on_word);
    } else {
      RunSplit(step, index, replaced, at_start, on_word);
    }
    return;
  }
  // ByteLevel: optional prefix space, then the GPT-2 split (Isolated) if use_regex.
  std::string prefixed;
  if (step.add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece);
    piece = prefixed;
  }
  if (step.regex == nullptr) {
    Run(index + 1, piece, at_start, on_word);
    return;
  }
  RunSplit(step, index, piece, at_start, on_word);
}

void BpePreTokenizer::RunSplit(const Step& step, size_t index, std::string_view piece,
                               bool at_start,
                               absl::FunctionRef<void(std::string_view)> on_word) const {
  const auto emit = [&](size_t begin, size_t end) {
    if (end > begin)
      Run(index + 1, piece.substr(begin, end - begin), at_start && begin == 0, on_word);
  };
  if (step.behavior == Behavior::kIsolated) {
    // Every match and every gap is its own word (invert does not change the pieces).
    size_t last = 0;
    step.regex->ForEachMatch(piece, [&](size_t begin, size_t end) {
      emit(last, begin);
      emit(begin, end);
      last = end;
    });
    emit(last, piece.size());
    return;
  }
  std::vector<Span> spans;
  size_t last = 0;
  step.regex->ForEachMatch(piece, [&](size_t begin, size_t end) {
    if (begin > last) spans.push_back({last, begin, step.invert});
    spans.push_back({begin, end, !step.invert});
    last = end;
  });
  if (last < piece.size()) spans.push_back({last, piece.size(), step.invert});

  // Delimiter handling as in tokenizers' NormalizedString::split.
  std::vector<Span> out;
  bool previous_match = false;
  switch (step.behavior) {
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) out.push_back(s);
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kIsolated:
      break;
  }
  for (const Span& s : out) emit(s.begin, s.end);
}

}  // namespace sluice
