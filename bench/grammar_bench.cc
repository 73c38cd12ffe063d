// grammar_bench: grammar compile time and per-token mask time of Sluice's grammar engine
// (engine/grammar) on a real tokenizer, along fixed valid documents.
//
//   build/bin/grammar_bench --tokenizer ../shared/tokenizers/llama3/tokenizer.json
//       --cases bench/grammar/cases.json --out bench/results/grammar_sluice_llama3.json
//   (one command line)
//
// For each case (a JSON Schema with a valid `instance`, or a GBNF `grammar` with a valid
// `document`, as in bench/grammar/ebnf_cases.json): the grammar is compiled `--compile_repeats`
// times without the cache (the fastest reported); the document (an `instance` serialized in the
// engine's JSON style, ", " and ": ") is tokenized, and the mask is filled before each of its
// tokens and once more at the end (EOS), each timed, in `--mask_repeats` passes with a fresh
// matcher each (per step the fastest pass counts: on a shared machine a pass may be preempted
// mid-step; the slow steps of a pass stay slow in every pass). bench/grammar/compare.py runs xgrammar and llguidance on the same documents.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// Compact JSON with the grammar's separators.
std::string Dump(const json& v) {
  if (v.is_object()) {
    std::string s = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) s += ", ";
      first = false;
      s += json(it.key()).dump() + ": " + Dump(it.value());
    }
    return s + "}";
  }
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Dump(v[i]);
    return s + "]";
  }
  return v.dump();
}

// TableDigest: an FNV-1a hash of every state's token tables (accepted bits or ids, uncertain
// ids and their shared-prefix lengths), so two builds of the engine can be checked to compute
// the same tables (compile speedups must not change a mask).
uint64_t TableDigest(const sluice::grammar::CompiledGrammar& g) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int k = 0; k < 8; ++k) {
      h ^= (v >> (8 * k)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  const int32_t n = static_cast<int32_t>(g.pda().states.size());
  for (int32_t s = 0; s < n; ++s) {
    const sluice::grammar::StateTokens& t = g.tokens(s);
    mix(static_cast<uint64_t>(s));
    for (const auto* v : {&t.accepted_ids, &t.uncertain_ids, &t.uncertain_lcp}) {
      mix(v->size());
      for (int32_t x : *v) mix(static_cast<uint32_t>(x));
    }
    mix(t.accepted_bits.size());
    for (uint32_t w : t.accepted_bits) mix(w);
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, cases_path, out_path;
  int compile_repeats = 3;
  int mask_repeats = 1;
  bool trace = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") tokenizer_path = argv[i + 1];
    else if (flag == "--cases") cases_path = argv[i + 1];
    else if (flag == "--out") out_path = argv[i + 1];
    else if (flag == "--compile_repeats") compile_repeats = std::stoi(argv[i + 1]);
    else if (flag == "--mask_repeats") mask_repeats = std::max(1, std::stoi(argv[i + 1]));
    else if (flag == "--trace") trace = std::string(argv[i + 1]) == "1";
  }
  if (tokenizer_path.empty() || cases_path.empty()) {
    std::fprintf(stderr, "usage: grammar_bench --tokenizer T --cases C [--out O] [--compile_repeats N] [--mask_repeats N] [--trace 1]\n");
    return 2;
  }
  auto tokenizer = sluice::Tokenizer::FromFile(tokenizer_path);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  std::ifstream in(cases_path);
  const json cases = json::parse(in);
  const auto vocab_start = Clock::now();
  auto vocab = sluice::grammar::TokenVocab::FromTokenizer(**tokenizer, {});
  const double vocab_ms = Ms(Clock::now() - vocab_start);
  json results = json::array();
  for (const json& c : cases) {
    // A JSON Schema case has "schema" and "instance"; a GBNF case "grammar" and "document".
    const bool ebnf = c.contains("grammar");
    sluice::grammar::GrammarSpec spec{
        ebnf ? sluice::grammar::GrammarKind::kEbnf : sluice::grammar::GrammarKind::kJsonSchema,
        ebnf ? c["grammar"].get<std::string>() : c["schema"].dump(), {}};
    std::vector<double> compile_ms;
    std::shared_ptr<const sluice::grammar::CompiledGrammar> compiled;
    for (int r = 0; r < compile_repeats; ++r) {
      sluice::grammar::GrammarCompiler compiler(vocab, {.cache_capacity = 0});
      const auto t0 = Clock::now();
      auto g = compiler.Compile(spec);
      compile_ms.push_back(Ms(Clock::now() - t0));
      if (!g.ok()) {
        std::fprintf(stderr, "%s: %s\n", c["name"].get<std::string>().c_str(),
                     std::string(g.status().message()).c_str());
        return 1;
      }
      compiled = *g;
    }
    const std::string doc = ebnf ? c["document"].get<std::string>() : Dump(c["instance"]);
    const std::vector<int32_t> ids = (*tokenizer)->Encode(doc, /*add_special_tokens=*/false);
    std::vector<double> mask_us;
    bool ok = true;
    for (int pass = 0; pass < mask_repeats && ok; ++pass) {
      sluice::grammar::GrammarMatcher matcher(compiled, std::vector<int32_t>{});
      std::vector<uint32_t> mask(matcher.num_bitmask_words());
      for (size_t i = 0; i <= ids.size(); ++i) {
        const auto t0 = Clock::now();
        matcher.FillNextTokenBitmask(absl::MakeSpan(mask));
        const double us = Ms(Clock::now() - t0) * 1000.0;
        if (pass == 0) {
          mask_us.push_back(us);
        } else {
          mask_us[i] = std::min(mask_us[i], us);
        }
        if (trace) {
          const int32_t ids_here[1] = {i < ids.size() ? ids[i] : 0};
          std::fprintf(stderr, "  step %zu %.1f us next '%s'\n", i, us,
                       i < ids.size() ? (*tokenizer)->DecodeBytes(ids_here, false).c_str() : "<end>");
        }
        if (i == ids.size()) break;
        if (!((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1u) || !matcher.AcceptToken(ids[i])) {
          ok = false;
          break;
        }
      }
      ok = ok && matcher.CanEnd();
    }
    std::sort(compile_ms.begin(), compile_ms.end());
    json r = {{"name", c["name"]},
              {"engine", "sluice"},
              {"document_ok", ok},
              {"num_tokens", ids.size()},
              {"document", doc},
              {"compile_ms", compile_ms.front()},
              {"mask_us_p50", Percentile(mask_us, 0.5)},
              {"mask_us_p99", Percentile(mask_us, 0.99)},
              {"mask_us_max", Percentile(mask_us, 1.0)},
              {"num_states", compiled->stats().num_states},
              {"num_uncertain", compiled->stats().num_uncertain},
              {"table_bytes", compiled->stats().table_bytes},
              {"table_digest", absl::StrFormat("%016x", TableDigest(*compiled))}};
    std::printf("%s\n", r.dump().c_str());
    std::fflush(stdout);
    results.push_back(r);
  }
  json out = {{"engine", "sluice"}, {"tokenizer", tokenizer_path}, {"vocab_size", vocab->vocab_size()},
              {"compile_repeats", compile_repeats}, {"mask_repeats", mask_repeats},
              {"vocab_build_ms", vocab_ms}, {"results", results}};
  if (!out_path.empty()) std::ofstream(out_path) << out.dump(1) << "\n";
  return 0;
}
