// spec_bench: speculative decoding on the CPU engine — decode tokens/s and mean accepted length
// for no speculation, a fixed k and confidence-scheduled verification (auto), per batch size,
// with the measured acceptance and draft / verify step costs so the ceiling is visible.
//
// Workloads (greedy, ignore_eos, every request max_tokens tokens):
//   bible  KJV-style verse prompts (what sluice-mini-moe and sluice-mini-draft were trained on);
//   quote  Numbers 7's repeated offering formula: the continuation quotes the prompt word for
//          word (n-gram lookup's case).
// Clocks: the machine this runs on may be shared, so besides wall-clock time every run reports
// the process CPU time of its decode phase; run with SLUICE_CPU_THREADS=1 and the CPU-time rates
// (cpu_tokens_per_s, cpu_speedup) measure the work done whatever else runs beside it.
// Each configuration first runs one untimed round of the batch (warm-up: a serving engine's
// calibration and step-cost fit come from earlier traffic). Timing covers decode only: it
// starts at the first step after which every request of the batch has its first token (all
// prompts prefilled) and ends when all finish. Per configuration:
//   tokens_per_s, speedup (over "none" at the same batch), mean_accepted_length (tokens per
//   verification incl. the target's own), acceptance_rate, draft_s_per_step, verify_s_per_step,
//   plain_step_s (the "none" step time), requests_equal_to_none (of `requests`: greedy
//   outputs token for token those of "none" in the same repeat), and ceiling_speedup =
//   mean_accepted_length · plain_step_s / (draft_s_per_step + verify_s_per_step): what
//   acceptance and the two step costs allow when every sequence verifies every step (batch 1).
//
// --device cuda (CUDA builds): the target runs on the GPU's CUDA runner (bf16, decode graphs,
// async scheduling for "none"; verify steps synchronous, replaying decode graphs of k + 1 query
// tokens per sequence, or eagerly with the config modifier "-eager", e.g. ngram-eager:5), the
// draft model on the same GPU (or on the CPU with the modifier "-cpu", e.g. draft-cpu-v1024:5;
// FR-Spec's "-vN" needs the CPU draft), as `sluice serve --device cuda` runs them. The confidence scheduler then prices steps on wall
// time (CPU time does not see the GPU), and the wall-clock fields are the ones to read.
//
// Usage: spec_bench --model DIR --draft DIR [--workload bible|quote] [--batches 1,8,64]
//                   [--max-tokens 48] [--configs none,draft:5,draft:auto,ngram:5,ngram:auto]
//                   [--device cpu|cuda] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdlib>
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
#include "services/common/crash_handler.h"
#include "nlohmann/json.hpp"

#if defined(SLUICE_SPEC_BENCH_CUDA)
#include "engine/cuda/cuda_model.h"
#endif

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
// Numbers 7:13-31 (KJV): the twelve princes' offerings repeat one formula verse for verse, and
// sluice-mini-moe continues a prompt holding a few of them by quoting the formula from the
// prompt word for word (the case n-gram prompt lookup is for).
const char* kNumbers7[] = {
    "And his offering was one silver charger, the weight thereof was an hundred and thirty "
    "shekels, one silver bowl of seventy shekels, after the shekel of the sanctuary; both of them "
    "were full of fine flour mingled with oil for a meat offering:",
    "One spoon of ten shekels of gold, full of incense:",
    "One young bullock, one ram, one lamb of the first year, for a burnt offering:",
    "One kid of the goats for a sin offering:",
    "And for a sacrifice of peace offerings, two oxen, five rams, five he goats, five lambs of the "
    "first year: this was the offering of Nahshon the son of Amminadab.",
    "On the second day Nethaneel the son of Zuar, prince of Issachar, did offer:",
    "He offered for his offering one silver charger, the weight whereof was an hundred and thirty "
    "shekels, one silver bowl of seventy shekels, after the shekel of the sanctuary; both of them "
    "full of fine flour mingled with oil for a meat offering:",
    "One spoon of gold of ten shekels, full of incense:",
    "One young bullock, one ram, one lamb of the first year, for a burnt offering:",
    "One kid of the goats for a sin offering:",
    "And for a sacrifice of peace offerings, two oxen, five rams, five he goats, five lambs of the "
    "first year: this was the offering of Nethaneel the son of Zuar.",
    "On the third day Eliab the son of Helon, prince of the children of Zebulun, did offer:",
    "His offering was one silver charger, the weight whereof was an hundred and thirty shekels, "
    "one silver bowl of seventy shekels, after the shekel of the sanctuary; both of them full of "
    "fine flour mingled with oil for a meat offering:",
    "One golden spoon of ten shekels, full of incense:",
    "One young bullock, one ram, one lamb of the first year, for a burnt offering:",
    "One kid of the goats for a sin offering:",
    "And for a sacrifice of peace offerings, two oxen, five rams, five he goats, five lambs of the "
    "first year: this was the offering of Eliab the son of Helon.",
    "On the fourth day Elizur the son of Shedeur, prince of the children of Reuben, did offer:",
    "His offering was one silver charger of the weight of an hundred and thirty shekels, one "
    "silver bowl of seventy shekels, after the shekel of the sanctuary; both of them full of fine "
    "flour mingled with oil for a meat offering:",
};
// Quote prompt i: verses [first, last) of kNumbers7 in full, then the first `words` words of
// verse `last` (a reference "Num7:V" per verse, as the training text has).
struct QuoteCut {
  int first, last, words;
};
constexpr QuoteCut kQuoteCuts[] = {{0, 12, 5}, {0, 11, 6}, {6, 14, 3}, {0, 17, 4},
                                   {0, 6, 6},  {6, 16, 7}, {0, 16, 8}, {5, 18, 6}};

