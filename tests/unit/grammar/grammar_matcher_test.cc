// GrammarMatcher: the fast mask (precomputed accepted/uncertain tokens) equals the brute-force
// mask on random walks, EOS handling, rollback on rejected tokens, and the real Llama 3
// vocabulary.
#include <algorithm>
#include <random>
#include <string>

#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/json_schema_to_grammar.h"
#include "engine/grammar/pda.h"
#include "engine/grammar/regex_to_grammar.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/grammar/grammar_test_util.h"
#include "tests/util/test_paths.h"

namespace sluice::grammar {
namespace {

using testing::BruteForceMask;
using testing::MaskIds;

// A vocabulary of multi-byte tokens that cross grammar boundaries: quotes with punctuation,
// keys with separators, partial UTF-8.
std::shared_ptr<const TokenVocab> MixedVocab() {
  std::vector<std::string> tokens = {
      "", "{", "}", "[", "]", "\"", ",", ":", " ", ", ", ": ", "\":", "\": ", "\",", "\", ",
      "\"}", "\"]", "}]", "]}", "},", "}, ", "{\"", "[\"", "[{", "a", "b", "ab", "abc", "name",
      "\"name", "\"name\": ", "age", "\"age\": ", "1", "12", "0", "-", "-1", ".", ".5", "e",
      "true", "tr", "ue", "null", "false", "\\", "\\\"", "\\n", "\\u", "00", "e9", "\xC3",
      "\xA9", "\xC3\xA9", "x", "y", "z", "xy", "yes", "no", "ye", "s", "1,", "2]", "3}", "\n",
      "+", "(", ")", "1+", "+2", "(1", "1)", "hi", "!", "\t", "7", "9", "99",
  };
  tokens.push_back("");  // EOS
  const int32_t eos = static_cast<int32_t>(tokens.size()) - 1;
  return TokenVocab::FromTokens(std::move(tokens), {eos});
}

// RandomWalk follows random allowed tokens, checking the fast mask against brute force at every
// step, until EOS or `steps`.
void RandomWalk(const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(m.num_bitmask_words());
  for (int step = 0; step < steps; ++step) {
    m.FillNextTokenBitmask(absl::MakeSpan(mask));
    const std::vector<uint32_t> expected = BruteForceMask(m);
    ASSERT_EQ(MaskIds(mask), MaskIds(expected)) << "seed " << seed << " step " << step;
    const std::vector<int32_t> allowed = MaskIds(mask);
    if (allowed.empty()) return;  // the small vocabulary cannot continue (both masks agree)
    const int32_t t = allowed[rng() % allowed.size()];
    ASSERT_TRUE(m.AcceptToken(t));
    if (m.IsTerminated()) return;
  }
}

TEST(GrammarMatcherTest, FastMaskEqualsBruteForce) {
  auto vocab = MixedVocab();
  std::vector<Grammar> grammars;
  grammars.push_back(*JsonSchemaToGrammar(nlohmann::json::parse(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},"age":{"type":"integer","minimum":0,"maximum":120},
          "tags":{"type":"array","items":{"enum":["x","yes"]},"maxItems":3}},"required":["name"]})")));
  grammars.push_back(AnyJsonGrammar(false));
  grammars.push_back(*RegexToGrammar("(ab|x)*y?[0-9]{1,3}"));
  grammars.push_back(*ChoiceGrammar({"yes", "no", "ye"}));
  grammars.push_back(*ParseEbnf("root ::= e\ne ::= t (\"+\" t)*\nt ::= [0-9]+ | \"(\" e \")\""));
  grammars.push_back(*JsonSchemaToGrammar(nlohmann::json::parse(
      R"({"$defs":{"n":{"type":"object","properties":{"a":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}}}},"$ref":"#/$defs/n"})")));
  for (size_t i = 0; i < grammars.size(); ++i) {
    auto g = CompiledGrammar::Create(grammars[i], vocab);
    ASSERT_TRUE(g.ok()) << g.status();
    for (uint64_t seed = 0; seed < 12; ++seed) {
      SCOPED_TRACE(::testing::Message() << "grammar " << i);
      RandomWalk(*g, seed * 31 + i, 40);
    }
  }
}

TEST(GrammarMatcherTest, EosAndRejection) {
  auto vocab = MixedVocab();
  const int32_t eos = vocab->eos_token_ids()[0];
  auto g = *CompiledGrammar::Create(*ChoiceGrammar({"ye", "yes"}), vocab);
  GrammarMatcher m(g);
  auto id = [&](const std::string& s) {
    for (int32_t t = 0; t < vocab->vocab_size(); ++t) {
      if (vocab->token_bytes(t) == s) return t;
    }
    return -1;
  };
  EXPECT_FALSE(m.AcceptToken(eos));
  EXPECT_FALSE(m.AcceptToken(id("no")));
  EXPECT_TRUE(m.AcceptToken(id("ye")));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.IsTerminated());
  std::vector<uint32_t> mask(m.num_bitmask_words());
  m.FillNextTokenBitmask(absl::MakeSpan(mask));
  EXPECT_EQ(MaskIds(mask), (std::vector<int32_t>{id("s"), eos}));
  EXPECT_TRUE(m.AcceptToken(id("s")));
  EXPECT_TRUE(m.IsTerminated());  // complete and nothing can follow: only EOS
  m.FillNextTokenBitmask(absl::MakeSpan(mask));
  EXPECT_EQ(MaskIds(mask), (std::vector<int32_t>{eos}));
  EXPECT_TRUE(m.AcceptToken(eos));
  EXPECT_FALSE(m.AcceptToken(id("s")));
}

TEST(GrammarMatcherTest, ForcedBytes) {
  auto g = *CompiledGrammar::Create(*JsonSchemaToGrammar(nlohmann::json::parse(
      R"({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]})")), MixedVocab());
  GrammarMatcher m(g);
  EXPECT_EQ(m.ForcedBytes(), "{\"name\": \"");
  ASSERT_TRUE(m.AcceptBytes("{\"name\": \"a\""));
  EXPECT_EQ(m.ForcedBytes(), "}");
}

// The Llama 3 vocabulary (128k tokens): a valid document's tokens are each allowed, the mask
// equals brute force on the first steps, and EOS is allowed exactly at the end.
TEST(GrammarMatcherTest, Llama3Vocabulary) {
  const std::string path = sluice::testing::RequirePath(sluice::testing::SharedDir() + "/tokenizers/llama3/tokenizer.json");
  auto tokenizer = Tokenizer::FromFile(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const int32_t eot = *(*tokenizer)->TokenToId("<|eot_id|>");
  auto vocab = TokenVocab::FromTokenizer(**tokenizer, {eot});
  GrammarCompiler compiler(vocab);
  GrammarSpec spec{GrammarKind::kJsonSchema,
                   R"({"type":"object","properties":{"city":{"type":"string"},"population":{"type":"integer","minimum":0},
                       "tags":{"type":"array","items":{"type":"string","maxLength":8},"minItems":2,"maxItems":2}},
                       "required":["city","population","tags"]})",
                   {}};
  auto g = compiler.Compile(spec);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string doc = R"({"city": "Zürich \"ZH\"", "population": 421878, "tags": ["lake", "alps"]})";
  const std::vector<int32_t> ids = (*tokenizer)->Encode(doc, /*add_special_tokens=*/false);
  GrammarMatcher m(*g);
  std::vector<uint32_t> mask(m.num_bitmask_words());
  for (size_t i = 0; i < ids.size(); ++i) {
    m.FillNextTokenBitmask(absl::MakeSpan(mask));
    if (i < 3 || i + 2 >= ids.size()) {
      ASSERT_EQ(MaskIds(mask), MaskIds(BruteForceMask(m))) << "step " << i;
    }
    ASSERT_TRUE((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1u) << "token " << ids[i] << " at step " << i;
    EXPECT_FALSE((mask[eot >> 5] >> (eot & 31)) & 1u);
    ASSERT_TRUE(m.AcceptToken(ids[i]));
  }
  m.FillNextTokenBitmask(absl::MakeSpan(mask));
  EXPECT_EQ(MaskIds(mask), std::vector<int32_t>{eot});
  // The special tokens never match text.
  GrammarMatcher fresh(*g);
  fresh.FillNextTokenBitmask(absl::MakeSpan(mask));
  const int32_t bot = *(*tokenizer)->TokenToId("<|begin_of_text|>");
  EXPECT_FALSE((mask[bot >> 5] >> (bot & 31)) & 1u);
}

