#include "engine/tokenizer/decoder.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_json_util.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/replace_pattern.h"

namespace sluice {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// FallbackByte parses a "<0xXX>" token (HF: six bytes, hex digits of either case).
std::optional<uint8_t> FallbackByte(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return std::nullopt;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    value = value * 16 + digit;
  }
  return static_cast<uint8_t>(value);
}

bool IsValidUtf8(std::string_view bytes) {
  for (size_t pos = 0; pos < bytes.size();) {
    const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(bytes, pos);
    if (!seq.valid) return false;
    pos += seq.length;
  }
  return true;
}

std::string ReplaceAll(std::string_view in, std::string_view pattern, std::string_view content) {
  std::string out;
  if (pattern.empty()) return std::string(in);
  size_t last = 0;
  for (size_t found = in.find(pattern); found != std::string_view::npos;
       found = in.find(pattern, last)) {
    out.append(in.substr(last, found - last));
    out.append(content);
    last = found + pattern.size();
  }
  out.append(in.substr(last));
  return out;
}

// Characters of a UTF-8 string (HF's decoders work on chars).
std::vector<std::string_view> Chars(std::string_view s) {
  std::vector<std::string_view> chars;
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = byte_level::ScanUtf8(s, pos).length;
    chars.push_back(s.substr(pos, len));
    pos += len;
  }
  return chars;
}

absl::StatusOr<std::string> SingleChar(const nlohmann::json& config, std::string_view key,
                                       std::string_view what) {
  absl::StatusOr<std::string> value = bpe_json::String(config, key, what);
  if (!value.ok()) return value.status();
  if (value->empty() || byte_level::ScanUtf8(*value, 0).length != value->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": '", std::string(key), "' must be one character"));
  }
  return value;
}

}  // namespace

Decoder::~Decoder() = default;

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::FromJson(const nlohmann::json& config) {
  std::unique_ptr<Decoder> decoder(new Decoder());
  if (config.is_null()) return decoder;
  decoder->has_config_ = true;
  absl::Status status = AddStep(config, decoder.get());
  if (!status.ok()) return status;
  decoder->byte_level_only_ =
      decoder->steps_.size() == 1 && decoder->steps_[0].kind == Kind::kByteLevel;
  return decoder;
}

