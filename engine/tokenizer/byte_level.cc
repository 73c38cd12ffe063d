#include "engine/tokenizer/byte_level.h"

#include <array>

namespace sluice::byte_level {
namespace {

// Printable bytes that stand for themselves in GPT-2's bytes_to_unicode.
constexpr bool IsSelfMapped(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Alphabet {
  std::array<char32_t, 256> byte_to_cp{};
  // Code points of the alphabet are all below U+0144.
  std::array<int16_t, 0x144> cp_to_byte{};

  Alphabet() {
    cp_to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = IsSelfMapped(b) ? static_cast<char32_t>(b) : next++;
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& GetAlphabet() {
  static const Alphabet* const kAlphabet = new Alphabet();
  return *kAlphabet;
}

}  // namespace

char32_t ByteToCodepoint(uint8_t byte) { return GetAlphabet().byte_to_cp[byte]; }

std::optional<uint8_t> CodepointToByte(char32_t cp) {
  const Alphabet& a = GetAlphabet();
  if (cp >= a.cp_to_byte.size() || a.cp_to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(a.cp_to_byte[cp]);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeBytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), &out);
  return out;
}

std::optional<std::string> DecodeToken(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const Utf8Sequence seq = ScanUtf8(token, pos);
    if (!seq.valid) return std::nullopt;
    const std::optional<uint8_t> b = CodepointToByte(seq.codepoint);
    if (!b.has_value()) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += seq.length;
  }
  return out;
}

Utf8Sequence ScanUtf8(std::string_view text, size_t pos) {
  const auto at = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  Utf8Sequence seq;
  const uint8_t lead = at(pos);
  if (lead < 0x80) {
    seq.length = 1;
    seq.valid = true;
    seq.codepoint = lead;
    return seq;
  }
  // Number of continuation bytes and the allowed range of the first one (Table 3-7).
  size_t num_cont = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t cp = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    num_cont = 1;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    num_cont = 2;
    cp = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    num_cont = 3;
    cp = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    seq.length = 1;  // 0x80..0xC1, 0xF5..0xFF never start a sequence
    return seq;
  }
  size_t len = 1;
  for (size_t k = 0; k < num_cont; ++k) {
    if (pos + len >= text.size()) {
      seq.length = len;
      seq.truncated = true;
      return seq;
    }
    const uint8_t c = at(pos + len);
    const uint8_t min = k == 0 ? lo : 0x80;
    const uint8_t max = k == 0 ? hi : 0xBF;
    if (c < min || c > max) {
      seq.length = len;
      return seq;
    }
    cp = (cp << 6) | (c & 0x3F);
    ++len;
  }
  seq.length = len;
  seq.valid = true;
  seq.codepoint = cp;
  return seq;
}

void AppendUtf8Lossy(std::string_view bytes, std::string* out) {
  size_t pos = 0;
  size_t run_start = 0;  // start of the current run of valid bytes, copied in one go
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Sequence seq = ScanUtf8(bytes, pos);
    if (seq.valid) {
      pos += seq.length;
      continue;
    }
    out->append(bytes.data() + run_start, pos - run_start);
    out->append("\xEF\xBF\xBD");
    pos += seq.length;
    run_start = pos;
  }
  out->append(bytes.data() + run_start, pos - run_start);
}

size_t IncompleteUtf8TailLength(std::string_view bytes) {
  // A proper prefix is at most 3 bytes long; find its lead byte among the last 3 bytes.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t pos = n - back;
    const uint8_t b = static_cast<uint8_t>(bytes[pos]);
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: keep looking for a lead
    const Utf8Sequence seq = ScanUtf8(bytes, pos);
    return (seq.truncated && seq.length == back) ? back : 0;
  }
  return 0;
}

bool IsUnicodeWhitespace(char32_t cp) {
  // Unicode 15 PropList.txt, White_Space.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace sluice::byte_level