// Fuzz finding (tests/fuzz/corpus/grammar_fuzz): a choice that is not valid UTF-8 made the
// cache key's JSON dump throw (an uncaught exception). Keys are raw bytes now, so two such
// choices never share a key either.
TEST(GrammarCompilerTest, ChoiceCacheKeysTakeAnyBytes) {
  GrammarSpec a{GrammarKind::kChoice, "", {"23\x92" "59:59Z"}};
  GrammarSpec b{GrammarKind::kChoice, "", {"23\x93" "59:59Z"}};
  GrammarSpec split{GrammarKind::kChoice, "", {"ab", "c"}};
  GrammarSpec joined{GrammarKind::kChoice, "", {"a", "bc"}};
  auto ka = a.CacheKey(), kb = b.CacheKey(), ks = split.CacheKey(), kj = joined.CacheKey();
  ASSERT_TRUE(ka.ok() && kb.ok() && ks.ok() && kj.ok());
  EXPECT_NE(*ka, *kb);
  EXPECT_NE(*ks, *kj);
  EXPECT_EQ(*ks, "choice\n2:ab;1:c;");
}

// Minimization: subset construction gives `(a|b)*c` separate states after "a" and after "b";
// they have the same future and become one (start/loop, after "c").
TEST(GrammarMatcherTest, RuleAutomataAreMinimal) {
  absl::StatusOr<Pda> pda = BuildPda(*RegexToGrammar("(a|b)*c"));
  ASSERT_TRUE(pda.ok()) << pda.status();
  EXPECT_EQ(pda->states.size(), 2u);
  // The JSON string body is one state whatever came before in it (quote, character, escape).
  absl::StatusOr<Pda> json = BuildPda(AnyJsonGrammar(false));
  ASSERT_TRUE(json.ok());
  int32_t string_rule = -1;
  for (size_t r = 0; r < json->rule_names.size(); ++r) {
    if (json->rule_names[r] == "string") string_rule = static_cast<int32_t>(r);
  }
  ASSERT_GE(string_rule, 0);
  int32_t body_states = 0;  // states of the rule that take an ASCII letter and stay in it
  for (const PdaState& st : json->states) {
    if (st.rule != string_rule) continue;
    const int32_t s = static_cast<int32_t>(&st - json->states.data());
    if (json->Next(s, 'x') == s) ++body_states;
  }
  EXPECT_EQ(body_states, 1);
}

