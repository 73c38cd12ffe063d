// jump_forward_bench: model steps and time of JSON-schema constrained generation with and
// without jump-forward decoding (EngineOptions::grammar_jump_forward), same model, same run.
//
//   build/bin/jump_forward_bench --model models/sluice-mini-moe \
//       --cases bench/grammar/cases.json --out bench/results/grammar_jump_forward_cpu.json
//
// Every case's schema (key order kept) constrains one request ("Answer in JSON."), greedy, up
// to --max_tokens; all requests run together (--batch 0) or in batches of --batch, first with
// jump-forward off, then on, --repeats times each (the fastest run of each is reported). The
// outputs must be the same token for token (exit 1 otherwise). Reported: engine steps, tokens,
// forced tokens (steps saved), wall seconds, and the ratios on/off.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/grammar/grammar_compiler.h"
#include "engine/model/model.h"
#include "engine/sched/llm_engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::map<std::string, std::vector<int32_t>> tokens;
  int64_t steps = 0;
  int64_t generated = 0;
  int64_t forced = 0;
  double seconds = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = "models/sluice-mini-moe", cases_path = "bench/grammar/cases.json";
  std::string out_path;
  int max_tokens = 160, batch = 0, repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model_dir = argv[i + 1];
    else if (flag == "--cases") cases_path = argv[i + 1];
    else if (flag == "--out") out_path = argv[i + 1];
    else if (flag == "--max_tokens") max_tokens = std::stoi(argv[i + 1]);
    else if (flag == "--batch") batch = std::stoi(argv[i + 1]);
    else if (flag == "--repeats") repeats = std::stoi(argv[i + 1]);
  }
  auto tokenizer = sluice::Tokenizer::FromFile(model_dir + "/tokenizer.json");
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  auto probe = sluice::LoadModel(model_dir);
  if (!probe.ok()) {
    std::fprintf(stderr, "%s\n", std::string(probe.status().message()).c_str());
    return 1;
  }
  const int32_t vocab_size = static_cast<int32_t>((*probe)->config().vocab_size);
  probe->reset();
  sluice::grammar::GrammarCompiler compiler(
      sluice::grammar::TokenVocab::FromTokenizer(**tokenizer, {}, vocab_size));
  std::ifstream in(cases_path);
  const nlohmann::ordered_json cases = nlohmann::ordered_json::parse(in);
  std::vector<sluice::EngineRequest> requests;
  const std::vector<int32_t> prompt = (*tokenizer)->Encode(
      "<|begin_of_text|><|user|>\nAnswer in JSON.<|end_of_text|>\n<|assistant|>\n", false);
  for (const auto& c : cases) {
    auto g = compiler.Compile(
        {sluice::grammar::GrammarKind::kJsonSchema, c["schema"].dump(), {}});
    if (!g.ok()) {
      std::fprintf(stderr, "%s: %s\n", c["name"].get<std::string>().c_str(),
                   std::string(g.status().message()).c_str());
      return 1;
    }
    sluice::EngineRequest r;
    r.request_id = c["name"].get<std::string>();
    r.prompt_token_ids = prompt;
    r.sampling.temperature = 0;
    r.sampling.seed = 1;
    r.sampling.max_tokens = max_tokens;
    r.grammar = *g;
    requests.push_back(std::move(r));
  }
  const size_t group = batch > 0 ? static_cast<size_t>(batch) : requests.size();

  auto run = [&](bool jump_forward) -> Result {
    auto model = sluice::LoadModel(model_dir);
    sluice::EngineOptions options;
    options.block_size = 16;
    options.num_kv_blocks = 1024;
    options.grammar_jump_forward = jump_forward;
    auto engine = sluice::LLMEngine::Create(std::move(*model), options);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
      std::exit(1);
    }
    Result result;
    const auto t0 = Clock::now();
    for (size_t begin = 0; begin < requests.size(); begin += group) {
      for (size_t i = begin; i < std::min(requests.size(), begin + group); ++i) {
        if (!(*engine)->AddRequest(requests[i]).ok()) std::exit(1);
      }
      while ((*engine)->HasUnfinishedRequests()) {
        for (sluice::RequestOutput& out : (*engine)->Step()) {
          for (const sluice::SampledToken& t : out.new_tokens) {
            result.tokens[out.request_id].push_back(t.token_id);
          }
        }
      }
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const sluice::EngineCounters c = (*engine)->counters();
    result.steps = c.num_steps;
    result.generated = c.num_generation_tokens;
    result.forced = c.num_jump_forward_tokens;
    return result;
  };

  Result off, on;
  for (int r = 0; r < repeats; ++r) {
    Result a = run(false), b = run(true);
    if (r == 0 || a.seconds < off.seconds) off = a;
    if (r == 0 || b.seconds < on.seconds) on = b;
  }
  bool same = off.tokens == on.tokens;
  nlohmann::ordered_json per_case = nlohmann::ordered_json::array();
  for (const auto& [id, tokens] : off.tokens) {
    const bool eq = on.tokens[id] == tokens;
    per_case.push_back({{"name", id}, {"tokens", tokens.size()}, {"same_output", eq},
                        {"text", (*tokenizer)->Decode(tokens, true)}});
  }
  nlohmann::ordered_json out = {
      {"bench", "jump_forward"},
      {"model", model_dir},
      {"cases", cases_path},
      {"num_requests", requests.size()},
      {"batch", group},
      {"max_tokens", max_tokens},
      {"repeats", repeats},
      {"same_output", same},
      {"off", {{"steps", off.steps}, {"generated_tokens", off.generated}, {"seconds", off.seconds}}},
      {"on", {{"steps", on.steps}, {"generated_tokens", on.generated},
              {"jump_forward_tokens", on.forced}, {"seconds", on.seconds}}},
      {"steps_ratio_on_off", static_cast<double>(on.steps) / static_cast<double>(off.steps)},
      {"seconds_ratio_on_off", on.seconds / off.seconds},
      {"forced_fraction", static_cast<double>(on.forced) / static_cast<double>(on.generated)},
      {"per_case", per_case}};
  std::printf("%s\n", out.dump(2).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << out.dump(2) << "\n";
  return same ? 0 : 1;
}
