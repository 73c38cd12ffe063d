#include "engine/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>

#include <array>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_json_util.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/replace_pattern.h"

namespace sluice {
namespace {

// MaxByte returns the largest byte of `text` (0 when empty), eight bytes at a time.
uint8_t MaxByte(std::string_view text) {
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 8 <= text.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, text.data() + i, 8);
    acc |= word;
    if (acc & 0x8080808080808080ull) break;  // non-ASCII: finish byte-wise
  }
  uint8_t max = 0;
  for (size_t j = 0; j < 8; ++j) max = std::max<uint8_t>(max, (acc >> (8 * j)) & 0xFF);
  for (; i < text.size(); ++i) max = std::max(max, static_cast<uint8_t>(text[i]));
  return max;
}

// The stable-character bitmaps cover planes 0-3 (every script, CJK extensions, emoji); a
// character above them always takes the ICU path.
constexpr char32_t kStableTableSize = 0x40000;

// The four ICU normalizers restricted to Unicode 9.0 (see the header), built once, with a
// bitmap per form of the code points that are "stable": quick check Yes and combining class 0
// (or outside Unicode 9.0, which the filter passes through). A text made only of stable
// characters is already normalized (nothing decomposes, nothing reorders, and a composition
// needs a second character whose quick check is Maybe), so it needs no ICU call at all.
struct UnicodeNormalizers {
  icu::UnicodeSet unicode9;
  std::array<std::unique_ptr<icu::FilteredNormalizer2>, 4> forms;  // NFC, NFD, NFKC, NFKD
  std::array<std::vector<uint64_t>, 4> stable;                     // bit per code point
  UErrorCode status = U_ZERO_ERROR;
};

constexpr UProperty kQuickCheck[4] = {UCHAR_NFC_QUICK_CHECK, UCHAR_NFD_QUICK_CHECK,
                                      UCHAR_NFKC_QUICK_CHECK, UCHAR_NFKD_QUICK_CHECK};

const UnicodeNormalizers& Normalizers() {
  static const UnicodeNormalizers* const normalizers = [] {
    auto* n = new UnicodeNormalizers();
    // [:age=9.0:] holds every code point assigned in Unicode 9.0 or earlier.
    n->unicode9.applyPattern(icu::UnicodeString(u"[:age=9.0:]"), n->status);
    if (U_FAILURE(n->status)) return n;
    n->unicode9.freeze();
    const icu::Normalizer2* base[4] = {
        icu::Normalizer2::getNFCInstance(n->status), icu::Normalizer2::getNFDInstance(n->status),
        icu::Normalizer2::getNFKCInstance(n->status), icu::Normalizer2::getNFKDInstance(n->status)};
    if (U_FAILURE(n->status)) return n;
    for (int i = 0; i < 4; ++i) {
      n->forms[i] = std::make_unique<icu::FilteredNormalizer2>(*base[i], n->unicode9);
      n->stable[i].assign(kStableTableSize / 64, 0);
      for (char32_t c = 0; c < kStableTableSize; ++c) {
        const UChar32 u = static_cast<UChar32>(c);
        const bool stable = !n->unicode9.contains(u) ||
                            (u_getIntPropertyValue(u, kQuickCheck[i]) == UNORM_YES &&
                             u_getCombiningClass(u) == 0);
        if (stable) n->stable[i][c / 64] |= uint64_t{1} << (c % 64);
      }
    }
    return n;
  }();
  return *normalizers;
}

// NormalizeValidUtf8 appends the normalization of well-formed UTF-8 `in` to `out`.
void NormalizeValidUtf8(const icu::Normalizer2& form, std::string_view in, std::string* out) {
  UErrorCode status = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(out);
  form.normalizeUTF8(0, icu::StringPiece(in.data(), static_cast<int32_t>(in.size())), sink, nullptr,
                     status);
  if (U_FAILURE(status)) out->append(in);  // cannot happen for valid input; keep the text
}