std::string QuotePrompt(int i) {
  const QuoteCut& c = kQuoteCuts[i % 8];
  std::string text;
  for (int v = c.first; v < c.last; ++v) {
    text += "Num7:" + std::to_string(13 + v) + " " + kNumbers7[v] + "\n";
  }
  const std::vector<std::string> words = absl::StrSplit(kNumbers7[c.last], ' ');
  text += "Num7:" + std::to_string(13 + c.last);
  for (int w = 0; w < c.words && w < static_cast<int>(words.size()); ++w) text += " " + words[w];
  return text;
}

std::vector<std::vector<int32_t>> Prompts(const Tokenizer& tokenizer, const std::string& workload,
                                          int n) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    const std::string verse = kVerses[i % 8];
    std::string text;
    if (workload == "quote") {
      text = QuotePrompt(i);
    } else {
      text = verse + "\n" + kRefs[(i / 8) % 8] + std::to_string(1 + i / 64) + ":" +
             std::to_string(1 + i % 31);
    }
    prompts.push_back(tokenizer.Encode(text, /*add_special_tokens=*/true));
  }
  return prompts;
}

struct Config {
  std::string name;  // "none", "draft:5", "draft:auto", "ngram:5", "draft-f32-v2048:auto", ...
  std::string method;
  VerifyMode mode = VerifyMode::kFixed;
  int32_t k = 5;
  bool draft_bf16 = true;  // "-f32": the draft keeps float32 weights
  int32_t draft_vocab = 0;  // "-vN": FR-Spec over the N most frequent tokens
  // "-eager" (--device cuda): verify steps run eagerly, without the multi-token decode graphs
  // (CudaRunnerOptions::graph_query_lens).
  bool verify_graphs = true;
  // "-cpu" (--device cuda): the draft model runs on the CPU engine instead of the GPU.
  bool draft_on_cpu = false;
};

Config ParseConfig(const std::string& text) {
  Config c;
  c.name = text;
  if (text == "none") return c;
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  const std::vector<std::string> method = absl::StrSplit(parts[0], '-');
  c.method = method[0];
  for (size_t i = 1; i < method.size(); ++i) {
    if (method[i] == "f32") {
      c.draft_bf16 = false;
    } else if (method[i] == "eager") {
      c.verify_graphs = false;
    } else if (method[i] == "cpu") {
      c.draft_on_cpu = true;
    } else if (!method[i].empty() && method[i][0] == 'v') {
      c.draft_vocab = std::stoi(method[i].substr(1));
    } else {
      std::cerr << "spec_bench: unknown config modifier '" << method[i] << "' in " << text << "\n";
      std::exit(2);
    }
  }
  if (parts.size() > 1 && parts[1] == "auto") {
    c.mode = VerifyMode::kAuto;
  } else if (parts.size() > 1) {
    c.k = std::stoi(parts[1]);
  }
  return c;
}