// Context expansion: where a rule can return mid-token, a token is uncertain only if its rest
// fits a state some call of the rule returns to. `var` returns after one letter, and is called
// where " = " or " + " or ")" follows: "x ", "x =", "x)" are uncertain (as "x", which ends the
// rule), "xy", "xyz" and "x)y" rejected outright.
TEST(GrammarMatcherTest, ContextExpansionRejectsTokensNoCallerTakes) {
  std::vector<std::string> tokens = {"x", "y", "xy", "x ", "x =", "x)", "(", ")", " ", " =", " = ",
                                     " + ", "1", "1)", ", ", "xyz", "x)y"};
  tokens.push_back("");  // EOS
  auto vocab = TokenVocab::FromTokens(tokens, {static_cast<int32_t>(tokens.size()) - 1});
  auto g = CompiledGrammar::Create(*ParseEbnf("root ::= assign (\", \" assign)*\nassign ::= var \" = \" expr\n"
                                              "var ::= [a-z]\nexpr ::= term (\" + \" term)*\n"
                                              "term ::= [0-9] | var | \"(\" expr \")\"\n"),
                                   vocab);
  ASSERT_TRUE(g.ok()) << g.status();
  const Pda& pda = (*g)->pda();
  int32_t var_rule = -1;
  for (size_t r = 0; r < pda.rule_names.size(); ++r) {
    if (pda.rule_names[r] == "var") var_rule = static_cast<int32_t>(r);
  }
  ASSERT_GE(var_rule, 0);
  const StateTokens& t = (*g)->tokens(pda.rule_start[var_rule]);
  auto text = [&](const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids) out.emplace_back(vocab->token_bytes(id));
    return out;
  };
  EXPECT_TRUE(t.accepted_ids.empty() && t.accepted_bits.empty());
  // Sorted by bytes, with the shared prefix lengths the matcher's walk reuses.
  EXPECT_EQ(text(t.uncertain_ids), (std::vector<std::string>{"x", "x ", "x =", "x)", "y"}));
  EXPECT_EQ(t.uncertain_lcp, (std::vector<int32_t>{0, 1, 2, 1, 0}));
  // At run time the stack decides: at the start "x =" fits, "x)" does not; inside "(" both
  // "x)" and "x " do.
  GrammarMatcher m(*g);
  std::vector<uint32_t> mask(m.num_bitmask_words());
  for (const char* prefix : {"", "x = (", "x = (1 + (y"}) {
    GrammarMatcher at = m;
    ASSERT_TRUE(at.AcceptBytes(prefix)) << prefix;
    at.FillNextTokenBitmask(absl::MakeSpan(mask));
    EXPECT_EQ(MaskIds(mask), MaskIds(BruteForceMask(at))) << prefix;
  }
}

