// Byte-level helpers for GPT-2 style BPE tokenizers: the byte <-> unicode alphabet, UTF-8
// scanning with U+FFFD repair, and the Unicode White_Space property.
//
// The alphabet is GPT-2's `bytes_to_unicode` (openai/gpt-2 encoder.py, reused by HF tokenizers'
// ByteLevel pre-tokenizer and decoder): printable Latin-1 bytes map to themselves, the other 68
// bytes map, in increasing byte order, to U+0100, U+0101, ...
#ifndef SLUICE_ENGINE_TOKENIZER_BYTE_LEVEL_H_
#define SLUICE_ENGINE_TOKENIZER_BYTE_LEVEL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sluice::byte_level {

// ByteToCodepoint returns the code point that stands for `byte` in the byte-level alphabet.
char32_t ByteToCodepoint(uint8_t byte);

// CodepointToByte inverts ByteToCodepoint; nullopt for code points outside the alphabet.
std::optional<uint8_t> CodepointToByte(char32_t cp);

// AppendUtf8 appends the UTF-8 encoding of `cp` (must be a Unicode scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// EncodeBytes maps every byte of `bytes` to its alphabet character, UTF-8 encoded
// (e.g. " world" -> "Ġworld").
std::string EncodeBytes(std::string_view bytes);

// DecodeToken maps a byte-level token string back to raw bytes. Returns nullopt if the token
// is not valid UTF-8 or holds a character outside the alphabet (HF's ByteLevel decoder then
// keeps such a token's text unchanged).
std::optional<std::string> DecodeToken(std::string_view token);

// Utf8Sequence describes one step of a UTF-8 scan at some position.
struct Utf8Sequence {
  // Bytes consumed: the whole character when `valid`, else the maximal ill-formed subpart
  // (Unicode 15, section 3.9, "U+FFFD substitution of maximal subparts"), at least 1.
  size_t length = 0;
  bool valid = false;
  // True when the bytes are a proper prefix of a well-formed sequence cut by end of input.
  bool truncated = false;
  char32_t codepoint = 0;  // meaningful only when `valid`
};

// ScanUtf8 reads the sequence starting at `text[pos]` (pos < text.size()), following the
// well-formed byte ranges of Unicode Table 3-7.
Utf8Sequence ScanUtf8(std::string_view text, size_t pos);

// AppendUtf8Lossy appends `bytes` to `out`, replacing each maximal ill-formed subpart with
// U+FFFD, which is what Rust's `String::from_utf8_lossy` (used by HF decoders) does.
void AppendUtf8Lossy(std::string_view bytes, std::string* out);

// IncompleteUtf8TailLength returns how many bytes at the end of `bytes` form a proper prefix
// of a well-formed UTF-8 sequence (0..3): bytes that may still become a character.
size_t IncompleteUtf8TailLength(std::string_view bytes);

// IsUnicodeWhitespace reports the Unicode White_Space property (Rust `char::is_whitespace`).
bool IsUnicodeWhitespace(char32_t cp);

}  // namespace sluice::byte_level

#endif  // SLUICE_ENGINE_TOKENIZER_BYTE_LEVEL_H_
