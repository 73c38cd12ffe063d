// spec_bench: speculative decoding on the CPU engine — decode tokens/s and mean accepted length
// for no speculation, a fixed k and confidence-scheduled verification (auto), per batch size,
// with the measured acceptance and draft / verify step costs so the ceiling is visible.
//
// Workloads (greedy, ignore_eos, every request max_tokens tokens):
//   bible  KJV-style verse prompts (what sluice-mini-moe and sluice-mini-draft were trained on);
//   quote  repetitive passages (genealogies, refrains, lists) whose continuation repeats their
//          wording: the output quotes the prompt and itself (n-gram lookup's case).
// Clocks: the machine this runs on may be shared, so besides wall-clock time every run reports
// the process CPU time of its decode phase; run with SLUICE_CPU_THREADS=1 and the CPU-time rates
// (cpu_tokens_per_s, cpu_speedup) measure the work done whatever else runs beside it.
// Each configuration first runs one untimed round of the batch (warm-up: a serving engine's
// calibration and step-cost fit come from earlier traffic). Timing covers decode only: it starts at the first step after which every request of the batch
// has its first token (all prompts prefilled) and ends when all finish. Per configuration:
//   tokens_per_s, speedup (over "none" at the same batch), mean_accepted_length (tokens per
//   verification incl. the target's own), acceptance_rate, draft_s_per_step, verify_s_per_step,
//   plain_step_s (the "none" step time), and ceiling_speedup = mean_accepted_length ·
//   plain_step_s / (draft_s_per_step + verify_s_per_step): what acceptance and the two step
//   costs allow when every sequence verifies every step (batch 1).
//
// Usage: spec_bench --model DIR --draft DIR [--workload bible|quote] [--batches 1,8,64]
//                   [--max-tokens 48] [--configs none,draft:5,draft:auto,ngram:5,ngram:auto]
//                   [--out FILE]
#include <chrono>
#include <ctime>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "build_paths.h"
#include "engine/model/model.h"
#include "engine/sched/llm_engine.h"
#include "engine/spec/draft_model_drafter.h"
#include "engine/spec/ngram_drafter.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

const char* kVerses[] = {
    "Ge1:1 In the beginning God created the heaven and the earth.",
    "Ex20:2 I am the LORD thy God, which have brought thee out of the land of Egypt, out of the "
    "house of bondage.",
    "Psa23:1 The LORD is my shepherd; I shall not want.",
    "Pro3:5 Trust in the LORD with all thine heart; and lean not unto thine own understanding.",
    "Isa40:31 But they that wait upon the LORD shall renew their strength; they shall mount up "
    "with wings as eagles.",
    "Mat5:9 Blessed are the peacemakers: for they shall be called the children of God.",
    "Joh3:16 For God so loved the world, that he gave his only begotten Son.",
    "Rom8:28 And we know that all things work together for good to them that love God.",
};
const char* kRefs[] = {"Ge", "Ex", "Le", "Nu", "De", "Jos", "Jdg", "Ru"};
// Passages whose continuation repeats their own wording (genealogies, refrains, lists): the
// model's greedy continuation quotes the prompt, and its own output, at length.
const char* kQuotes[] = {
    "Ge5:6 And Seth lived an hundred and five years, and begat Enos:\nGe5:7 And Seth lived after "
    "he begat Enos eight hundred and seven years, and begat sons and daughters:\nGe5:8 And all "
    "the days of Seth were nine hundred and twelve years: and he died.\nGe5:9 And Enos lived "
    "ninety years, and begat Cainan:\nGe5:10 And Enos lived after he begat Cainan",
    "Psa136:1 O give thanks unto the LORD; for he is good: for his mercy endureth for ever.\n"
    "Psa136:2 O give thanks unto the God of gods: for his mercy endureth for ever.\nPsa136:3 O "
    "give thanks to the Lord of lords: for his mercy endureth for ever.\nPsa136:4 To him who "
    "alone doeth great wonders: for his mercy",
    "Mat1:2 Abraham begat Isaac; and Isaac begat Jacob; and Jacob begat Judas and his brethren;\n"
    "Mat1:3 And Judas begat Phares and Zara of Thamar; and Phares begat Esrom; and Esrom begat "
    "Aram;\nMat1:4 And Aram begat Aminadab; and Aminadab begat",
    "Mat5:3 Blessed are the poor in spirit: for theirs is the kingdom of heaven.\nMat5:4 Blessed "
    "are they that mourn: for they shall be comforted.\nMat5:5 Blessed are the meek: for they "
    "shall inherit the earth.\nMat5:6 Blessed are they which do hunger and thirst after "
    "righteousness: for they shall",
    "Nu7:14 One spoon of ten shekels of gold, full of incense:\nNu7:15 One young bullock, one "
    "ram, one lamb of the first year, for a burnt offering:\nNu7:16 One kid of the goats for a "
    "sin offering:\nNu7:20 One spoon of gold of ten shekels, full of incense:\nNu7:21 One young "
    "bullock, one ram,",
    "Ge1:1 In the beginning God created the heaven and the earth.\nGe1:2 And the earth was "
    "without form, and void; and darkness was upon the face of the deep.\nGe1:3 And God said, "
    "Let there be light: and there was light.\nGe1:4 And God saw the light, that it was good: "
    "and God divided the light from the darkness.\nGe1:5 And God called the light Day,",
    "Ec3:2 A time to be born, and a time to die; a time to plant, and a time to pluck up that "
    "which is planted;\nEc3:3 A time to kill, and a time to heal; a time to break down, and a "
    "time to build up;\nEc3:4 A time to weep, and a time to laugh; a time to mourn, and a time",
    "Psa150:3 Praise him with the sound of the trumpet: praise him with the psaltery and harp.\n"
    "Psa150:4 Praise him with the timbrel and dance: praise him with stringed instruments and "
    "organs.\nPsa150:5 Praise him upon the loud cymbals: praise him",
};

