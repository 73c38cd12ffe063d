// The structured-output grammar compiler: GBNF grammars, regexes, JSON Schemas and choice
// lists from request bodies, compiled against a small vocabulary and then driven by a matcher.
//
// Input: byte 0 picks the kind, then the spec text up to a NUL byte, then bytes that are fed
// to the matcher (each one a token id of the vocabulary below). Checks beyond "no crash": a
// token the bitmask allows is accepted, and one it refuses is refused.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/token_vocab.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace grammar = sluice::grammar;

std::shared_ptr<const grammar::TokenVocab>* g_vocab = nullptr;

// Vocabulary: token 0 is EOS (no bytes), tokens 1..256 the single bytes 0..255, then a few
// multi-byte JSON pieces, so matchers see both byte and multi-byte steps.
std::shared_ptr<const grammar::TokenVocab> MakeVocab() {
  std::vector<std::string> tokens = {""};
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "true", "false", "null", "  ", "\\u00", "é", "[1,",
                        "}}", "\"a\"", "0.5e", "-1", "\xf0\x9f\x98\x80"}) {
    tokens.push_back(t);
  }
  return grammar::TokenVocab::FromTokens(std::move(tokens), {0});
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_vocab = new std::shared_ptr<const grammar::TokenVocab>(MakeVocab());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::Input in(data, size);
  grammar::GrammarSpec spec;
  switch (in.Byte() % 5) {
    case 0: spec.kind = grammar::GrammarKind::kEbnf; break;
    case 1: spec.kind = grammar::GrammarKind::kRegex; break;
    case 2: spec.kind = grammar::GrammarKind::kJsonSchema; break;
    case 3: spec.kind = grammar::GrammarKind::kChoice; break;
    default: spec.kind = grammar::GrammarKind::kJsonObject; break;
  }
  const std::string_view text = in.Field('\0');
  if (spec.kind == grammar::GrammarKind::kChoice) {
    for (absl::string_view c : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
      spec.choices.emplace_back(c);
    }
  } else {
    spec.text = std::string(text);
  }
  (void)spec.CacheKey();
  auto built = grammar::BuildGrammar(spec);
  if (!built.ok()) return 0;
  // Smaller automaton limits than the server's keep one input's compile within the timeout;
  // the limits themselves are what is exercised.
  grammar::PdaOptions options;
  options.max_states = 200000;
  options.max_rule_dfa_states = 20000;
  auto compiled = grammar::CompiledGrammar::Create(*built, *g_vocab, options);
  if (!compiled.ok()) return 0;

  grammar::GrammarMatcher matcher(*compiled);
  std::vector<uint32_t> bitmask(matcher.num_bitmask_words());
  const int32_t vocab_size = (*g_vocab)->vocab_size();
  for (char c : in.Rest()) {
    if (matcher.IsTerminated()) break;
    const int32_t token = static_cast<uint8_t>(c) % vocab_size;
    matcher.FillNextTokenBitmask(absl::MakeSpan(bitmask));
    const bool allowed = (bitmask[token / 32] >> (token % 32)) & 1;
    const bool accepted = matcher.AcceptToken(token);
    if (allowed != accepted) __builtin_trap();
    (void)matcher.ForcedBytes();
  }
  return 0;
}
