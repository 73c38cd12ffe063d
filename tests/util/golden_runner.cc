#include "tests/util/golden_runner.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/safetensors.h"

namespace sluice::testing {

int32_t ArgMax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

absl::StatusOr<std::vector<GoldenRun>> RunGreedyBatch(
    Model& model, const std::vector<std::vector<int32_t>>& prompts,
    const GoldenRunOptions& options) {
  const int64_t V = model.config().vocab_size;
  const int64_t bs = options.block_size;
  const int64_t S = static_cast<int64_t>(prompts.size());
  // Blocks per sequence, and a scattered assignment: global block ids are dealt round-robin
  // over the sequences in reverse order, so no table is contiguous or ascending.
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(S));
  int64_t total_blocks = 0;
  std::vector<int64_t> need(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t tokens =
        static_cast<int64_t>(prompts[s].size()) + std::max<int64_t>(0, options.num_new_tokens);
    need[s] = (tokens + bs - 1) / bs;
    total_blocks += need[s];
  }
  {
    int32_t next = static_cast<int32_t>(total_blocks) - 1;
    bool more = true;
    for (int64_t round = 0; more; ++round) {
      more = false;
      for (int64_t s = 0; s < S; ++s) {
        if (round < need[s]) {
          tables[s].push_back(next--);
          more = true;
        }
      }
    }
  }
  KvCache cache(model.kv_cache_spec(), total_blocks, bs);

  std::vector<GoldenRun> runs(static_cast<size_t>(S));
  std::vector<int64_t> fed(static_cast<size_t>(S), 0);  // tokens already in the cache
  for (int64_t s = 0; s < S; ++s) runs[s].num_prompt_tokens = static_cast<int64_t>(prompts[s].size());
  std::vector<float> logits;
  for (;;) {
    ForwardInput in;
    std::vector<int64_t> step_seq;  // sequence of each logits row
    for (int64_t s = 0; s < S; ++s) {
      const int64_t T = static_cast<int64_t>(prompts[s].size());
      std::vector<int32_t> tokens;
      if (fed[s] < T) {
        const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : T;
        const int64_t n = std::min(chunk, T - fed[s]);
        tokens.assign(prompts[s].begin() + fed[s], prompts[s].begin() + fed[s] + n);
      } else if (static_cast<int64_t>(runs[s].greedy.size()) < options.num_new_tokens) {
        tokens.push_back(runs[s].greedy.back());
      } else {
        continue;
      }
      SequenceSlice slice;
      slice.query_start = static_cast<int32_t>(in.token_ids.size());
      slice.num_query_tokens = static_cast<int32_t>(tokens.size());
      slice.num_context_tokens = static_cast<int32_t>(fed[s]);
      slice.block_table = absl::MakeConstSpan(tables[s]);
      for (size_t i = 0; i < tokens.size(); ++i) {
        const int64_t pos = fed[s] + static_cast<int64_t>(i);
        in.logits_indices.push_back(static_cast<int32_t>(in.token_ids.size()));
        in.token_ids.push_back(tokens[i]);
        in.positions.push_back(static_cast<int32_t>(pos));
        in.slot_mapping.push_back(int64_t{tables[s][pos / bs]} * bs + pos % bs);
        step_seq.push_back(s);
      }
      in.sequences.push_back(slice);
    }
    if (in.token_ids.empty()) break;
    logits.assign(in.logits_indices.size() * static_cast<size_t>(V), 0.0f);
    if (absl::Status st = model.Forward(in, cache, absl::MakeSpan(logits)); !st.ok()) return st;
    for (size_t r = 0; r < step_seq.size(); ++r) {
      GoldenRun& run = runs[step_seq[r]];
      const float* row = logits.data() + r * V;
      run.logits.insert(run.logits.end(), row, row + V);
    }
    for (int64_t s = 0; s < S; ++s) {
      const int64_t before = fed[s];
      int64_t n = 0;
      for (int64_t x : step_seq) n += (x == s);
      if (n == 0) continue;
      fed[s] = before + n;
      if (fed[s] >= static_cast<int64_t>(prompts[s].size())) {
        // The last row of this sequence in this step predicts the next token.
        const float* last = runs[s].logits.data() + runs[s].logits.size() - V;
        runs[s].greedy.push_back(ArgMax(last, V));
      }
    }
  }
  return runs;
}

absl::StatusOr<GoldenRun> RunGreedy(Model& model, const std::vector<int32_t>& prompt,
                                    const GoldenRunOptions& options) {
  auto runs = RunGreedyBatch(model, {prompt}, options);
  if (!runs.ok()) return runs.status();
  return std::move((*runs)[0]);
}

absl::StatusOr<std::vector<GoldenCase>> LoadGoldenCases(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  std::vector<GoldenCase> cases;
  for (int i = 0;; ++i) {
    const TensorView* ids = (*file)->Find(absl::StrCat("input_ids_", i));
    if (ids == nullptr) break;
    const TensorView* logits = (*file)->Find(absl::StrCat("logits_", i));
    const TensorView* greedy = (*file)->Find(absl::StrCat("greedy_", i));
    if (logits == nullptr || greedy == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": case ", i, " is incomplete"));
    }
    GoldenCase c;
    auto id64 = ToInt64(*ids);
    auto g64 = ToInt64(*greedy);
    auto lf = ToFloat32(*logits);
    if (!id64.ok()) return id64.status();
    if (!g64.ok()) return g64.status();
    if (!lf.ok()) return lf.status();
    c.input_ids.assign(id64->begin(), id64->end());
    c.greedy.assign(g64->begin(), g64->end());
    c.logits = std::move(*lf);
    if (logits->shape.size() != 2 || logits->shape[0] != static_cast<int64_t>(c.input_ids.size())) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": logits_", i, " shape mismatch"));
    }
    cases.push_back(std::move(c));
  }
  if (cases.empty()) return absl::NotFoundError(absl::StrCat(path, ": no input_ids_0"));
  return cases;
}

GoldenComparison CompareToGolden(const GoldenRun& run, const GoldenCase& golden,
                                 int64_t vocab_size) {
  GoldenComparison cmp;
  const int64_t T = static_cast<int64_t>(golden.input_ids.size());
  const int64_t rows = std::min<int64_t>(T, static_cast<int64_t>(run.logits.size()) / vocab_size);
  for (int64_t t = 0; t < rows; ++t) {
    const float* a = run.logits.data() + t * vocab_size;
    const float* b = golden.logits.data() + t * vocab_size;
    for (int64_t v = 0; v < vocab_size; ++v) {
      cmp.max_abs_diff = std::max(cmp.max_abs_diff, std::fabs(a[v] - b[v]));
    }
    if (ArgMax(a, vocab_size) != ArgMax(b, vocab_size)) ++cmp.argmax_mismatches;
  }
  if (rows < T) cmp.argmax_mismatches += T - rows;
  const size_t g = std::max(run.greedy.size(), golden.greedy.size());
  for (size_t i = 0; i < g; ++i) {
    if (i >= run.greedy.size() || i >= golden.greedy.size() || run.greedy[i] != golden.greedy[i]) {
      cmp.first_greedy_mismatch = static_cast<int64_t>(i);
      break;
    }
  }
  return cmp;
}

}  // namespace sluice::testing