absl::Status Decoder::AddStep(const nlohmann::json& config, Decoder* decoder) {
  const std::string type = bpe_json::Type(config);
  if (type == "Sequence") {
    const nlohmann::json* list = bpe_json::Field(config, "decoders");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("Sequence decoder without a 'decoders' list");
    }
    for (const nlohmann::json& item : *list) {
      absl::Status status = AddStep(item, decoder);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    absl::StatusOr<std::string> content = bpe_json::String(config, "content", "Replace decoder");
    if (!content.ok()) return content.status();
    step.content = *std::move(content);
    absl::Status st = ParseReplacePattern(config, "Replace decoder", &step.pattern, &step.regex);
    if (!st.ok()) return st;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    absl::StatusOr<std::string> content = SingleChar(config, "content", "Strip decoder");
    if (!content.ok()) return content.status();
    step.pattern = *std::move(content);
    const nlohmann::json* start = bpe_json::Field(config, "start");
    const nlohmann::json* stop = bpe_json::Field(config, "stop");
    const auto non_negative = [](const nlohmann::json* v) {
      return v != nullptr && v->is_number_integer() && v->get<int64_t>() >= 0;
    };
    if (!non_negative(start) || !non_negative(stop)) {
      return absl::InvalidArgumentError("Strip decoder needs unsigned 'start' and 'stop'");
    }
    step.start = start->get<size_t>();
    step.stop = stop->get<size_t>();
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    absl::StatusOr<std::string> replacement =
        SingleChar(config, "replacement", "Metaspace decoder");
    if (!replacement.ok()) return replacement.status();
    step.pattern = *std::move(replacement);
    const nlohmann::json* scheme = bpe_json::Field(config, "prepend_scheme");
    if (scheme != nullptr && scheme->is_string()) {
      const std::string s = scheme->get<std::string>();
      if (s != "always" && s != "first" && s != "never") {
        return absl::InvalidArgumentError(
            absl::StrCat("unsupported Metaspace decoder prepend_scheme '", s, "'"));
      }
      step.prepend = s != "never";
    } else {
      step.prepend = bpe_json::Bool(config, "add_prefix_space", true);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unsupported decoder type '", type, "'"));
  }
  decoder->steps_.push_back(std::move(step));
  return absl::OkStatus();
}

std::string Decoder::Decode(const std::vector<std::string_view>& input) const {
  if (joins_with_spaces()) {
    std::string out;
    for (size_t i = 0; i < input.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out.append(input[i]);
    }
    return out;
  }
  std::vector<std::string> tokens(input.begin(), input.end());
  for (const Step& step : steps_) {
    std::vector<std::string> next;
    switch (step.kind) {
      case Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) {
          std::optional<std::string> decoded = byte_level::DecodeToken(t);
          bytes.append(decoded.has_value() ? *decoded : t);
        }
        std::string text;
        byte_level::AppendUtf8Lossy(bytes, &text);
        next.push_back(std::move(text));
        break;
      }
      case Kind::kReplace:
        for (const std::string& t : tokens) {
          if (step.regex == nullptr) {
            next.push_back(ReplaceAll(t, step.pattern, step.content));
            continue;
          }
          std::string out;
          size_t last = 0;
          step.regex->ForEachMatch(t, [&](size_t begin, size_t end) {
            out.append(t, last, begin - last);
            out.append(step.content);
            last = end;
          });
          out.append(t, last, std::string::npos);
          next.push_back(std::move(out));
        }
        break;
      case Kind::kByteFallback: {
        std::string pending;
        const auto flush = [&] {
          if (pending.empty()) return;
          if (IsValidUtf8(pending)) {
            next.push_back(pending);
          } else {
            for (size_t i = 0; i < pending.size(); ++i) next.emplace_back(kReplacementChar);
          }
          pending.clear();
        };
        for (std::string& t : tokens) {
          if (const std::optional<uint8_t> byte = FallbackByte(t); byte.has_value()) {
            pending.push_back(static_cast<char>(*byte));
            continue;
          }
          flush();
          next.push_back(std::move(t));
        }
        flush();
        break;
      }
      case Kind::kFuse: {
        std::string fused;
        for (const std::string& t : tokens) fused.append(t);
        next.push_back(std::move(fused));
        break;
      }
      case Kind::kStrip:
        for (const std::string& t : tokens) {
          const std::vector<std::string_view> chars = Chars(t);
          size_t begin = 0;
          while (begin < step.start && begin < chars.size() && chars[begin] == step.pattern) {
            ++begin;
          }
          size_t end = chars.size();
          while (chars.size() - end < step.stop && end > begin && chars[end - 1] == step.pattern) {
            --end;
          }
          std::string out;
          for (size_t i = begin; i < end; ++i) out.append(chars[i]);
          next.push_back(std::move(out));
        }
        break;
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // HF drops every replacement character of the first token when a prefix is
          // prepended at encode time, and turns the others into spaces.
          next.push_back(ReplaceAll(tokens[i], step.pattern, i == 0 && step.prepend ? "" : " "));
        }
        break;
    }
    tokens = std::move(next);
  }
  std::string out;
  for (const std::string& t : tokens) out.append(t);
  return out;
}

std::string Decoder::TokenBytes(std::string_view token) const {
  std::string current(token);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kByteLevel: {
        std::optional<std::string> bytes = byte_level::DecodeToken(current);
        if (bytes.has_value()) current = *std::move(bytes);
        break;
      }
      case Kind::kReplace:
        if (step.regex == nullptr) {
          current = ReplaceAll(current, step.pattern, step.content);
        } else {
          std::string out;
          size_t last = 0;
          step.regex->ForEachMatch(current, [&](size_t begin, size_t end) {
            out.append(current, last, begin - last);
            out.append(step.content);
            last = end;
          });
          out.append(current, last, std::string::npos);
          current = std::move(out);
        }
        break;
      case Kind::kByteFallback:
        if (const std::optional<uint8_t> byte = FallbackByte(current); byte.has_value()) {
          current.assign(1, static_cast<char>(*byte));
        }
        break;
      case Kind::kMetaspace:
        current = ReplaceAll(current, step.pattern, " ");
        break;
      case Kind::kFuse:
      case Kind::kStrip:
        break;
    }
  }
  return current;
}

}  // namespace sluice
