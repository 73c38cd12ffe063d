// spec_step_costs: CPU time of one forward of a single sequence with q query tokens after a
// context of c tokens — a decode step (q = 1), a verification of q - 1 drafts, a draft-model
// round — for the speculative-decoding cost picture on the CPU engine (bench/README.md).
//
// Each (model, q) point runs `--reps` forwards back to back and reports the calling thread's CPU
// time per forward (run with SLUICE_CPU_THREADS=1 so that is all the work), and the ratio to
// q = 1. Back to back, a small model stays in cache; inside the engine the other model's
// weights evict it between rounds, so engine-measured costs run higher.
//
// Usage: spec_step_costs [--model DIR]... [--context 128] [--queries 1,2,4,6] [--reps 100]
//                        [--out FILE]
#include <ctime>
#include <iostream>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "build_paths.h"
#include "engine/model/model.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Forward of positions [context, context + q) of one sequence whose KV holds [0, context).
absl::Status Run(Model& model, KvCache& kv, const std::vector<int32_t>& table, int context,
                 int q, std::vector<float>& logits) {
  ForwardInput in;
  SequenceSlice s;
  s.num_context_tokens = context;
  s.num_query_tokens = q;
  s.block_table = table;
  for (int p = context; p < context + q; ++p) {
    in.token_ids.push_back(100 + p % 997);
    in.positions.push_back(p);
    in.slot_mapping.push_back(p);
    in.logits_indices.push_back(p - context);
  }
  in.sequences.push_back(s);
  logits.resize(static_cast<size_t>(q) * model.config().vocab_size);
  return model.Forward(in, kv, absl::MakeSpan(logits));
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  CLI::App app{"Forward CPU time per query count (speculative decoding step costs)"};
  const std::string shared = std::string(SLUICE_SOURCE_DIR) + "/../shared/models/";
  std::vector<std::string> models = {shared + "sluice-mini-moe", shared + "sluice-mini-draft"};
  std::string queries = "1,2,3,4,5,6", out;
  int context = 128, reps = 100;
  app.add_option("--model", models);
  app.add_option("--context", context)->check(CLI::Range(1, 1900));
  app.add_option("--queries", queries);
  app.add_option("--reps", reps)->check(CLI::PositiveNumber);
  app.add_option("--out", out);
  CLI11_PARSE(app, argc, argv);

  nlohmann::ordered_json result;
  result["bench"] = "spec_step_costs";
  result["context"] = context;
  result["reps"] = reps;
  result["runs"] = nlohmann::ordered_json::array();
  for (const std::string& dir : models) {
    auto model = sluice::LoadModel(dir);
    if (!model.ok()) {
      std::cerr << model.status() << "\n";
      return 1;
    }
    constexpr int kBlock = 16;
    const int blocks = (context + 64 + kBlock - 1) / kBlock;
    sluice::KvCache kv((*model)->kv_cache_spec(), blocks, kBlock);
    std::vector<int32_t> table;
    for (int b = 0; b < blocks; ++b) table.push_back(b);
    std::vector<float> logits;
    if (absl::Status s = sluice::Run(**model, kv, table, 0, context, logits); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    double q1 = 0;
    for (const std::string& text : std::vector<std::string>(absl::StrSplit(queries, ','))) {
      const int q = std::stoi(text);
      (void)sluice::Run(**model, kv, table, context, q, logits);  // warm
      const double start = sluice::ThreadCpuSeconds();
      for (int r = 0; r < reps; ++r) (void)sluice::Run(**model, kv, table, context, q, logits);
      const double seconds = (sluice::ThreadCpuSeconds() - start) / reps;
      if (q == 1) q1 = seconds;
      nlohmann::ordered_json run;
      run["model"] = dir;
      run["queries"] = q;
      run["cpu_ms"] = seconds * 1e3;
      if (q1 > 0) run["ratio_to_q1"] = seconds / q1;
      std::cerr << run.dump() << "\n";
      result["runs"].push_back(run);
    }
  }
  const std::string text = result.dump(2);
  std::cout << text << "\n";
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return 0;
}