// The fast mask equals brute force along documents on the real Llama 3 vocabulary, for the
// grammars whose masks were costly before context expansion: a GBNF grammar with one-letter
// rules and the first steps inside JSON strings.
TEST(GrammarMatcherTest, Llama3MaskEqualsBruteForceAlongDocuments) {
  const std::string path = sluice::testing::RequirePath(sluice::testing::SharedDir() + "/tokenizers/llama3/tokenizer.json");
  auto tokenizer = Tokenizer::FromFile(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto vocab = TokenVocab::FromTokenizer(**tokenizer, {*(*tokenizer)->TokenToId("<|eot_id|>")});
  GrammarCompiler compiler(vocab);
  const std::vector<std::pair<GrammarSpec, std::string>> cases = {
      {{GrammarKind::kEbnf,
        "root ::= assign (\", \" assign){0,2}\nassign ::= var \" = \" expr\nvar ::= [a-z]\n"
        "expr ::= term ((\" + \" | \" * \") term)*\nterm ::= [0-9] | var | \"(\" expr \")\"\n", {}},
       "x = (1 + y) * 3, y = 4"},
      {{GrammarKind::kJsonSchema,
        R"({"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","tags"]})",
        {}},
       R"({"name": "A \"L\"", "tags": ["x"]})"},
  };
  for (const auto& [spec, doc] : cases) {
    auto g = compiler.Compile(spec);
    ASSERT_TRUE(g.ok()) << g.status();
    const std::vector<int32_t> ids = (*tokenizer)->Encode(doc, /*add_special_tokens=*/false);
    GrammarMatcher m(*g);
    std::vector<uint32_t> mask(m.num_bitmask_words());
    for (size_t i = 0; i <= ids.size(); ++i) {
      m.FillNextTokenBitmask(absl::MakeSpan(mask));
      ASSERT_EQ(MaskIds(mask), MaskIds(BruteForceMask(m))) << doc << " step " << i;
      if (i < ids.size()) ASSERT_TRUE(m.AcceptToken(ids[i])) << doc << " step " << i;
    }
  }
}


