#include "engine/tokenizer/jinja/str.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja/value.h"

namespace sluice::jinja {
namespace {

bool IsUpperCp(uint32_t cp) {
  return (cp >= 'A' && cp <= 'Z') || (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) ||
         (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) || (cp >= 0x400 && cp <= 0x42F);
}

bool IsLowerCp(uint32_t cp) {
  return (cp >= 'a' && cp <= 'z') || (cp >= 0xDF && cp <= 0xFF && cp != 0xF7) ||
         (cp >= 0x3B1 && cp <= 0x3C9) || (cp >= 0x430 && cp <= 0x45F);
}

bool IsCased(uint32_t cp) { return IsUpperCp(cp) || IsLowerCp(cp); }

uint32_t ToUpperCp(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
  if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) return cp - 32;
  if (cp == 0x3C2) return 0x3A3;  // final sigma
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  return cp;
}

uint32_t ToLowerCp(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  return cp;
}

template <typename Fn>
std::string MapCps(absl::string_view s, Fn fn) {
  std::string out;
  out.reserve(s.size());
  const std::vector<uint32_t> cps = Utf8Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) Utf8Append(fn(i, cps), &out);
  return out;
}

size_t CpIndex(absl::string_view s, size_t byte_pos) {
  size_t n = 0;
  for (size_t i = 0; i < byte_pos && i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++n;
  }
  return n;
}

}  // namespace