[[noreturn]] void Fail(const absl::Status& s) {
  std::cerr << "spec_bench: " << s << "\n";
  std::exit(1);
}

// LoadTarget: the target on `device`; a CUDA target keeps its KV on the GPU
// (options->allocate_host_kv_cache false) with logits rows for k + 1 positions per sequence and,
// with `verify_graphs`, decode graphs of 2..k + 1 query tokens per sequence (k:
// options->speculative.num_speculative_tokens), as `sluice serve` captures them.
std::unique_ptr<Model> LoadTarget(const std::string& model_dir, const std::string& device,
                                  bool verify_graphs, EngineOptions* options) {
  if (device == "cpu") {
    auto model = LoadModel(model_dir);
    if (!model.ok()) Fail(model.status());
    return *std::move(model);
  }
#if defined(SLUICE_SPEC_BENCH_CUDA)
  cuda_runner::CudaRunnerOptions r;
  r.block_size = options->block_size;
  r.max_model_len = options->max_model_len;
  r.max_num_tokens = options->max_num_batched_tokens;
  r.max_num_seqs = options->max_num_seqs;
  r.max_num_logits = int64_t{options->max_num_seqs} * (1 + kMaxSpeculativeTokens);
  if (verify_graphs && options->speculative.drafter != nullptr) {
    for (int32_t q = 2; q <= 1 + options->speculative.num_speculative_tokens; ++q) {
      r.graph_query_lens.push_back(q);
    }
  }
  auto model = cuda_runner::LoadCudaModel(model_dir, r);
  if (!model.ok()) Fail(model.status());
  options->allocate_host_kv_cache = false;
  return *std::move(model);
#else
  Fail(absl::InvalidArgumentError("--device cuda: this build has no CUDA backend"));
#endif
}

// Outputs: each timed request's generated token ids, by request id.
using Outputs = std::map<std::string, std::vector<int32_t>>;

// LoadCudaDraft: the draft model on the GPU beside the target, as `sluice serve --device cuda`
// runs it (services/serve/model_runtime.cc): the engine's step limits, decode graphs.
std::unique_ptr<Model> LoadCudaDraft(const std::string& draft_dir, const EngineOptions& options) {
#if defined(SLUICE_SPEC_BENCH_CUDA)
  cuda_runner::CudaRunnerOptions r;
  r.block_size = options.block_size;
  r.max_model_len = options.max_model_len;
  r.max_num_tokens = options.max_num_batched_tokens;
  r.max_num_seqs = options.max_num_seqs;
  auto model = cuda_runner::LoadCudaModel(draft_dir, r);
  if (!model.ok()) Fail(model.status());
  return *std::move(model);
#else
  Fail(absl::InvalidArgumentError("--device cuda: this build has no CUDA backend"));
#endif
}