bool ApplyUnicodeForm(int index, std::string_view in, std::string* out) {
  // Fast paths: ASCII is invariant under every form; under NFC so is any text below U+0300
  // (lead bytes < 0xCC), since nothing there decomposes and combining marks start at U+0300.
  const uint8_t max = MaxByte(in);
  if (max < 0x80 || (index == 0 && max < 0xCC)) return false;
  const UnicodeNormalizers& normalizers = Normalizers();
  const icu::Normalizer2& form = *normalizers.forms[index];
  const std::vector<uint64_t>& stable = normalizers.stable[index];
  // One pass: are all characters stable (then nothing changes), and is the text valid UTF-8?
  bool all_stable = true;
  bool valid = true;
  for (size_t pos = 0; pos < in.size();) {
    const uint8_t b = static_cast<uint8_t>(in[pos]);
    if (b < 0x80) {
      ++pos;
      continue;
    }
    const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(in, pos);
    pos += seq.length;
    if (!seq.valid) {
      valid = false;
      break;
    }
    if (seq.codepoint >= kStableTableSize ||
        !((stable[seq.codepoint / 64] >> (seq.codepoint % 64)) & 1)) {
      all_stable = false;
    }
  }
  if (valid && all_stable) return false;
  if (valid) {
    out->clear();
    NormalizeValidUtf8(form, in, out);
    return *out != in;
  }
  // Ill-formed bytes are kept as they are (HF only ever sees valid UTF-8); the well-formed
  // stretches between them are normalized.
  out->clear();
  size_t run = 0;  // start of the current well-formed stretch
  size_t pos = 0;
  while (pos < in.size()) {
    const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(in, pos);
    if (seq.valid) {
      pos += seq.length;
      continue;
    }
    NormalizeValidUtf8(form, in.substr(run, pos - run), out);
    out->append(in.substr(pos, seq.length));
    pos += seq.length;
    run = pos;
  }
  NormalizeValidUtf8(form, in.substr(run), out);
  return true;
}

// NewerLowercase returns the lowercase of the uppercase letters that Unicode 16 and 17 added
// (Garay, Beria Erfe and Latin additions), which Rust's std (what HF uses) knows and Debian's
// ICU 72 (Unicode 15) does not; 0 for any other character.
char32_t NewerLowercase(char32_t c) {
  if (c >= 0x10D50 && c <= 0x10D65) return c + 0x20;
  if (c >= 0x16EA0 && c <= 0x16EB8) return c + 0x1B;
  switch (c) {
    case 0x1C89: return 0x1C8A;
    case 0xA7CB: return 0x0264;
    case 0xA7CC: return 0xA7CD;
    case 0xA7CE: return 0xA7CF;
    case 0xA7D2: return 0xA7D3;
    case 0xA7D4: return 0xA7D5;
    case 0xA7DA: return 0xA7DB;
    case 0xA7DC: return 0x019B;
    default: return 0;
  }
}

// Lowercase maps each character with Rust's `char::to_lowercase` (what HF uses): the simple
// lowercase mapping, except U+0130, the one character whose unconditional full mapping is two
// characters. No context (final sigma) rules apply.
bool ApplyLowercase(std::string_view in, std::string* out) {
  bool any = false;
  for (char c : in) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (b >= 0x80 || (b >= 'A' && b <= 'Z')) {
      any = true;
      break;
    }
  }
  if (!any) return false;
  out->clear();
  out->reserve(in.size());
  for (size_t pos = 0; pos < in.size();) {
    const uint8_t b = static_cast<uint8_t>(in[pos]);
    if (b < 0x80) {
      out->push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b + 32) : static_cast<char>(b));
      ++pos;
      continue;
    }
    const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(in, pos);
    if (!seq.valid) {
      out->append(in.substr(pos, seq.length));
    } else if (seq.codepoint == 0x130) {
      out->append("i\xCC\x87");  // U+0069 U+0307
    } else if (const char32_t newer = NewerLowercase(seq.codepoint); newer != 0) {
      byte_level::AppendUtf8(newer, out);
    } else {
      byte_level::AppendUtf8(static_cast<char32_t>(u_tolower(static_cast<UChar32>(seq.codepoint))),
                             out);
    }
    pos += seq.length;
  }
  return true;
}

// StripAccents drops combining marks (general category M: Mn, Mc, Me) of Unicode 9.0, as HF's
// StripAccents does with its Unicode 9.0-era category tables.
bool ApplyStripAccents(std::string_view in, std::string* out) {
  if (MaxByte(in) < 0xCC) return false;  // no character at or above U+0300
  const icu::UnicodeSet& unicode9 = Normalizers().unicode9;
  out->clear();
  bool changed = false;
  for (size_t pos = 0; pos < in.size();) {
    const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(in, pos);
    const UChar32 c = static_cast<UChar32>(seq.codepoint);
    if (seq.valid && (U_GET_GC_MASK(c) & U_GC_M_MASK) != 0 && unicode9.contains(c)) {
      changed = true;
    } else {
      out->append(in.substr(pos, seq.length));
    }
    pos += seq.length;
  }
  return changed;
}

bool ApplyStrip(bool left, bool right, std::string_view in, std::string* out) {
  size_t begin = 0;
  size_t end = in.size();
  if (left) {
    while (begin < end) {
      const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(in, begin);
      if (!seq.valid || !byte_level::IsUnicodeWhitespace(seq.codepoint)) break;
      begin += seq.length;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>(in[start]) & 0xC0) == 0x80 && end - start < 4) {
        --start;
      }
      const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(in, start);
      if (!seq.valid || start + seq.length != end ||
          !byte_level::IsUnicodeWhitespace(seq.codepoint)) {
        break;
      }
      end = start;
    }
  }
  if (begin == 0 && end == in.size()) return false;
  out->assign(in.substr(begin, end - begin));
  return true;
}