std::string PyStrip(absl::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = Utf8Decode(s);
  std::vector<uint32_t> set;
  if (chars != nullptr) set = Utf8Decode(*chars);
  auto strip = [&](uint32_t cp) {
    if (chars == nullptr) return IsPySpace(cp);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0;
  size_t end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return Utf8Encode(cps, begin, end);
}

std::vector<std::string> PySplit(absl::string_view s, const std::string* sep, int64_t maxsplit,
                                 bool reverse) {
  std::vector<std::string> out;
  if (sep == nullptr) {
    const std::vector<uint32_t> cps = Utf8Decode(s);
    const size_t n = cps.size();
    if (!reverse) {
      size_t i = 0;
      while (true) {
        while (i < n && IsPySpace(cps[i])) ++i;
        if (i >= n) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
          size_t end = n;
          while (end > i && IsPySpace(cps[end - 1])) --end;
          out.push_back(Utf8Encode(cps, i, end));
          break;
        }
        size_t j = i;
        while (j < n && !IsPySpace(cps[j])) ++j;
        out.push_back(Utf8Encode(cps, i, j));
        i = j;
      }
    } else {
      size_t i = n;
      while (true) {
        while (i > 0 && IsPySpace(cps[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
          size_t begin = 0;
          while (begin < i && IsPySpace(cps[begin])) ++begin;
          out.push_back(Utf8Encode(cps, begin, i));
          break;
        }
        size_t j = i;
        while (j > 0 && !IsPySpace(cps[j - 1])) --j;
        out.push_back(Utf8Encode(cps, j, i));
        i = j;
      }
      std::reverse(out.begin(), out.end());
    }
    return out;
  }
  if (!reverse) {
    size_t start = 0;
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
      const size_t pos = s.find(*sep, start);
      if (pos == absl::string_view::npos) break;
      out.emplace_back(s.substr(start, pos - start));
      start = pos + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  size_t end = s.size();
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    if (end < sep->size()) break;
    const size_t pos = s.rfind(*sep, end - sep->size());
    if (pos == absl::string_view::npos) break;
    out.emplace_back(s.substr(pos + sep->size(), end - pos - sep->size()));
    end = pos;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> PySplitLines(absl::string_view s) {
  std::vector<std::string> out;
  const std::vector<uint32_t> cps = Utf8Decode(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const bool is_break = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C ||
                          (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) continue;
    out.push_back(Utf8Encode(cps, start, i));
    if (cp == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) out.push_back(Utf8Encode(cps, start, cps.size()));
  return out;
}

std::string PyUpper(absl::string_view s) {
  return MapCps(s, [](size_t i, const std::vector<uint32_t>& c) { return ToUpperCp(c[i]); });
}

std::string PyLower(absl::string_view s) {
  return MapCps(s, [](size_t i, const std::vector<uint32_t>& c) { return ToLowerCp(c[i]); });
}

std::string PySwapCase(absl::string_view s) {
  return MapCps(s, [](size_t i, const std::vector<uint32_t>& c) {
    return IsUpperCp(c[i]) ? ToLowerCp(c[i]) : ToUpperCp(c[i]);
  });
}

std::string PyTitle(absl::string_view s) {
  return MapCps(s, [](size_t i, const std::vector<uint32_t>& c) {
    const bool prev_cased = i > 0 && IsCased(c[i - 1]);
    return prev_cased ? ToLowerCp(c[i]) : ToUpperCp(c[i]);
  });
}

std::string PyCapitalize(absl::string_view s) {
  return MapCps(s, [](size_t i, const std::vector<uint32_t>& c) {
    return i == 0 ? ToUpperCp(c[i]) : ToLowerCp(c[i]);
  });
}

std::string JinjaTitle(absl::string_view s) {
  auto is_sep = [](uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || IsPySpace(cp);
  };
  return MapCps(s, [&](size_t i, const std::vector<uint32_t>& c) {
    return (i == 0 || is_sep(c[i - 1])) ? ToUpperCp(c[i]) : ToLowerCp(c[i]);
  });
}

absl::StatusOr<std::string> PyReplace(absl::string_view s, absl::string_view old_str,
                                      absl::string_view new_str, int64_t count) {
  std::string out;
  auto check = [&]() -> absl::Status {
    if (out.size() > kMaxValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("value exceeds the limit of ", kMaxValueBytes, " bytes"));
    }
    return absl::OkStatus();
  };
  if (old_str.empty()) {
    // Python inserts `new` before every code point and at the end.
    const std::vector<uint32_t> cps = Utf8Decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(new_str.data(), new_str.size());
        ++done;
      }
      if (i < cps.size()) Utf8Append(cps[i], &out);
      SLUICE_RETURN_IF_ERROR(check());
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t pos = s.find(old_str, start);
    if (pos == absl::string_view::npos) break;
    out.append(s.data() + start, pos - start);
    out.append(new_str.data(), new_str.size());
    SLUICE_RETURN_IF_ERROR(check());
    start = pos + old_str.size();
    ++done;
  }
  out.append(s.data() + start, s.size() - start);
  SLUICE_RETURN_IF_ERROR(check());
  return out;
}

int64_t PyCount(absl::string_view s, absl::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(Utf8Length(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != absl::string_view::npos;
       pos = s.find(sub, pos + sub.size())) {
    ++n;
  }
  return n;
}

int64_t PyFind(absl::string_view s, absl::string_view sub, bool reverse) {
  const size_t pos = reverse ? s.rfind(sub) : s.find(sub);
  if (pos == absl::string_view::npos) return -1;
  return static_cast<int64_t>(CpIndex(s, pos));
}

bool PyIsClass(absl::string_view s, absl::string_view method) {
  const std::vector<uint32_t> cps = Utf8Decode(s);
  if (cps.empty()) return false;
  if (method == "isupper" || method == "islower") {
    bool any_cased = false;
    for (uint32_t cp : cps) {
      if (method == "isupper" ? IsLowerCp(cp) : IsUpperCp(cp)) return false;
      any_cased = any_cased || IsCased(cp);
    }
    return any_cased;
  }
  for (uint32_t cp : cps) {
    const bool digit = cp >= '0' && cp <= '9';
    const bool alpha = IsCased(cp) || (cp >= 0x4E00 && cp <= 0x9FFF);
    bool ok = false;
    if (method == "isdigit" || method == "isnumeric" || method == "isdecimal") ok = digit;
    if (method == "isalpha") ok = alpha;
    if (method == "isalnum") ok = alpha || digit;
    if (method == "isspace") ok = IsPySpace(cp);
    if (!ok) return false;
  }
  return true;
}

}  // namespace sluice::jinja
