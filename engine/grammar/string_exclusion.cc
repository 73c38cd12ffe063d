#include "engine/grammar/string_exclusion.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "engine/grammar/regex_to_grammar.h"
#include "engine/grammar/text_escapes.h"

namespace sluice::grammar {
namespace {

using Ranges = std::vector<CodepointRange>;

Expr Nothing() { return Choice({}); }

bool IsEmptyString(const Expr& e) {
  return e.kind == ExprKind::kEmpty || (e.kind == ExprKind::kLiteral && e.text.empty());
}

bool Nullable(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kEmpty:
      return true;
    case ExprKind::kLiteral:
      return e.text.empty();
    case ExprKind::kSequence:
      return std::all_of(e.children.begin(), e.children.end(), [](const Expr& c) { return Nullable(c); });
    case ExprKind::kChoice:
      return std::any_of(e.children.begin(), e.children.end(), [](const Expr& c) { return Nullable(c); });
    case ExprKind::kRepeat:
      return e.min_count == 0 || Nullable(e.children[0]);
    default:
      return false;
  }
}

int64_t Size(const Expr& e) {
  int64_t n = 1;
  for (const Expr& c : e.children) n += Size(c);
  return n;
}

// Cat: a then b, simplified (nothing absorbs, the empty string vanishes, sequences flatten).
Expr Cat(Expr a, Expr b) {
  if (IsNothing(a) || IsNothing(b)) return Nothing();
  if (IsEmptyString(a)) return b;
  if (IsEmptyString(b)) return a;
  std::vector<Expr> parts;
  for (Expr* x : {&a, &b}) {
    if (x->kind == ExprKind::kSequence) {
      for (Expr& c : x->children) parts.push_back(std::move(c));
    } else {
      parts.push_back(std::move(*x));
    }
  }
  return Sequence(std::move(parts));
}

// Alt: the union, simplified (nested choices flatten, nothing and duplicates drop).
Expr Alt(std::vector<Expr> alts) {
  std::vector<Expr> out;
  auto add = [&](Expr x) {
    if (IsNothing(x)) return;
    if (IsEmptyString(x)) x = Empty();
    for (const Expr& y : out) {
      if (ExprEquals(x, y)) return;
    }
    out.push_back(std::move(x));
  };
  for (Expr& a : alts) {
    if (a.kind == ExprKind::kChoice) {
      for (Expr& c : a.children) add(std::move(c));
    } else {
      add(std::move(a));
    }
  }
  return Choice(std::move(out));
}

// Rest: children[from..] of a sequence as one expression.
Expr Rest(const Expr& seq, size_t from) {
  std::vector<Expr> parts(seq.children.begin() + static_cast<std::ptrdiff_t>(from), seq.children.end());
  return Sequence(std::move(parts));
}

// Fewer: a repeat with one iteration taken (its child nullable: any iteration may be the one).
Expr Fewer(const Expr& r) {
  const Expr& x = r.children[0];
  const int32_t lo = Nullable(x) ? 0 : std::max(r.min_count - 1, 0);
  const int32_t hi = r.max_count < 0 ? -1 : r.max_count - 1;
  if (hi == 0) return Empty();
  if (lo == 1 && hi == 1) return x;
  return Repeat(x, lo, hi);
}

Ranges ClassRanges(const Expr& e) { return e.negated ? ComplementRanges(e.ranges) : NormalizeRanges(e.ranges); }

bool Contains(const Ranges& ranges, char32_t c) {
  for (const CodepointRange& r : ranges) {
    if (r.lo <= c && c <= r.hi) return true;
  }
  return false;
}

// Minus: ranges without `cut` (both normalized).
Ranges Minus(const Ranges& ranges, const Ranges& cut) {
  Ranges keep = ComplementRanges(ranges);
  keep.insert(keep.end(), cut.begin(), cut.end());
  return ComplementRanges(NormalizeRanges(std::move(keep)));
}

// FirstCharSplit: e rewritten at the first character of its strings. `first(leaf)` says what a
// leaf (empty, literal, character class) becomes when it supplies that character; sequences (a
// nullable child lets the next one supply it), choices and repeats follow the same rules
// whatever `first` does (Brzozowski's derivative when it strips one given character).
template <typename First>
absl::StatusOr<Expr> FirstCharSplit(const Expr& e, const First& first) {
  switch (e.kind) {
    case ExprKind::kEmpty:
    case ExprKind::kLiteral:
    case ExprKind::kCharClass:
      return first(e);
    case ExprKind::kSequence: {
      std::vector<Expr> alts;
      for (size_t i = 0; i < e.children.size(); ++i) {
        absl::StatusOr<Expr> d = FirstCharSplit(e.children[i], first);
        if (!d.ok()) return d;
        alts.push_back(Cat(*std::move(d), Rest(e, i + 1)));
        if (!Nullable(e.children[i])) break;
      }
      return Alt(std::move(alts));
    }
    case ExprKind::kChoice: {
      std::vector<Expr> alts;
      for (const Expr& x : e.children) {
        absl::StatusOr<Expr> d = FirstCharSplit(x, first);
        if (!d.ok()) return d;
        alts.push_back(*std::move(d));
      }
      return Alt(std::move(alts));
    }
    case ExprKind::kRepeat: {
      if (e.max_count == 0) return Nothing();
      absl::StatusOr<Expr> d = FirstCharSplit(e.children[0], first);
      if (!d.ok()) return d;
      return Cat(*std::move(d), Fewer(e));
    }
    default:
      return absl::InvalidArgumentError("a string set difference needs a regular expression (no rules or tokens)");
  }
}

// Derive: the strings w such that c w is a string of e (Brzozowski's derivative).
absl::StatusOr<Expr> Derive(const Expr& e, char32_t c) {
  return FirstCharSplit(e, [c](const Expr& leaf) -> Expr {
    switch (leaf.kind) {
      case ExprKind::kLiteral: {
        if (leaf.text.empty()) return Nothing();
        const auto [first, len] = DecodeUtf8Char(leaf.text);
        if (first != c) return Nothing();
        return Literal(absl::string_view(leaf.text).substr(len));
      }
      case ExprKind::kCharClass:
        return Contains(ClassRanges(leaf), c) ? Empty() : Nothing();
      default:  // kEmpty
        return Nothing();
    }
  });
}

// StartingOutside: the non-empty strings of e whose first character is not in `cut`.
absl::StatusOr<Expr> StartingOutside(const Expr& e, const Ranges& cut) {
  return FirstCharSplit(e, [&cut](const Expr& leaf) -> Expr {
    switch (leaf.kind) {
      case ExprKind::kLiteral:
        if (leaf.text.empty()) return Nothing();
        return Contains(cut, DecodeUtf8Char(leaf.text).first) ? Nothing() : leaf;
      case ExprKind::kCharClass: {
        Ranges left = Minus(ClassRanges(leaf), cut);
        return left.empty() ? Nothing() : CharClass(std::move(left));
      }
      default:  // kEmpty
        return Nothing();
    }
  });
}

struct TrieNode {
  bool terminal = false;
  std::map<char32_t, std::unique_ptr<TrieNode>> next;
};

absl::StatusOr<Expr> Difference(const Expr& e, const TrieNode& t, int64_t* budget) {
  std::vector<Expr> alts;
  if (Nullable(e) && !t.terminal) alts.push_back(Empty());
  Ranges cut;
  for (const auto& [c, child] : t.next) cut.push_back({c, c});
  absl::StatusOr<Expr> out = StartingOutside(e, cut);
  if (!out.ok()) return out;
  alts.push_back(*std::move(out));
  for (const auto& [c, child] : t.next) {
    absl::StatusOr<Expr> d = Derive(e, c);
    if (!d.ok()) return d;
    if (IsNothing(*d)) continue;
    *budget -= Size(*d);
    if (*budget < 0) break;
    absl::StatusOr<Expr> rest = Difference(*d, *child, budget);
    if (!rest.ok()) return rest;
    std::string ch;
    AppendCodepoint(c, &ch);
    alts.push_back(Cat(Literal(ch), *std::move(rest)));
  }
  Expr result = Alt(std::move(alts));
  *budget -= Size(result);
  if (*budget < 0) {
    return absl::ResourceExhaustedError("excluding the declared property names from the keys of "
                                        "additional properties needs too large a grammar");
  }
  return result;
}

// ---- JSON spellings ----

Expr HexDigit() { return CharClass({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}); }

// HexDigits: one hex digit of value lo..hi, either case.
Expr HexDigits(uint32_t lo, uint32_t hi) {
  Ranges r;
  if (lo <= 9) r.push_back({'0' + lo, '0' + std::min<uint32_t>(hi, 9)});
  if (hi >= 10) {
    const uint32_t a = std::max<uint32_t>(lo, 10) - 10, b = hi - 10;
    r.push_back({'a' + a, 'a' + b});
    r.push_back({'A' + a, 'A' + b});
  }
  return CharClass(std::move(r));
}

// HexRange: the values lo..hi written with `digits` hex digits.
Expr HexRange(uint32_t lo, uint32_t hi, int digits) {
  if (digits == 1) return HexDigits(lo, hi);
  const uint32_t p = 1u << (4 * (digits - 1));
  const uint32_t a = lo / p, b = hi / p, ra = lo % p, rb = hi % p;
  if (a == b) return Sequence({HexDigits(a, a), HexRange(ra, rb, digits - 1)});
  if (ra == 0 && rb == p - 1) return Sequence({HexDigits(a, b), Repeat(HexDigit(), digits - 1, digits - 1)});
  std::vector<Expr> alts;
  alts.push_back(Sequence({HexDigits(a, a), HexRange(ra, p - 1, digits - 1)}));
  if (a + 1 <= b - 1) alts.push_back(Sequence({HexDigits(a + 1, b - 1), Repeat(HexDigit(), digits - 1, digits - 1)}));
  alts.push_back(Sequence({HexDigits(b, b), HexRange(0, rb, digits - 1)}));
  return Choice(std::move(alts));
}

// UnicodeEscapes: the four hex digits (and for U+10000 up, "\u" and four more) that spell a
// code point of `ranges` after "\u".
Expr UnicodeEscapes(const Ranges& ranges) {
  std::vector<Expr> alts;
  for (const CodepointRange& r : ranges) {
    if (r.lo <= 0xFFFF) {
      const uint32_t hi = std::min<uint32_t>(r.hi, 0xFFFF);
      // Surrogates are never characters (ComplementRanges leaves them out).
      for (auto [a, b] : {std::pair<uint32_t, uint32_t>{r.lo, std::min<uint32_t>(hi, 0xD7FF)},
                          {std::max<uint32_t>(r.lo, 0xE000), hi}}) {
        if (a <= b) alts.push_back(HexRange(a, b, 4));
      }
    }
    if (r.hi >= 0x10000) {
      const uint32_t lo = std::max<uint32_t>(r.lo, 0x10000) - 0x10000, hi = r.hi - 0x10000;
      const uint32_t ha = 0xD800 + (lo >> 10), la = 0xDC00 + (lo & 0x3FF);
      const uint32_t hb = 0xD800 + (hi >> 10), lb = 0xDC00 + (hi & 0x3FF);
      auto pair = [](uint32_t h0, uint32_t h1, uint32_t l0, uint32_t l1) {
        return Sequence({HexRange(h0, h1, 4), Literal("\\u"), HexRange(l0, l1, 4)});
      };
      if (ha == hb) {
        alts.push_back(pair(ha, ha, la, lb));
      } else {
        alts.push_back(pair(ha, ha, la, 0xDFFF));
        if (ha + 1 <= hb - 1) alts.push_back(pair(ha + 1, hb - 1, 0xDC00, 0xDFFF));
        alts.push_back(pair(hb, hb, 0xDC00, lb));
      }
    }
  }
  return Choice(std::move(alts));
}

bool IsAllScalars(const Ranges& r) { return ComplementRanges(r).empty(); }

Expr SpellClass(const Ranges& ranges) {
  if (IsAllScalars(ranges)) return JsonCharExpr();
  std::vector<Expr> alts;
  Ranges plain = Minus(ranges, NormalizeRanges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
  if (!plain.empty()) alts.push_back(CharClass(std::move(plain)));
  Ranges shorts;
  for (auto [cp, letter] : {std::pair<char32_t, char32_t>{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {0x08, 'b'},
                            {0x0C, 'f'}, {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}}) {
    if (Contains(ranges, cp)) shorts.push_back({letter, letter});
  }
  std::vector<Expr> escapes;
  if (!shorts.empty()) escapes.push_back(CharClass(NormalizeRanges(std::move(shorts))));
  Expr hex = UnicodeEscapes(ranges);
  if (!IsNothing(hex)) escapes.push_back(Sequence({Literal("u"), std::move(hex)}));
  if (!escapes.empty()) alts.push_back(Sequence({Literal("\\"), Choice(std::move(escapes))}));
  return Choice(std::move(alts));
}

}  // namespace

bool IsNothing(const Expr& e) { return e.kind == ExprKind::kChoice && e.children.empty(); }

absl::StatusOr<Expr> ExcludeStrings(const Expr& e, const std::vector<std::string>& excluded, int64_t max_nodes) {
  TrieNode root;
  for (const std::string& s : excluded) {
    TrieNode* t = &root;
    for (size_t i = 0; i < s.size();) {
      const auto [c, len] = DecodeUtf8Char(absl::string_view(s).substr(i));
      i += std::max<size_t>(len, 1);
      std::unique_ptr<TrieNode>& next = t->next[c];
      if (next == nullptr) next = std::make_unique<TrieNode>();
      t = next.get();
    }
    t->terminal = true;
  }
  int64_t budget = max_nodes;
  return Difference(e, root, &budget);
}

Expr JsonCharExpr() {
  const Expr d = CharClass({{'d', 'd'}, {'D', 'D'}});
  // "u" and four hex digits spelling a UTF-16 code unit, where a high surrogate (D800-DBFF)
  // must be followed by "\u" and a low one (DC00-DFFF) and a low one never stands alone.
  // RFC 8259 (sections 7, 8.2) lets the grammar spell unpaired surrogates but leaves their
  // meaning unpredictable: nlohmann::json (the tool-call parser) and pydantic (the openai
  // SDK's parse) reject them, and I-JSON (RFC 7493, 2.1) forbids them.
  const Expr not_surrogate =
      Choice({Sequence({CharClass({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}),
                        Repeat(HexDigit(), 3, 3)}),
              Sequence({d, CharClass({{'0', '7'}}), Repeat(HexDigit(), 2, 2)})});
  const Expr surrogate_pair =
      Sequence({d, CharClass({{'8', '9'}, {'a', 'b'}, {'A', 'B'}}), Repeat(HexDigit(), 2, 2),
                Literal("\\u"), d, CharClass({{'c', 'f'}, {'C', 'F'}}), Repeat(HexDigit(), 2, 2)});
  const Expr unicode_escape = Sequence({Literal("u"), Choice({not_surrogate, surrogate_pair})});
  return Choice({CharClass({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, /*negated=*/true),
                 Sequence({Literal("\\"),
                           Choice({CharClass({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'},
                                              {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                   unicode_escape})})});
}

Expr JsonSpellings(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral: {
      std::vector<Expr> parts;
      for (size_t i = 0; i < e.text.size();) {
        const auto [c, len] = DecodeUtf8Char(absl::string_view(e.text).substr(i));
        i += std::max<size_t>(len, 1);
        parts.push_back(SpellClass({{c, c}}));
      }
      return Sequence(std::move(parts));
    }
    case ExprKind::kCharClass:
      return SpellClass(ClassRanges(e));
    default: {
      Expr out = e;
      for (Expr& c : out.children) c = JsonSpellings(c);
      return out;
    }
  }
}

}  // namespace sluice::grammar