// Table sharing (a state's table derived from an earlier state's that no short string tells
// apart, walking only the deeper trie subtrees) gives every state the table a full vocabulary
// walk gives: for map-like objects, whose capped key characters make chains of such states,
// on the real Llama 3 vocabulary.
TEST(GrammarMatcherTest, SharedTableWalksEqualFullWalks) {
  const std::string path = sluice::testing::RequirePath(sluice::testing::SharedDir() + "/tokenizers/llama3/tokenizer.json");
  auto tokenizer = Tokenizer::FromFile(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto vocab = TokenVocab::FromTokenizer(**tokenizer, {*(*tokenizer)->TokenToId("<|eot_id|>")});
  auto accepted_ids = [&](const StateTokens& t) {
    std::vector<int32_t> ids = t.accepted_ids;
    if (!t.accepted_bits.empty()) ids = MaskIds(t.accepted_bits);
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  for (const char* schema : {
           R"({"type":"object","additionalProperties":{"type":"string"}})",
           // Keys of at most 12 characters: every k-characters-left state is a truncated copy of
           // the first (Truncation), down to the escapes' and UTF-8 sequences' inner states.
           R"({"type":"object","propertyNames":{"maxLength":12},"additionalProperties":{"type":"integer"}})",
           R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],"additionalProperties":{"type":"integer"}})",
           // Declared names sharing prefixes, one that JSON may escape ("a/b" as "a\/b"): the
           // prefix-tree states walk beside the key character chain (Reuse::ref_state).
           R"({"type":"object","properties":{"name":{"type":"string"},"nick":{"type":"string"},"id":{"type":"integer"},
               "a/b":{"type":"null"}},"additionalProperties":true})",
           // GBNF (not JSON): `field`'s loop state walks beside its first state, and its rule
           // returns inside the walked subtrees (the bench's ebnf_csv_rows).
           "root ::= header (\"\\n\" row){1,8}\nheader ::= \"id,name,city,amount\"\n"
           "row ::= [1-9] [0-9]* \",\" field \",\" field \",\" [0-9]+ \".\" [0-9] [0-9]\n"
           "field ::= [A-Za-z] [A-Za-z ]*\n",
       }) {
    absl::StatusOr<Grammar> grammar = schema[0] == '{' ? JsonSchemaToGrammar(nlohmann::json::parse(schema))
                                                       : ParseEbnf(schema);
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    PdaOptions full;
    full.share_table_walks = false;
    auto shared = CompiledGrammar::Create(*grammar, vocab);
    auto walked = CompiledGrammar::Create(*grammar, vocab, full);
    ASSERT_TRUE(shared.ok() && walked.ok());
    const Pda& pda = (*shared)->pda();
    ASSERT_EQ(pda.states.size(), (*walked)->pda().states.size());
    int32_t num_tables = 0;
    for (int32_t s = 0; s < static_cast<int32_t>(pda.states.size()); ++s) {
      const StateTokens& a = (*shared)->tokens(s);
      const StateTokens& b = (*walked)->tokens(s);
      ASSERT_EQ(accepted_ids(a), accepted_ids(b)) << schema << " state " << s;
      ASSERT_EQ(a.accepted_bits.empty(), b.accepted_bits.empty()) << schema << " state " << s;
      ASSERT_EQ(a.uncertain_ids, b.uncertain_ids) << schema << " state " << s;
      ASSERT_EQ(a.uncertain_lcp, b.uncertain_lcp) << schema << " state " << s;
      if (!accepted_ids(a).empty()) ++num_tables;
    }
    if (schema[0] == '{') EXPECT_GT(num_tables, 100) << schema;  // the key chain's states accept most tokens
    if (schema == std::string(R"({"type":"object","additionalProperties":{"type":"string"}})")) {
      // The 64-character key: every k-characters-left state but the first level's is a chain
      // copy (Truncation::Shift), 1,009 of its 1,309 tables.
      EXPECT_GT((*shared)->stats().num_chain_copies, 1000);
      EXPECT_EQ((*walked)->stats().num_chain_copies, 0);
    }
  }
}

