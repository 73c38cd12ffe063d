// grammar_mask_tool: Sluice's grammar engine behind a line protocol, for tests that compare its
// token masks with another engine's (tests/e2e/test_grammar_vs_xgrammar.py).
//
//   grammar_mask_tool --tokenizer PATH/tokenizer.json --eos 2[,3...]
//
// Reads one JSON object per line on stdin and answers one JSON line on stdout:
//   {"op": "compile", "kind": "json_schema"|"json_object"|"regex"|"grammar", "text": "..."}
//       -> {"ok": true} (a fresh matcher at the grammar's start) or {"ok": false, "error": "..."}
//   {"op": "mask"}              -> {"mask": "<hex>", "can_end": b, "terminated": b}
//   {"op": "accept", "token": N} -> {"ok": b, ...the mask fields after it}
// The mask is the bitmask's uint32 words, each as 8 hex digits, least significant word first
// (bit i of word i/32 set = token i allowed).
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using sluice::grammar::GrammarKind;

bool KindByName(const std::string& name, GrammarKind* kind) {
  for (GrammarKind k : {GrammarKind::kJsonSchema, GrammarKind::kJsonObject, GrammarKind::kRegex,
                        GrammarKind::kChoice, GrammarKind::kEbnf}) {
    if (name == sluice::grammar::GrammarKindName(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

void AddMask(sluice::grammar::GrammarMatcher& m, json& reply) {
  std::vector<uint32_t> words(m.num_bitmask_words());
  m.FillNextTokenBitmask(absl::MakeSpan(words));
  std::string hex;
  hex.reserve(words.size() * 8);
  char buf[9];
  for (uint32_t w : words) {
    std::snprintf(buf, sizeof(buf), "%08x", w);
    hex += buf;
  }
  reply["mask"] = std::move(hex);
  reply["can_end"] = m.CanEnd();
  reply["terminated"] = m.IsTerminated();
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path;
  std::vector<int32_t> eos;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") {
      tokenizer_path = argv[i + 1];
    } else if (flag == "--eos") {
      for (absl::string_view part : absl::StrSplit(argv[i + 1], ',', absl::SkipEmpty())) {
        int32_t id = 0;
        if (!absl::SimpleAtoi(part, &id)) {
          std::fprintf(stderr, "bad --eos id '%s'\n", std::string(part).c_str());
          return 2;
        }
        eos.push_back(id);
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (tokenizer_path.empty()) {
    std::fprintf(stderr, "usage: grammar_mask_tool --tokenizer T [--eos ID,...]\n");
    return 2;
  }
  auto tokenizer = sluice::Tokenizer::FromFile(tokenizer_path);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  auto vocab = sluice::grammar::TokenVocab::FromTokenizer(**tokenizer, eos);
  sluice::grammar::GrammarCompiler compiler(vocab, {.cache_capacity = 0});
  std::unique_ptr<sluice::grammar::GrammarMatcher> matcher;
  std::string line;
  while (std::getline(std::cin, line)) {
    const json cmd = json::parse(line, nullptr, /*allow_exceptions=*/false);
    json reply;
    const std::string op = cmd.is_object() ? cmd.value("op", "") : "";
    if (op == "compile") {
      sluice::grammar::GrammarSpec spec;
      if (!KindByName(cmd.value("kind", ""), &spec.kind)) {
        reply = {{"ok", false}, {"error", "unknown kind"}};
      } else {
        spec.text = cmd.value("text", "");
        auto g = compiler.Compile(spec);
        if (g.ok()) {
          matcher = std::make_unique<sluice::grammar::GrammarMatcher>(*g);
          reply = {{"ok", true}};
        } else {
          matcher.reset();
          reply = {{"ok", false}, {"error", std::string(g.status().message())}};
        }
      }
    } else if (matcher == nullptr && (op == "mask" || op == "accept")) {
      reply = {{"error", "no grammar compiled"}};
    } else if (op == "mask") {
      AddMask(*matcher, reply);
    } else if (op == "accept" && cmd.contains("token") && cmd["token"].is_number_integer()) {
      reply["ok"] = matcher->AcceptToken(cmd["token"].get<int32_t>());
      AddMask(*matcher, reply);
    } else {
      reply = {{"error", "bad command: " + line}};
    }
    std::cout << reply.dump() << '\n' << std::flush;
  }
  return 0;
}