Json RunOne(const std::string& model_dir, const std::string& draft_dir, const Config& config,
            const std::vector<std::vector<int32_t>>& prompts, int batch, int max_tokens,
            const std::string& device, Outputs* outputs) {
  EngineOptions options;
  options.block_size = 16;
  size_t longest = 0;
  for (const std::vector<int32_t>& p : prompts) longest = std::max(longest, p.size());
  options.max_model_len = static_cast<int32_t>(longest) + max_tokens + 1;
  // Every request's prompt and output fit at once (no preemption), plus slack.
  options.num_kv_blocks = 64 + batch * ((options.max_model_len + 15) / 16);
  options.max_num_seqs = batch;
  options.max_num_batched_tokens = 4096;
  std::shared_ptr<DraftModelDrafter> draft;
  if (config.method == "draft") {
    DraftModelOptions d;
    d.num_kv_blocks = options.num_kv_blocks;
    d.model_id = draft_dir;
    d.cost_clock = device == "cpu" ? CostClock::kProcessCpu : CostClock::kWall;
    d.bf16_weights = config.draft_bf16;
    d.draft_vocab = config.draft_vocab;
    std::unique_ptr<Model> draft_model;
    if (device == "cuda" && !config.draft_on_cpu) {
      draft_model = LoadCudaDraft(draft_dir, options);
      d.max_tokens_per_forward = options.max_num_batched_tokens;
      d.host_kv_storage = false;
    } else {
      draft_model = *LoadModel(draft_dir);
    }
    auto drafter = DraftModelDrafter::Create(std::move(draft_model), d);
    if (!drafter.ok()) Fail(drafter.status());
    draft = std::shared_ptr<DraftModelDrafter>(std::move(*drafter));
    options.speculative.drafter = draft;
  } else if (config.method == "ngram") {
    options.speculative.drafter = std::make_shared<NgramDrafter>();
  }
  options.speculative.verify = config.mode;
  // The confidence scheduler prices drafts on CPU time, as this bench measures (see Clocks).
  options.speculative.cost_clock = device == "cpu" ? CostClock::kProcessCpu : CostClock::kWall;
  options.speculative.num_speculative_tokens = config.k;
  std::unique_ptr<Model> target = LoadTarget(model_dir, device, config.verify_graphs, &options);
  auto created = LLMEngine::Create(std::move(target), options);
  if (!created.ok()) Fail(created.status());
  std::unique_ptr<LLMEngine> engine = *std::move(created);
  // Warm-up: one untimed round of the same batch, as a serving engine has seen traffic before
  // (the confidence scheduler's calibration and cost fit are measured then).
  for (int i = 0; i < batch; ++i) {
    EngineRequest r;
    r.request_id = "warm-" + std::to_string(i);
    r.prompt_token_ids = prompts[(i + 1) % prompts.size()];
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    if (absl::Status s = engine->AddRequest(std::move(r)); !s.ok()) Fail(s);
  }
  while (engine->HasUnfinishedRequests()) engine->Step();
  for (int i = 0; i < batch; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i % prompts.size()];
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    if (absl::Status s = engine->AddRequest(std::move(r)); !s.ok()) Fail(s);
  }
  std::map<std::string, int> emitted;
  // Prefill until every request has its first token.
  outputs->clear();
  while (static_cast<int>(emitted.size()) < batch) {
    for (const RequestOutput& out : engine->Step()) {
      emitted[out.request_id] += out.new_tokens.size();
      std::vector<int32_t>& ids = (*outputs)[out.request_id];
      for (const SampledToken& t : out.new_tokens) ids.push_back(t.token_id);
    }
  }
  const EngineCounters before = engine->counters();
  const Clock::time_point start = Clock::now();
  const double cpu_start = ProcessCpuSeconds();
  int64_t tokens = 0;
  while (engine->HasUnfinishedRequests()) {
    for (const RequestOutput& out : engine->Step()) {
      tokens += out.new_tokens.size();
      std::vector<int32_t>& ids = (*outputs)[out.request_id];
      for (const SampledToken& t : out.new_tokens) ids.push_back(t.token_id);
    }
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
  j["device"] = device;
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
  // Auto verification on a target with asynchronous steps: steps run plain and pipelined.
  j["pipelined_steps_per_step"] =
      static_cast<double>(after.num_spec_pipelined_steps - before.num_spec_pipelined_steps) /
      steps;
  j["draft_s_per_step"] = (after.spec_draft_seconds - before.spec_draft_seconds) / steps;
  j["verify_s_per_step"] = (after.spec_verify_seconds - before.spec_verify_seconds) / steps;
  j["cpu_step_s"] = cpu_seconds / steps;
  j["draft_cpu_s_per_step"] =
      (after.spec_draft_cpu_seconds - before.spec_draft_cpu_seconds) / steps;
  j["verify_cpu_s_per_step"] =
      (after.spec_verify_cpu_seconds - before.spec_verify_cpu_seconds) / steps;
  return j;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  sluice::InstallCrashHandler(argv[0]);
  CLI::App app{"Speculative decoding benchmark (CPU engine, or the CUDA runner with --device)"};
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
  std::string device = "cpu";
  app.add_option("--device", device, "Where the target and the draft model run (draft on the CPU: config modifier -cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  int repeats = 1;
  app.add_option("--repeats", repeats,
                 "Run the config list this many times per batch, interleaved (A B C A B C ...); "
                 "each speedup is over the same repeat's \"none\", and `summary` holds the "
                 "medians");
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
  result["device"] = device;
  result["max_tokens"] = max_tokens;
  result["repeats"] = repeats;
  {
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) == 3) result["load_average_start"] = {load[0], load[1], load[2]};
  }
  result["runs"] = nlohmann::ordered_json::array();
  // (batch, config) → the repeats' cpu_speedup / speedup / mean accepted length.
  std::map<std::pair<int, std::string>, std::vector<double>> cpu_speedups, speedups, lengths;
  for (const std::string& b : std::vector<std::string>(absl::StrSplit(batches, ','))) {
    const int batch = std::stoi(b);
   for (int rep = 0; rep < repeats; ++rep) {
    double plain_tps = 0, plain_step = 0, plain_cpu_tps = 0, plain_cpu_step = 0;
    sluice::Outputs plain_outputs, outputs;
    for (const std::string& c : std::vector<std::string>(absl::StrSplit(configs, ','))) {
      const sluice::Config config = sluice::ParseConfig(c);
      nlohmann::ordered_json run =
          sluice::RunOne(model, draft, config, prompts, batch, max_tokens, device, &outputs);
      if (config.name == "none") plain_outputs = outputs;
      if (config.name != "none" && !plain_outputs.empty()) {
        // Greedy: speculation must not change the text. On the CPU every request is equal;
        // on CUDA a verify row's GEMM shape differs from a decode row's, so bf16 rounding may
        // part a sequence where two logits tie within it (engine/cuda/cuda_spec_test.cc).
        int equal = 0;
        for (const auto& [id, ids] : outputs) equal += plain_outputs[id] == ids;
        run["requests_equal_to_none"] = equal;
        run["requests"] = outputs.size();
      }
      if (config.name == "none") {
        plain_tps = run["tokens_per_s"];
        plain_cpu_tps = run["cpu_tokens_per_s"];
        plain_step = run["step_s"];
        plain_cpu_step = run["cpu_step_s"];
      }
      if (plain_tps > 0) {
        run["speedup"] = run["tokens_per_s"].get<double>() / plain_tps;
        run["cpu_speedup"] = run["cpu_tokens_per_s"].get<double>() / plain_cpu_tps;
        const double spec_step =
            run["draft_s_per_step"].get<double>() + run["verify_s_per_step"].get<double>();
        const double spec_cpu_step = run["draft_cpu_s_per_step"].get<double>() +
                                     run["verify_cpu_s_per_step"].get<double>();
        run["plain_step_s"] = plain_step;
        run["plain_cpu_step_s"] = plain_cpu_step;
        if (config.name != "none" && spec_step > 0) {
          run["ceiling_speedup"] = run["mean_accepted_length"].get<double>() * plain_step / spec_step;
        }
        if (config.name != "none" && spec_cpu_step > 0 && batch == 1) {
          // Batch 1: a step either verifies (its draft and verify CPU time) or, with no drafts,
          // is a plain step; the ceiling is the tokens those costs give per plain step's time.
          const double plain_steps = 1.0 - run["verifications_per_step"].get<double>();
          const double tokens_per_step =
              run["decode_tokens"].get<double>() / run["steps"].get<double>();
          const double ceiling =
              tokens_per_step * plain_cpu_step / (spec_cpu_step + plain_steps * plain_cpu_step);
          run["cpu_ceiling_speedup"] = ceiling;
          run["cpu_speedup_of_ceiling"] = run["cpu_speedup"].get<double>() / ceiling;
        }
      }
      run["repeat"] = rep;
      if (run.contains("cpu_speedup")) {
        cpu_speedups[{batch, c}].push_back(run["cpu_speedup"].get<double>());
        speedups[{batch, c}].push_back(run["speedup"].get<double>());
      }
      lengths[{batch, c}].push_back(run["mean_accepted_length"].get<double>());
      std::cerr << run.dump() << "\n";
      result["runs"].push_back(run);
    }
   }
  }
  const auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  result["summary"] = nlohmann::ordered_json::array();
  for (const auto& [key, values] : cpu_speedups) {
    nlohmann::ordered_json row;
    row["batch"] = key.first;
    row["config"] = key.second;
    row["median_cpu_speedup"] = median(values);
    row["cpu_speedups"] = values;
    row["median_wall_speedup"] = median(speedups[key]);
    row["median_mean_accepted_length"] = median(lengths[key]);
    result["summary"].push_back(row);
    std::cerr << row.dump() << "\n";
  }
  {
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) == 3) result["load_average_end"] = {load[0], load[1], load[2]};
  }
  const std::string text = result.dump(2);
  std::cout << text << "\n";
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return 0;
}