std::vector<std::vector<int32_t>> Prompts(const Tokenizer& tokenizer, const std::string& workload,
                                          int n) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    const std::string verse = kVerses[i % 8];
    std::string text;
    if (workload == "quote") {
      text = kQuotes[i % 8];
    } else {
      text = verse + "\n" + kRefs[(i / 8) % 8] + std::to_string(1 + i / 64) + ":" +
             std::to_string(1 + i % 31);
    }
    prompts.push_back(tokenizer.Encode(text, /*add_special_tokens=*/true));
  }
  return prompts;
}

struct Config {
  std::string name;  // "none", "draft:5", "draft:auto", "ngram:5", ...
  std::string method;
  VerifyMode mode = VerifyMode::kFixed;
  int32_t k = 5;
};

Config ParseConfig(const std::string& text) {
  Config c;
  c.name = text;
  if (text == "none") return c;
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  c.method = parts[0];
  if (parts.size() > 1 && parts[1] == "auto") {
    c.mode = VerifyMode::kAuto;
  } else if (parts.size() > 1) {
    c.k = std::stoi(parts[1]);
  }
  return c;
}

Json RunOne(const std::string& model_dir, const std::string& draft_dir, const Config& config,
            const std::vector<std::vector<int32_t>>& prompts, int batch, int max_tokens) {
  EngineOptions options;
  options.block_size = 16;
  options.num_kv_blocks = 64 + batch * 16;
  options.max_model_len = 512;
  options.max_num_seqs = batch;
  options.max_num_batched_tokens = 4096;
  std::shared_ptr<DraftModelDrafter> draft;
  if (config.method == "draft") {
    DraftModelOptions d;
    d.num_kv_blocks = options.num_kv_blocks;
    d.model_id = draft_dir;
    auto drafter = DraftModelDrafter::Create(*LoadModel(draft_dir), d);
    draft = std::shared_ptr<DraftModelDrafter>(std::move(*drafter));
    options.speculative.drafter = draft;
  } else if (config.method == "ngram") {
    options.speculative.drafter = std::make_shared<NgramDrafter>();
  }
  options.speculative.verify = config.mode;
  options.speculative.num_speculative_tokens = config.k;
  auto engine = *LLMEngine::Create(*LoadModel(model_dir), options);
  // Warm-up: one untimed round of the same batch, as a serving engine has seen traffic before
  // (the confidence scheduler's calibration and cost fit are measured then).
  for (int i = 0; i < batch; ++i) {
    EngineRequest r;
    r.request_id = "warm-" + std::to_string(i);
    r.prompt_token_ids = prompts[(i + 1) % prompts.size()];
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    if (!engine->AddRequest(std::move(r)).ok()) std::abort();
  }
  while (engine->HasUnfinishedRequests()) engine->Step();
  for (int i = 0; i < batch; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i % prompts.size()];
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    if (!engine->AddRequest(std::move(r)).ok()) std::abort();
  }
  std::map<std::string, int> emitted;
  // Prefill until every request has its first token.
  while (static_cast<int>(emitted.size()) < batch) {
    for (const RequestOutput& out : engine->Step()) emitted[out.request_id] += out.new_tokens.size();
  }
  const EngineCounters before = engine->counters();
  const Clock::time_point start = Clock::now();
  const double cpu_start = ProcessCpuSeconds();
  int64_t tokens = 0;
  while (engine->HasUnfinishedRequests()) {
    for (const RequestOutput& out : engine->Step()) tokens += out.new_tokens.size();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu_seconds = ProcessCpuSeconds() - cpu_start;
  const EngineCounters after = engine->counters();
  const double steps = static_cast<double>(after.num_steps - before.num_steps);
  const double drafts = after.num_spec_draft_tokens - before.num_spec_draft_tokens;
  const double accepted = after.num_spec_accepted_tokens - before.num_spec_accepted_tokens;
  const double verifications = after.num_spec_verifications - before.num_spec_verifications;
  Json j;
  j["config"] = config.name;
  j["batch"] = batch;
  j["decode_tokens"] = tokens;
  j["seconds"] = seconds;
  j["tokens_per_s"] = tokens / seconds;
  j["cpu_seconds"] = cpu_seconds;
  j["cpu_tokens_per_s"] = tokens / cpu_seconds;
  j["steps"] = steps;
  j["step_s"] = seconds / steps;
  j["acceptance_rate"] = drafts > 0 ? accepted / drafts : 0.0;
  j["mean_accepted_length"] = verifications > 0 ? (accepted + verifications) / verifications : 1.0;
  j["verifications_per_step"] = verifications / steps;
  j["draft_s_per_step"] = (after.spec_draft_seconds - before.spec_draft_seconds) / steps;
  j["verify_s_per_step"] = (after.spec_verify_seconds - before.spec_verify_seconds) / steps;
  return j;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  CLI::App app{"Speculative decoding benchmark (CPU engine)"};
  std::string model = std::string(SLUICE_SOURCE_DIR) + "/../shared/models/sluice-mini-moe";
  std::string draft = std::string(SLUICE_SOURCE_DIR) + "/../shared/models/sluice-mini-draft";
  std::string workload = "bible", batches = "1,8,64", configs = "none,draft:5,draft:auto";
  std::string out;
  int max_tokens = 48;
  app.add_option("--model", model);
  app.add_option("--draft", draft);
  app.add_option("--workload", workload)->check(CLI::IsMember({"bible", "quote"}));
  app.add_option("--batches", batches);
  app.add_option("--configs", configs);
  app.add_option("--max-tokens", max_tokens);
  app.add_option("--out", out);
  CLI11_PARSE(app, argc, argv);

  auto tokenizer = sluice::Tokenizer::FromFile(model + "/tokenizer.json");
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  const auto prompts = sluice::Prompts(**tokenizer, workload, 64);
  nlohmann::ordered_json result;
  result["bench"] = "spec_bench";
  result["model"] = model;
  result["draft"] = draft;
  result["workload"] = workload;
  result["max_tokens"] = max_tokens;
  result["runs"] = nlohmann::ordered_json::array();
  for (const std::string& b : std::vector<std::string>(absl::StrSplit(batches, ','))) {
    const int batch = std::stoi(b);
    double plain_tps = 0, plain_step = 0, plain_cpu_tps = 0;
    for (const std::string& c : std::vector<std::string>(absl::StrSplit(configs, ','))) {
      const sluice::Config config = sluice::ParseConfig(c);
      nlohmann::ordered_json run =
          sluice::RunOne(model, draft, config, prompts, batch, max_tokens);
      if (config.name == "none") {
        plain_tps = run["tokens_per_s"];
        plain_cpu_tps = run["cpu_tokens_per_s"];
        plain_step = run["step_s"];
      }
      if (plain_tps > 0) {
        run["speedup"] = run["tokens_per_s"].get<double>() / plain_tps;
        run["cpu_speedup"] = run["cpu_tokens_per_s"].get<double>() / plain_cpu_tps;
        const double spec_step =
            run["draft_s_per_step"].get<double>() + run["verify_s_per_step"].get<double>();
        run["plain_step_s"] = plain_step;
        if (config.name != "none" && spec_step > 0) {
          run["ceiling_speedup"] = run["mean_accepted_length"].get<double>() * plain_step / spec_step;
        }
      }
      std::cerr << run.dump() << "\n";
      result["runs"].push_back(run);
    }
  }
  const std::string text = result.dump(2);
  std::cout << text << "\n";
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return 0;
}