// A free additional key holds at most 64 characters (code points; an escape or a UTF-8
// sequence is one), with the real Llama 3 tokens of the text: 64 pass, the 65th is refused by
// the mask and by AcceptToken, and after 64 the mask allows only tokens that close the key.
// The key chain's tables are chain copies, so this checks them at the bound itself.
TEST(GrammarMatcherTest, FreeAdditionalKeyHoldsAtMost64Characters) {
  const std::string path = sluice::testing::RequirePath(sluice::testing::SharedDir() + "/tokenizers/llama3/tokenizer.json");
  auto tokenizer = Tokenizer::FromFile(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const int32_t eot = *(*tokenizer)->TokenToId("<|eot_id|>");
  auto vocab = TokenVocab::FromTokenizer(**tokenizer, {eot});
  auto grammar = JsonSchemaToGrammar(nlohmann::json::parse(R"({"type":"object","additionalProperties":{"type":"string"}})"));
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  auto g = CompiledGrammar::Create(*grammar, vocab);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_GT((*g)->stats().num_chain_copies, 1000);
  // Feeds `text` token by token; returns how many tokens the mask allowed and the matcher took.
  auto feed = [&](GrammarMatcher& m, const std::string& text) {
    const std::vector<int32_t> ids = (*tokenizer)->Encode(text, /*add_special_tokens=*/false);
    std::vector<uint32_t> mask(m.num_bitmask_words());
    for (size_t i = 0; i < ids.size(); ++i) {
      m.FillNextTokenBitmask(absl::MakeSpan(mask));
      const bool allowed = (mask[ids[i] >> 5] >> (ids[i] & 31)) & 1u;
      GrammarMatcher copy = m;
      EXPECT_EQ(allowed, copy.AcceptToken(ids[i])) << text << " token " << i;
      if (!allowed) return std::make_pair(i, ids.size());
      EXPECT_TRUE(m.AcceptToken(ids[i]));
    }
    return std::make_pair(ids.size(), ids.size());
  };
  const std::string k63 = "customer_shipping_address_line_two_including_apartment_suite_no";
  ASSERT_EQ(k63.size(), 63u);
  struct Case {
    std::string key;  // as written in the JSON text
    bool fits;
  };
  for (const Case& c : std::vector<Case>{
           {k63, true},
           {k63 + "X", true},          // 64
           {k63 + "XY", false},        // 65
           {k63 + "\xC3\xA9", true},   // e-acute: two bytes, one character
           {k63 + "X\xC3\xA9", false},
           {k63 + "\\n", true},        // an escape is one character
           {k63 + "X\\n", false},
           {k63 + "\\u00e9", true},
           {k63 + "X\\u00e9", false},
           {k63 + "\xF0\x9F\x98\x80", true},  // one code point, four bytes
           {"x", true},
       }) {
    GrammarMatcher m(*g);
    const std::string doc = "{\"" + c.key + "\": \"v\"}";
    const auto [taken, total] = feed(m, doc);
    if (c.fits) {
      EXPECT_EQ(taken, total) << doc;
      EXPECT_TRUE(m.CanEnd()) << doc;
    } else {
      EXPECT_LT(taken, total) << doc;
    }
  }
  // After 64 characters, byte by byte so that no token spans the bound: the mask is exactly the
  // tokens a brute-force check allows, none of them another key character.
  GrammarMatcher m(*g);
  ASSERT_TRUE(m.AcceptBytes("{\"" + k63 + "X"));
  std::vector<uint32_t> mask(m.num_bitmask_words());
  m.FillNextTokenBitmask(absl::MakeSpan(mask));
  const std::vector<int32_t> allowed = MaskIds(mask);
  EXPECT_EQ(allowed, MaskIds(BruteForceMask(m)));
  ASSERT_FALSE(allowed.empty());
  for (int32_t id : allowed) {
    const std::string_view bytes = vocab->token_bytes(id);
    ASSERT_FALSE(bytes.empty());
    EXPECT_EQ(bytes[0], '"') << id;
  }
  // One character before the bound a key character still fits, two do not.
  GrammarMatcher before(*g);
  ASSERT_TRUE(before.AcceptBytes("{\"" + k63));
  before.FillNextTokenBitmask(absl::MakeSpan(mask));
  EXPECT_EQ(MaskIds(mask), MaskIds(BruteForceMask(before)));
  const int32_t x = *(*tokenizer)->TokenToId("X");
  const int32_t xy = *(*tokenizer)->TokenToId("XY");
  EXPECT_TRUE((mask[x >> 5] >> (x & 31)) & 1u);
  EXPECT_FALSE((mask[xy >> 5] >> (xy & 31)) & 1u);
}

// Once an additional property was emitted only additional keys can follow, and none may spell
// a declared name: at every split of `"name"` into an accepted prefix and the rest, no token the
// mask allows starts with the rest and the closing quote (any tokenization of the declared key
// has such a token). The same schemas as the grammar bench's extra_keys cases.
TEST(GrammarMatcherTest, MaskNeverAllowsADeclaredNameAsAnAdditionalKey) {
  const std::string path = sluice::testing::RequirePath(sluice::testing::SharedDir() + "/tokenizers/llama3/tokenizer.json");
  auto tokenizer = Tokenizer::FromFile(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto vocab = TokenVocab::FromTokenizer(**tokenizer, {*(*tokenizer)->TokenToId("<|eot_id|>")});
  struct Case {
    nlohmann::ordered_json schema;
    std::string prefix;  // a document up to an additional key's opening quote
  };
  nlohmann::ordered_json p8 = nlohmann::ordered_json::parse(
      R"({"id":{"type":"integer"},"name":{"type":"string"},"email":{"type":"string"},"age":{"type":"integer"},
          "active":{"type":"boolean"},"tags":{"type":"array","items":{"type":"string"}},"created_at":{"type":"string"},
          "score":{"type":"number"}})");
  nlohmann::ordered_json p30 = nlohmann::ordered_json::object();
  for (const char* w : {"title", "author", "isbn", "publisher", "year", "pages", "language", "genre", "price",
                        "currency", "in_stock", "rating", "reviews", "summary", "cover_url", "edition", "series",
                        "volume", "translator", "illustrator", "format", "weight", "width", "height", "depth",
                        "shelf", "barcode", "added_by", "updated_at", "notes"}) {
    p30[w] = {{"type", "string"}};
  }
  const std::vector<Case> cases = {
      {{{"type", "object"}, {"properties", p8}, {"required", {"id", "name"}}, {"additionalProperties", true}},
       R"({"id": 7, "name": "Ada", "x": 1, ")"},
      {{{"type", "object"}, {"properties", p30}, {"required", {"title"}}, {"additionalProperties", {{"type", "string"}}}},
       R"({"title": "t", "tit": "u", ")"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Grammar> grammar = JsonSchemaToGrammar(c.schema);
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    auto compiled = CompiledGrammar::Create(*grammar, vocab);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    int64_t checked = 0;
    for (auto it = c.schema["properties"].begin(); it != c.schema["properties"].end(); ++it) {
      const std::string name = it.key();
      for (size_t k = 0; k <= name.size(); ++k) {
        GrammarMatcher m(*compiled);
        ASSERT_TRUE(m.AcceptBytes(c.prefix + name.substr(0, k))) << name << " " << k;
        std::vector<uint32_t> mask(vocab->num_bitmask_words());
        m.FillNextTokenBitmask(absl::MakeSpan(mask));
        const std::string rest = name.substr(k) + "\"";
        int32_t allowed = 0;
        for (int32_t id : MaskIds(mask)) {
          const std::string_view bytes = vocab->token_bytes(id);
          EXPECT_FALSE(bytes.substr(0, rest.size()) == rest) << name << ": token '" << bytes << "' after " << k;
          ++allowed;
        }
        EXPECT_GT(allowed, 1000) << name << " " << k;  // other keys stay open
        // One character more is another key.
        EXPECT_TRUE(GrammarMatcher(m).AcceptBytes(name.substr(k) + "s\": \"v\"}")) << name;
        EXPECT_FALSE(GrammarMatcher(m).AcceptBytes(rest)) << name;
        ++checked;
      }
    }
    EXPECT_GT(checked, 40);
  }
}

}  // namespace
}  // namespace sluice::grammar
