#include "engine/tokenizer/bpe_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_regex_translate.h"

namespace sluice {
namespace {

// Per-thread PCRE2 match state: match data (only the whole-match pair is read) and a JIT
// stack large enough for long whitespace runs (`\s+(?!\S)` backtracks over the run).
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchState() {
    match_data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match_data);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

// Length of the (possibly ill-formed) UTF-8 unit at `pos`, to step over an empty match.
size_t UnitLength(std::string_view text, size_t pos) {
  const unsigned char b = static_cast<unsigned char>(text[pos]);
  size_t len = b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  size_t i = 1;
  while (i < len && pos + i < text.size() &&
         (static_cast<unsigned char>(text[pos + i]) & 0xC0) == 0x80) {
    ++i;
  }
  return i;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeRegex>> BpeRegex::Compile(std::string_view pattern,
                                                            bool literal) {
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const std::string translated =
      literal ? std::string(pattern) : TranslateOnigurumaPattern(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile split regex '", std::string(pattern), "' at offset ",
                     error_offset, ": ", reinterpret_cast<const char*>(message)));
  }
  std::unique_ptr<BpeRegex> regex(new BpeRegex());
  regex->code_ = code;
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return regex;
}

BpeRegex::~BpeRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void BpeRegex::ForEachMatch(std::string_view text,
                            absl::FunctionRef<void(size_t, size_t)> on_match) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& state = MatchState();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc =
        jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, state.match_data, state.context)
             : pcre2_match(code, subject, text.size(), pos, 0, state.match_data, state.context);
    if (rc < 0) return;  // no further match (or a resource error: the rest stays a gap)
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      on_match(begin, end);
      pos = end;
    } else {
      pos = begin + UnitLength(text, begin);  // empty match: step over one character
    }
  }
}

bool BpeRegex::MatchesAt(std::string_view text, size_t pos) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& state = MatchState();
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                             PCRE2_ANCHORED, state.match_data, state.context);
  return rc >= 0;
}

}  // namespace sluice