bool ApplyReplaceLiteral(std::string_view pattern, std::string_view content, std::string_view in,
                         std::string* out) {
  if (pattern.empty()) return false;
  size_t found = in.find(pattern);
  if (found == std::string_view::npos) return false;
  out->clear();
  out->reserve(in.size() + in.size() / 4);
  size_t last = 0;
  while (found != std::string_view::npos) {
    out->append(in.substr(last, found - last));
    out->append(content);
    last = found + pattern.size();
    found = in.find(pattern, last);
  }
  out->append(in.substr(last));
  return true;
}

bool ApplyReplaceRegex(const BpeRegex& regex, std::string_view content, std::string_view in,
                       std::string* out) {
  bool any = false;
  size_t last = 0;
  std::string result;
  regex.ForEachMatch(in, [&](size_t begin, size_t end) {
    any = true;
    result.append(in.substr(last, begin - last));
    result.append(content);
    last = end;
  });
  if (!any) return false;
  result.append(in.substr(last));
  *out = std::move(result);
  return true;
}

}  // namespace

Normalizer::~Normalizer() = default;

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  std::unique_ptr<Normalizer> normalizer(new Normalizer());
  absl::Status status = AddStep(config, normalizer.get());
  if (!status.ok()) return status;
  if (normalizer->steps_.empty()) return nullptr;  // e.g. an empty Sequence
  return normalizer;
}

absl::Status Normalizer::AddStep(const nlohmann::json& config, Normalizer* normalizer) {
  const std::string type = bpe_json::Type(config);
  if (type == "Sequence") {
    const nlohmann::json* list = bpe_json::Field(config, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("Sequence normalizer without a 'normalizers' list");
    }
    for (const nlohmann::json& item : *list) {
      absl::Status status = AddStep(item, normalizer);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = type == "NFC"    ? Kind::kNfc
                : type == "NFD"  ? Kind::kNfd
                : type == "NFKC" ? Kind::kNfkc
                                 : Kind::kNfkd;
    if (U_FAILURE(Normalizers().status)) {
      return absl::InternalError(absl::StrCat("ICU cannot provide the ", type,
                                              " normalizer: ", u_errorName(Normalizers().status)));
    }
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "StripAccents") {
    step.kind = Kind::kStripAccents;
    if (U_FAILURE(Normalizers().status)) {
      return absl::InternalError(absl::StrCat("ICU cannot provide the Unicode 9.0 set: ",
                                              u_errorName(Normalizers().status)));
    }
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.strip_left = bpe_json::Bool(config, "strip_left", true);
    step.strip_right = bpe_json::Bool(config, "strip_right", true);
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    absl::StatusOr<std::string> prepend = bpe_json::String(config, "prepend", "Prepend normalizer");
    if (!prepend.ok()) return prepend.status();
    step.pattern = *std::move(prepend);
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    absl::StatusOr<std::string> content = bpe_json::String(config, "content", "Replace normalizer");
    if (!content.ok()) return content.status();
    step.content = *std::move(content);
    absl::Status st = ParseReplacePattern(config, "Replace normalizer", &step.pattern, &step.regex);
    if (!st.ok()) return st;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unsupported normalizer type '", type, "'"));
  }
  normalizer->steps_.push_back(std::move(step));
  return absl::OkStatus();
}

bool Normalizer::Apply(const Step& step, std::string_view in, std::string* out) {
  switch (step.kind) {
    case Kind::kNfc:
      return ApplyUnicodeForm(0, in, out);
    case Kind::kNfd:
      return ApplyUnicodeForm(1, in, out);
    case Kind::kNfkc:
      return ApplyUnicodeForm(2, in, out);
    case Kind::kNfkd:
      return ApplyUnicodeForm(3, in, out);
    case Kind::kLowercase:
      return ApplyLowercase(in, out);
    case Kind::kStripAccents:
      return ApplyStripAccents(in, out);
    case Kind::kStrip:
      return ApplyStrip(step.strip_left, step.strip_right, in, out);
    case Kind::kPrepend:
      // HF prepends only to a non-empty string.
      if (in.empty() || step.pattern.empty()) return false;
      out->clear();
      out->reserve(step.pattern.size() + in.size());
      out->append(step.pattern);
      out->append(in);
      return true;
    case Kind::kReplace:
      return step.regex != nullptr ? ApplyReplaceRegex(*step.regex, step.content, in, out)
                                   : ApplyReplaceLiteral(step.pattern, step.content, in, out);
  }
  return false;
}

std::string_view Normalizer::Normalize(std::string_view text, std::string* buffer) const {
  std::string_view current = text;
  std::string scratch;
  for (const Step& step : steps_) {
    // `current` may point into `buffer`, so a changing step writes to `scratch` first.
    if (!Apply(step, current, &scratch)) continue;
    buffer->swap(scratch);
    current = *buffer;
  }
  return current;
}

}  // namespace sluice
