// Helpers for the grammar tests: full-string matching through a byte vocabulary, and a
// brute-force mask to check the fast one against.
#ifndef SLUICE_TESTS_UNIT_GRAMMAR_GRAMMAR_TEST_UTIL_H_
#define SLUICE_TESTS_UNIT_GRAMMAR_GRAMMAR_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/token_vocab.h"

namespace sluice::grammar::testing {

// ByteVocab: tokens 0..255 are the single bytes, 256 is EOS.
inline std::shared_ptr<const TokenVocab> ByteVocab() {
  static std::shared_ptr<const TokenVocab> vocab = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    tokens.push_back("");
    return TokenVocab::FromTokens(std::move(tokens), {256});
  }();
  return vocab;
}

// FullMatch: the grammar accepts exactly `text`.
inline bool FullMatch(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.AcceptBytes(text) && m.CanEnd();
}

// BruteForceMask: token t allowed iff a copy of `m` accepts it.
inline std::vector<uint32_t> BruteForceMask(const GrammarMatcher& m) {
  const TokenVocab& vocab = m.grammar().vocab();
  std::vector<uint32_t> mask(vocab.num_bitmask_words(), 0);
  for (int32_t t = 0; t < vocab.vocab_size(); ++t) {
    GrammarMatcher copy = m;
    if (copy.AcceptToken(t)) mask[t >> 5] |= 1u << (t & 31);
  }
  return mask;
}

inline std::vector<int32_t> MaskIds(const std::vector<uint32_t>& mask) {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask.size(); ++w) {
    for (int b = 0; b < 32; ++b) {
      if ((mask[w] >> b) & 1u) ids.push_back(static_cast<int32_t>(w * 32 + b));
    }
  }
  return ids;
}

}  // namespace sluice::grammar::testing

#endif  // SLUICE_TESTS_UNIT_GRAMMAR_GRAMMAR_TEST_UTIL_H_
