// SWA bounded replay evaluation (engine/kv/swa_replay.h) on the 64 held-out sequences of
// shared/models/sluice-mini-swa/swa_replay_reference.json: the engine's suffix loss of exact
// decoding and of replay for every (full_kv, R) the reference lists, next to the transformers
// numbers, plus the KV bytes stored/moved per token with and without replay and the cost of a
// replay against a full prefill of the prefix.
//
//   <build>/bin/swa_replay_eval --git-commit $(git rev-parse HEAD)   # writes
//   bench/results/swa_replay.json; --sequences 8 for a quick look. Protocol and fields:
//   bench/README.md "swa_replay_eval".
#include "engine/kv/swa_replay_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "build_paths.h"
#include "engine/kv/swa_replay.h"
#include "engine/model/model.h"
#include "kernels/common/parallel.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

const char* FullKvName(SwaReplayFullKv f) {
  return f == SwaReplayFullKv::kExact ? "exact" : "recomputed";
}

// Median wall time of `runs` calls of `fn` (seconds).
template <typename Fn>
double MedianSeconds(int runs, Fn fn) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const Clock::time_point start = Clock::now();
    fn();
    t.push_back(Seconds(start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Replay cost against prefill on sequence 0: the prefix [0, P) prefilled in one Forward, and
// ReplaySlidingWindowKv for each R over that cache.
Json TimeReplay(Model& model, const std::vector<int32_t>& ids, int32_t P,
                const std::vector<int64_t>& rs, int runs) {
  const int64_t bs = 16, blocks = (P + bs - 1) / bs;
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
  KvCache cache(model.kv_cache_spec(), blocks, bs);
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + P);
  const ForwardInput prefill = SequenceChunkInput(prefix, 0, P, table, bs, {});
  Json out;
  out["prefill_prefix_seconds"] = MedianSeconds(runs, [&] {
    if (!model.Forward(prefill, cache, {}).ok()) std::abort();
  });
  Json per_r = Json::array();
  for (int64_t r : rs) {
    SwaReplayOptions options;
    options.replay_tokens = r;
    const double s = MedianSeconds(runs, [&] {
      if (!ReplaySlidingWindowKv(model, cache, prefix, table, options).ok()) std::abort();
    });
    per_r.push_back({{"R", r}, {"replay_seconds", s}});
  }
  out["replay"] = per_r;
  return out;
}

int Main(int argc, char** argv) {
  CLI::App app{"SWA bounded replay: suffix loss against the transformers reference"};
  std::string model_dir = std::string(SLUICE_SOURCE_DIR) + "/../shared/models/sluice-mini-swa";
  std::string reference_path;
  std::string out_path = std::string(SLUICE_SOURCE_DIR) + "/bench/results/swa_replay.json";
  std::string git_commit = "unknown";
  int sequences = 0;
  int64_t block_size = 16;
  int timing_runs = 5;
  app.add_option("--model", model_dir, "model directory (sluice-mini-swa)");
  app.add_option("--reference", reference_path,
                 "reference JSON (default: <model>/swa_replay_reference.json)");
  app.add_option("--out", out_path, "JSON output path");
  app.add_option("--sequences", sequences, "evaluate the first N sequences (0: all)");
  app.add_option("--block-size", block_size, "KV block size in tokens");
  app.add_option("--timing-runs", timing_runs, "repetitions of the replay timing (median)");
  app.add_option("--git-commit", git_commit, "commit recorded in the output");
  CLI11_PARSE(app, argc, argv);
  if (reference_path.empty()) reference_path = model_dir + "/swa_replay_reference.json";

  std::ifstream f(reference_path);
  const nlohmann::json ref = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (ref.is_discarded() || !ref.contains("replay")) {
    std::cerr << "cannot read " << reference_path << "\n";
    return 1;
  }
  auto model = LoadModel(model_dir);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  const int32_t P = ref["split_position_P"].get<int32_t>();
  const nlohmann::json& seqs = ref["data"]["sequences"];
  const int n_seq =
      sequences > 0 ? std::min<int>(sequences, static_cast<int>(seqs.size())) : seqs.size();
  std::vector<SwaEvalVariant> variants;
  for (const nlohmann::json& e : ref["replay"]) {
    variants.push_back({e["full_kv"] == "exact" ? SwaReplayFullKv::kExact
                                                : SwaReplayFullKv::kRecomputed,
                        e["R"].get<int64_t>()});
  }

  // Per variant: sums over sequences (every sequence has the same number of targets, so the
  // mean of per-sequence means is the mean over all targets, as in the reference).
  const size_t nv = variants.size();
  double exact_sum = 0, exact_ref_sum = 0, exact_worst_seq = 0;
  std::vector<double> sum(nv, 0), ref_sum(nv, 0), worst_seq(nv, 0), max_diff(nv, 0);
  std::vector<int64_t> agree(nv, 0);
  int64_t targets = 0;
  const Clock::time_point start = Clock::now();
  for (int s = 0; s < n_seq; ++s) {
    const std::vector<int32_t> ids = seqs[s]["input_ids"].get<std::vector<int32_t>>();
    auto r = EvaluateSwaReplay(**model, ids, P, variants, block_size);
    if (!r.ok()) {
      std::cerr << "sequence " << s << ": " << r.status() << "\n";
      return 1;
    }
    targets += r->num_targets;
    const double want = ref["exact"]["per_sequence_loss"][s].get<double>();
    exact_sum += r->exact_loss;
    exact_ref_sum += want;
    exact_worst_seq = std::max(exact_worst_seq, std::fabs(r->exact_loss - want));
    for (size_t v = 0; v < nv; ++v) {
      const double w = ref["replay"][v]["per_sequence_loss"][s].get<double>();
      sum[v] += r->loss[v];
      ref_sum[v] += w;
      worst_seq[v] = std::max(worst_seq[v], std::fabs(r->loss[v] - w));
      max_diff[v] = std::max(max_diff[v], r->max_abs_logit_diff[v]);
      agree[v] += r->top1_agreement[v];
    }
    std::cerr << "sequence " << s + 1 << "/" << n_seq << " done, " << Seconds(start) << " s\n";
  }
  const double eval_seconds = Seconds(start);
  const bool all = n_seq == static_cast<int>(seqs.size());

  Json out;
  out["what"] =
      "suffix loss (targets P..L-1, natural log) of exact decoding and of SWA bounded replay, "
      "engine (CPU, float32) vs the transformers reference; engine/kv/swa_replay_eval.h";
  out["model"] = model_dir.substr(model_dir.find_last_of('/') + 1);
  out["git_commit"] = git_commit;
  out["kernel_threads"] = kernels::NumCpuThreads();
  out["block_size"] = block_size;
  out["sequences"] = n_seq;
  out["split_position_P"] = P;
  out["scored_targets"] = targets;
  out["eval_seconds"] = eval_seconds;
  const double exact_loss = exact_sum / n_seq;
  // The reference's aggregate when all sequences ran; else the mean of its per-sequence values.
  const double exact_ref = all ? ref["exact"]["loss"].get<double>() : exact_ref_sum / n_seq;
  out["exact"] = {{"loss", exact_loss},
                  {"reference_loss", exact_ref},
                  {"abs_diff_vs_reference", std::fabs(exact_loss - exact_ref)},
                  {"max_abs_per_sequence_diff_vs_reference", exact_worst_seq}};
  double worst = std::fabs(exact_loss - exact_ref);
  Json rows = Json::array();
  for (size_t v = 0; v < nv; ++v) {
    const nlohmann::json& e = ref["replay"][v];
    const double loss = sum[v] / n_seq;
    const double want = all ? e["loss"].get<double>() : ref_sum[v] / n_seq;
    worst = std::max(worst, std::fabs(loss - want));
    Json row = {{"full_kv", FullKvName(variants[v].full_kv)},
                {"R", variants[v].replay_tokens},
                {"loss", loss},
                {"reference_loss", want},
                {"abs_diff_vs_reference", std::fabs(loss - want)},
                {"max_abs_per_sequence_diff_vs_reference", worst_seq[v]},
                {"delta_loss_vs_exact", loss - exact_loss},
                {"top1_agreement_with_exact", static_cast<double>(agree[v]) / targets},
                {"max_abs_logit_diff_vs_exact", max_diff[v]}};
    if (all) {
      row["reference_delta_loss_vs_exact"] = e["delta_loss_vs_exact"];
      row["reference_top1_agreement_with_exact"] = e["top1_agreement_with_exact"];
      row["reference_max_abs_logit_diff_vs_exact"] = e["max_abs_logit_diff_vs_exact"];
    }
    rows.push_back(row);
  }
  out["replay"] = rows;
  out["max_abs_loss_diff_vs_reference"] = worst;
  out["within_1e-3"] = worst <= 1e-3;

  // KV bytes per token (float32 K and V, as this engine stores and moves them; a bf16 cache
  // halves every figure, the ratio is the same).
  auto full = MakeKvTransferLayout((*model)->config(), (*model)->kv_cache_spec(),
                                   KvLayerSelection::kFullAttentionOnly);
  if (!full.ok()) {
    std::cerr << full.status() << "\n";
    return 1;
  }
  out["kv_bytes_per_token"] = {
      {"all_layers", full->all_layers_bytes_per_token},
      {"full_attention_layers_only", full->bytes_per_token},
      {"num_layers", full->num_model_layers},
      {"full_attention_layers", full->layers},
      {"ratio", static_cast<double>(full->bytes_per_token) / full->all_layers_bytes_per_token},
      {"note",
       "stored (kvstore) and moved (prefill -> decode) per prompt token; with replay the decode "
       "side also computes min(R, n) tokens through every layer"}};
  std::vector<int64_t> rs;
  for (const SwaEvalVariant& v : variants) {
    if (v.full_kv == SwaReplayFullKv::kExact) rs.push_back(v.replay_tokens);
  }
  out["replay_cost"] = TimeReplay(**model, seqs[0]["input_ids"].get<std::vector<int32_t>>(), P,
                                  rs, timing_runs);

  std::ofstream o(out_path);
  o << out.dump(2) << "\n";
  std::cout << out.dump(2) << "\n";
  return worst <= 1e-3 ? 0 : 2;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) { return sluice::Main(argc, argv); }
