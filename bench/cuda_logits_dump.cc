// cuda_logits_dump: fingerprints of the CUDA runners' logits, to check that a kernel change
// leaves the served configurations bit-identical (scripts/logits_bitwise.sh runs it from two
// builds and compares). Only the CudaRunner API is used, so the same file builds on older trees.
//   cuda_logits_dump (--model DIR | --config DIR) [--batches 1,64,256] [--context 16]
//                    [--decode-steps 3] [--autotune 0] [--out FILE]
// --model: a checkpoint folder (e.g. the test fixtures); --config: a config.json folder run with
// dummy weights (engine/model/dummy_weights.h, the default seed). For each batch B, on a fresh
// runner with the default CudaRunnerOptions (decode steps replayed from CUDA graphs):
//   1. one prefill step of B prompts of `context` tokens each (deterministic ids); the logits
//      of each prompt's last token;
//   2. `decode-steps` decode steps of B sequences, each feeding back its greedy token on the
//      device; every step's B logits rows.
// Prints one line per batch: "<batch> rows=<n> fnv1a64=<hex of the fp32 logits' bytes>"; with
// --out, appends the raw fp32 logits to FILE. --autotune 0 (the default) keeps cuBLASLt's
// heuristic GEMM plans, since timed tuning may pick different kernels from one process to the
// next; --autotune 1 times them as the served runners do (then equal only where the tuning
// table fixes every shape).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "engine/cuda/cuda_model.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"

namespace sluice::cuda_runner {
namespace {

struct Flags {
  std::string model, config, out;
  std::vector<int64_t> batches = {1, 64, 256};
  int64_t context = 16;
  int64_t decode_steps = 3;
  bool autotune = false;
};

uint64_t Fnv1a(const std::vector<float>& v, uint64_t h) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

absl::StatusOr<std::unique_ptr<CudaRunner>> MakeRunner(const Flags& f, int64_t batch) {
  CudaRunnerOptions o;
  o.block_size = 16;
  o.max_model_len = f.context + f.decode_steps + 16;
  o.max_num_seqs = batch;
  o.max_num_tokens = batch * f.context;
  o.autotune_gemms = f.autotune;
  std::vector<int64_t> buckets;
  for (int64_t b : o.graph_batch_sizes) {
    if (b <= batch) buckets.push_back(b);
  }
  o.graph_batch_sizes = buckets;
  if (!f.model.empty()) return LoadCudaRunner(f.model, o);
  auto config = ModelConfig::Load(f.config);
  if (!config.ok()) return config.status();
  return CreateDummyCudaRunner(*config, kDefaultDummySeed, o);
}

absl::Status RunBatch(const Flags& f, int64_t batch, std::ofstream* out) {
  auto runner = MakeRunner(f, batch);
  if (!runner.ok()) return runner.status();
  CudaRunner& r = **runner;
  const int64_t bs = r.options().block_size;
  const int64_t bps = (r.options().max_model_len + bs - 1) / bs;
  if (absl::Status s = r.AllocateKvCache(batch * bps); !s.ok()) return s;
  const int64_t vocab = r.config().vocab_size;
  std::vector<std::vector<int32_t>> tables(batch);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t i = 0; i < bps; ++i) tables[s].push_back(static_cast<int32_t>(s * bps + i));
  }
  uint64_t hash = 0xcbf29ce484222325ull;
  int64_t rows = 0;
  auto record = [&]() -> absl::Status {
    auto logits = r.Logits();
    if (!logits.ok()) return logits.status();
    hash = Fnv1a(*logits, hash);
    rows += static_cast<int64_t>(logits->size()) / vocab;
    if (out != nullptr) {
      out->write(reinterpret_cast<const char*>(logits->data()),
                 static_cast<std::streamsize>(logits->size() * sizeof(float)));
    }
    return absl::OkStatus();
  };
  // 1. Prefill.
  ForwardInput in;
  for (int64_t s = 0; s < batch; ++s) {
    SequenceSlice q;
    q.query_start = static_cast<int32_t>(in.token_ids.size());
    q.num_query_tokens = static_cast<int32_t>(f.context);
    q.num_context_tokens = 0;
    q.block_table = absl::MakeConstSpan(tables[s]);
    for (int64_t i = 0; i < f.context; ++i) {
      in.token_ids.push_back(static_cast<int32_t>((s * 7919 + i * 104729 + 1) % vocab));
      in.positions.push_back(static_cast<int32_t>(i));
      in.slot_mapping.push_back(int64_t{tables[s][i / bs]} * bs + i % bs);
    }
    in.sequences.push_back(q);
    in.logits_indices.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
  }
  if (absl::Status s = r.Step(in); !s.ok()) return s;
  if (absl::Status s = record(); !s.ok()) return s;
  // 2. Decode, each sequence's greedy token fed back on the device.
  for (int64_t step = 0; step < f.decode_steps; ++step) {
    ForwardInput d;
    const int64_t pos = f.context + step;
    for (int64_t s = 0; s < batch; ++s) {
      d.token_ids.push_back(-static_cast<int32_t>(s + 1));
      d.positions.push_back(static_cast<int32_t>(pos));
      d.slot_mapping.push_back(int64_t{tables[s][pos / bs]} * bs + pos % bs);
      SequenceSlice q;
      q.query_start = static_cast<int32_t>(s);
      q.num_query_tokens = 1;
      q.num_context_tokens = static_cast<int32_t>(pos);
      q.block_table = absl::MakeConstSpan(tables[s]);
      d.sequences.push_back(q);
      d.logits_indices.push_back(static_cast<int32_t>(s));
    }
    if (absl::Status s = r.Step(d); !s.ok()) return s;
    if (absl::Status s = record(); !s.ok()) return s;
  }
  std::printf("%lld rows=%lld fnv1a64=%016llx\n", static_cast<long long>(batch),
              static_cast<long long>(rows), static_cast<unsigned long long>(hash));
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("missing value for ", a));
    const std::string v = argv[++i];
    if (a == "--model") {
      f.model = v;
    } else if (a == "--config") {
      f.config = v;
    } else if (a == "--out") {
      f.out = v;
    } else if (a == "--batches") {
      f.batches.clear();
      for (absl::string_view p : absl::StrSplit(v, ',')) {
        int64_t b = 0;
        if (!absl::SimpleAtoi(p, &b) || b < 1) return absl::InvalidArgumentError("bad --batches");
        f.batches.push_back(b);
      }
    } else if (a == "--context" || a == "--decode-steps") {
      int64_t n = 0;
      if (!absl::SimpleAtoi(v, &n) || n < 1) return absl::InvalidArgumentError("bad " + a);
      (a == "--context" ? f.context : f.decode_steps) = n;
    } else if (a == "--autotune") {
      if (v != "0" && v != "1") return absl::InvalidArgumentError("--autotune takes 0 or 1");
      f.autotune = v == "1";
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
  }
  if (f.model.empty() == f.config.empty()) {
    return absl::InvalidArgumentError("give one of --model DIR and --config DIR");
  }
  std::ofstream out;
  if (!f.out.empty()) {
    out.open(f.out, std::ios::binary | std::ios::app);
    if (!out) return absl::InternalError("cannot open " + f.out);
  }
  for (int64_t b : f.batches) {
    if (absl::Status s = RunBatch(f, b, f.out.empty() ? nullptr : &out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice::cuda_runner

int main(int argc, char** argv) {
  const absl::Status s = sluice::cuda_runner::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "cuda_logits_dump: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
