// engine_throughput: CPU decode and prefill throughput of LLMEngine, with a memory-bandwidth
// roofline measured on the same machine in the same run.
//
// Figures (see bench/README.md for the definitions):
//  - memory bandwidth: multi-threaded streaming read and copy over a buffer much larger than the
//    L3 cache (best of several runs), plus a read over a buffer the size of the model's
//    decode working set;
//  - decode: N requests with random prompts of the same length, temperature 0, ignore_eos;
//    only steps that ran no prompt tokens are timed (all prompts already prefilled);
//  - roofline per decode step: weight bytes (WeightBytesPerToken, plus the extra routed experts
//    a batch touches: min(n_routed, B*k) experts per MoE layer instead of k) + KV bytes read
//    (KvCacheSpec::BytesPerToken × context tokens of every sequence), divided by the measured
//    read bandwidth; fraction_of_roofline = measured tokens/s ÷ roofline tokens/s;
//  - prefill: one request of L prompt tokens in one step, tokens/s, and the achieved FLOP rate
//    against a timed LinearCpu GEMM.
//
// Usage: engine_throughput [--model DIR] [--out FILE] [--batches 1,8,32] ...
// Writes JSON to --out and stdout. Exits 1 on any engine error.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "build_paths.h"
#include "engine/model/model.h"
#include "engine/sched/llm_engine.h"
#include "kernels/common/parallel.h"
#include "kernels/linear/linear.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- Machine description -------------------------------------------------------------------

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" ", colon + 1));
    }
  }
  return "unknown";
}

// L3 size from sysfs ("307200K"), 0 when unknown.
int64_t L3CacheBytes() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (!(in >> text) || text.empty()) return 0;
  int64_t scale = 1;
  if (text.back() == 'K') scale = 1024;
  if (text.back() == 'M') scale = 1024 * 1024;
  return std::atoll(text.c_str()) * scale;
}

std::string GitCommit() {
  std::string command =
      std::string("git -C '") + SLUICE_SOURCE_DIR + "' rev-parse HEAD 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "unknown";
  char buffer[128] = {};
  std::string out;
  if (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out = buffer;
  pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

// /proc/loadavg's 1-minute figure: other load on the machine while the benchmark ran.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double one_minute = -1.0;
  in >> one_minute;
  return one_minute;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

// ---- Memory bandwidth ----------------------------------------------------------------------

constexpr int64_t kChunkBytes = 1 << 20;  // work unit of the parallel loops

// Keeps the read loops from being optimized away.
std::atomic<uint64_t> g_sink{0};

uint64_t SumWords(const uint64_t* words, int64_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += words[i];
    a1 += words[i + 1];
    a2 += words[i + 2];
    a3 += words[i + 3];
  }
  for (; i < n; ++i) a0 += words[i];
  return a0 + a1 + a2 + a3;
}

// Best-of-`runs` seconds of a parallel streaming read over `bytes` (chunked over the kernel pool).
double TimeRead(const std::vector<uint64_t>& buffer, int runs) {
  const int64_t words_per_chunk = kChunkBytes / 8;
  const int64_t num_chunks = static_cast<int64_t>(buffer.size()) / words_per_chunk;
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const Clock::time_point start = Clock::now();
    kernels::ParallelFor(num_chunks, 1, [&](int64_t begin, int64_t end) {
      uint64_t sum =
          SumWords(buffer.data() + begin * words_per_chunk, (end - begin) * words_per_chunk);
      g_sink.fetch_add(sum, std::memory_order_relaxed);
    });
    best = std::min(best, SecondsSince(start));
  }
  return best;
}

std::vector<uint64_t> FirstTouchBuffer(int64_t bytes) {
  const int64_t words_per_chunk = kChunkBytes / 8;
  const int64_t num_chunks = std::max<int64_t>(1, bytes / kChunkBytes);
  std::vector<uint64_t> buffer;
  buffer.resize(static_cast<size_t>(num_chunks * words_per_chunk));
  kernels::ParallelFor(num_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * words_per_chunk; i < end * words_per_chunk; ++i) buffer[i] = i;
  });
  return buffer;
}

Json MeasureBandwidth(int64_t dram_bytes, int64_t working_set_bytes, int runs) {
  Json out;
  {
    const std::vector<uint64_t> buffer = FirstTouchBuffer(dram_bytes);
    const int64_t bytes = static_cast<int64_t>(buffer.size()) * 8;
    const double seconds = TimeRead(buffer, runs);
    out["buffer_bytes"] = bytes;
    out["read_gb_per_s"] = static_cast<double>(bytes) / seconds / 1e9;
  }
  {
    // Copy: first half → second half; STREAM convention counts bytes read + bytes written.
    std::vector<uint64_t> buffer = FirstTouchBuffer(dram_bytes);
    const int64_t half_chunks = static_cast<int64_t>(buffer.size()) * 8 / kChunkBytes / 2;
    const int64_t words_per_chunk = kChunkBytes / 8;
    uint64_t* src = buffer.data();
    uint64_t* dst = buffer.data() + half_chunks * words_per_chunk;
    double best = 1e30;
    for (int r = 0; r < runs; ++r) {
      const Clock::time_point start = Clock::now();
      kernels::ParallelFor(half_chunks, 1, [&](int64_t begin, int64_t end) {
        std::memcpy(dst + begin * words_per_chunk, src + begin * words_per_chunk,
                    static_cast<size_t>((end - begin) * kChunkBytes));
      });
      best = std::min(best, SecondsSince(start));
    }
    g_sink.fetch_add(dst[12345], std::memory_order_relaxed);
    out["copy_gb_per_s"] = 2.0 * static_cast<double>(half_chunks * kChunkBytes) / best / 1e9;
    out["copy_convention"] = "(bytes read + bytes written) / s, as STREAM Copy";
  }
  {
    const std::vector<uint64_t> buffer = FirstTouchBuffer(working_set_bytes);
    const int64_t bytes = static_cast<int64_t>(buffer.size()) * 8;
    // The buffer is re-read back to back, like weights step after step.
    const double seconds = TimeRead(buffer, std::max(runs, 10));
    out["working_set_buffer_bytes"] = bytes;
    out["working_set_read_gb_per_s"] = static_cast<double>(bytes) / seconds / 1e9;
  }
  out["runs"] = runs;
  out["statistic"] = "best of runs";
  return out;
}

// ---- Model-derived byte counts -------------------------------------------------------------

struct ModelBytes {
  int64_t weight_bytes_per_token = 0;  // Model::WeightBytesPerToken()
  int64_t kv_bytes_per_token = 0;      // KvCacheSpec::BytesPerToken()
  int64_t expert_bytes = 0;            // one routed expert (gate, up, down), as stored
  int64_t num_moe_layers = 0;
  int64_t n_routed = 0;
  int64_t top_k = 0;
  int64_t embedding_row_bytes = 0;

  // Weight bytes one decode step of `batch` tokens reads: the routed experts touched grow
  // with the batch, approximated by min(n_routed, batch * k) per MoE layer (every token
  // picking different experts), and one embedding row per token.
  int64_t WeightBytesPerStep(int64_t batch) const {
    int64_t bytes = weight_bytes_per_token + (batch - 1) * embedding_row_bytes;
    if (n_routed > 0) {
      const int64_t extra = std::min(n_routed, batch * top_k) - top_k;
      bytes += num_moe_layers * extra * expert_bytes;
    }
    return bytes;
  }
};

ModelBytes GetModelBytes(const Model& model) {
  const ModelConfig& c = model.config();
  ModelBytes m;
  m.weight_bytes_per_token = model.WeightBytesPerToken();
  m.kv_bytes_per_token = model.kv_cache_spec().BytesPerToken();
  m.embedding_row_bytes = c.hidden_size * 4;
  if (c.n_routed_experts > 0) {
    m.n_routed = c.n_routed_experts;
    m.top_k = c.num_experts_per_tok;
    // Stored as the model's matrices are on average (bfloat16 or float32): the bytes per
    // weight value of one token's weights.
    const double bytes_per_weight = static_cast<double>(model.WeightBytesPerToken()) /
                                    static_cast<double>(std::max<int64_t>(1, model.WeightsPerToken()));
    m.expert_bytes = static_cast<int64_t>(
        3.0 * static_cast<double>(c.hidden_size * c.moe_intermediate_size) * bytes_per_weight);
    m.num_moe_layers = c.num_hidden_layers - c.first_k_dense_replace;
  }
  return m;
}

// ---- Engine runs ---------------------------------------------------------------------------

std::vector<int32_t> RandomPrompt(int32_t length, int64_t vocab, std::mt19937_64& rng) {
  // Ids 0..7 are special in the shared tokenizer; the content does not matter for speed.
  std::uniform_int_distribution<int32_t> id(8, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> prompt(length);
  for (int32_t& t : prompt) t = id(rng);
  return prompt;
}

struct StepLog {
  double seconds = 0.0;
  int64_t prompt_tokens = 0;   // prompt tokens computed in the step
  int64_t sampled = 0;         // sequences that produced a token
  int64_t context_tokens = 0;  // Σ over sampled sequences of tokens attended (KV read)
};

// Runs the engine until all requests finish, logging every step.
absl::StatusOr<std::vector<StepLog>> RunToCompletion(LLMEngine& engine) {
  std::vector<StepLog> log;
  while (engine.HasUnfinishedRequests()) {
    const int64_t prompt_before = engine.counters().num_prompt_tokens_computed;
    const Clock::time_point start = Clock::now();
    std::vector<RequestOutput> outputs = engine.Step();
    StepLog step;
    step.seconds = SecondsSince(start);
    step.prompt_tokens = engine.counters().num_prompt_tokens_computed - prompt_before;
    for (const RequestOutput& out : outputs) {
      if (out.finish_reason == FinishReason::kError) return out.status;
      if (out.finish_reason == FinishReason::kAbort) {
        return absl::InternalError(absl::StrCat("request ", out.request_id, " aborted"));
      }
      if (out.new_tokens.empty()) continue;
      ++step.sampled;
      // The step wrote the last sampled token's K/V and attended over the whole sequence.
      step.context_tokens += out.num_prompt_tokens + out.num_output_tokens - 1;
    }
    log.push_back(step);
  }
  return log;
}

absl::Status AddRequests(LLMEngine& engine, int32_t count, int32_t prompt_len, int32_t max_tokens,
                         std::mt19937_64& rng, int64_t* next_id) {
  for (int32_t i = 0; i < count; ++i) {
    EngineRequest request;
    request.request_id = absl::StrCat("bench-", (*next_id)++);
    request.prompt_token_ids = RandomPrompt(prompt_len, engine.model().config().vocab_size, rng);
    request.sampling.temperature = 0.0f;
    request.sampling.ignore_eos = true;
    request.sampling.max_tokens = max_tokens;
    request.sampling.seed = 0;
    if (absl::Status s = engine.AddRequest(std::move(request)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> RunDecode(LLMEngine& engine, const ModelBytes& bytes, double read_gbps,
                               double working_set_gbps, int32_t batch, int32_t prompt_len,
                               int32_t max_tokens, std::mt19937_64& rng, int64_t* next_id) {
  if (absl::Status s = AddRequests(engine, batch, prompt_len, max_tokens, rng, next_id); !s.ok()) {
    return s;
  }
  const Clock::time_point start = Clock::now();
  auto log = RunToCompletion(engine);
  if (!log.ok()) return log.status();
  const double total_seconds = SecondsSince(start);

  double timed_seconds = 0.0, prefill_seconds = 0.0;
  int64_t timed_steps = 0, timed_tokens = 0, timed_full_batch_steps = 0;
  double bytes_read = 0.0, weight_bytes = 0.0, kv_bytes = 0.0;
  for (const StepLog& step : *log) {
    if (step.prompt_tokens > 0) {
      prefill_seconds += step.seconds;
      continue;
    }
    if (step.sampled == 0) continue;
    ++timed_steps;
    timed_full_batch_steps += step.sampled == batch;
    timed_seconds += step.seconds;
    timed_tokens += step.sampled;
    const double w = static_cast<double>(bytes.WeightBytesPerStep(step.sampled));
    const double kv = static_cast<double>(bytes.kv_bytes_per_token * step.context_tokens);
    weight_bytes += w;
    kv_bytes += kv;
    bytes_read += w + kv;
  }
  Json out;
  out["batch"] = batch;
  out["prompt_tokens"] = prompt_len;
  out["max_tokens"] = max_tokens;
  out["total_steps"] = static_cast<int64_t>(log->size());
  out["total_seconds"] = total_seconds;
  out["prefill_steps_seconds"] = prefill_seconds;
  out["timed_decode_steps"] = timed_steps;
  out["timed_full_batch_steps"] = timed_full_batch_steps;
  out["timed_tokens"] = timed_tokens;
  out["timed_seconds"] = timed_seconds;
  if (timed_steps == 0 || timed_seconds <= 0.0) return out;
  const double tokens_per_s = static_cast<double>(timed_tokens) / timed_seconds;
  const double roofline_seconds = bytes_read / (read_gbps * 1e9);
  const double roofline_tokens_per_s = static_cast<double>(timed_tokens) / roofline_seconds;
  const double ws_roofline_tokens_per_s =
      static_cast<double>(timed_tokens) / (bytes_read / (working_set_gbps * 1e9));
  out["tokens_per_s"] = tokens_per_s;
  out["ms_per_step"] = 1e3 * timed_seconds / static_cast<double>(timed_steps);
  out["mean_batch"] = static_cast<double>(timed_tokens) / static_cast<double>(timed_steps);
  out["weight_bytes_per_step"] = weight_bytes / static_cast<double>(timed_steps);
  out["kv_bytes_per_step"] = kv_bytes / static_cast<double>(timed_steps);
  out["bytes_per_step"] = bytes_read / static_cast<double>(timed_steps);
  out["achieved_gb_per_s"] = bytes_read / timed_seconds / 1e9;
  out["roofline_tokens_per_s"] = roofline_tokens_per_s;
  out["fraction_of_roofline"] = tokens_per_s / roofline_tokens_per_s;
  out["working_set_roofline_tokens_per_s"] = ws_roofline_tokens_per_s;
  out["fraction_of_working_set_roofline"] = tokens_per_s / ws_roofline_tokens_per_s;
  return out;
}

// Matmul + attention FLOPs per prompt token of a prefill of `length` tokens (estimate): 2 per
// weight a token uses (WeightsPerToken, minus the lm_head, computed for the last
// token only), plus causal attention over (length + 1) / 2 keys on average: per layer and head,
// 2·(d_qk + d_v) per key — MLA in its absorbed form attends in the latent space
// (d_qk = kv_lora_rank + qk_rope_head_dim, d_v = kv_lora_rank).
double PrefillFlopsPerToken(const Model& model, int32_t length) {
  const ModelConfig& c = model.config();
  const double weights = static_cast<double>(model.WeightsPerToken()) -
                         static_cast<double>(c.vocab_size * c.hidden_size);
  int64_t d_qk = c.head_dim, d_v = c.head_dim;
  if (c.kv_lora_rank > 0) {
    d_qk = c.kv_lora_rank + c.qk_rope_head_dim;
    d_v = c.kv_lora_rank;
  }
  const double attention =
      2.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads * (d_qk + d_v)) *
      (static_cast<double>(length) + 1.0) / 2.0;
  return 2.0 * weights + attention;
}

// Best GFLOP/s of LinearCpu over a few prefill-like shapes.
Json MeasureGemm(const ModelConfig& c, int runs) {
  const int64_t m = 512;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {std::max<int64_t>(c.intermediate_size, 256), c.hidden_size},
      {c.hidden_size, std::max<int64_t>(c.intermediate_size, 256)},
      {1024, 1024}};
  Json out = Json::array();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const auto& [n, k] : shapes) {
    std::vector<float> x(m * k), w(n * k), y(m * n);
    for (float& v : x) v = dist(rng);
    for (float& v : w) v = dist(rng);
    kernels::LinearCpu(x.data(), w.data(), nullptr, y.data(), m, n, k);  // warm-up
    double best = 1e30;
    for (int r = 0; r < runs; ++r) {
      const Clock::time_point start = Clock::now();
      kernels::LinearCpu(x.data(), w.data(), nullptr, y.data(), m, n, k);
      best = std::min(best, SecondsSince(start));
    }
    out.push_back({{"m", m}, {"n", n}, {"k", k}, {"gflops", 2.0 * m * n * k / best / 1e9}});
  }
  return out;
}

absl::StatusOr<Json> RunPrefill(LLMEngine& engine, int32_t length, int runs, double peak_gflops,
                                std::mt19937_64& rng, int64_t* next_id) {
  std::vector<double> seconds;
  for (int r = 0; r < runs; ++r) {
    // Fresh random prompts: nothing is served from a prefix cache.
    if (absl::Status s = AddRequests(engine, 1, length, 1, rng, next_id); !s.ok()) return s;
    const Clock::time_point start = Clock::now();
    auto log = RunToCompletion(engine);
    if (!log.ok()) return log.status();
    seconds.push_back(SecondsSince(start));
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  const double tokens_per_s = length / median;
  const double flops_per_token = PrefillFlopsPerToken(engine.model(), length);
  Json out;
  out["prompt_tokens"] = length;
  out["runs"] = runs;
  out["median_seconds"] = median;
  out["best_seconds"] = seconds.front();
  out["tokens_per_s"] = tokens_per_s;
  out["best_tokens_per_s"] = length / seconds.front();
  out["est_flops_per_token"] = flops_per_token;
  out["achieved_gflops"] = tokens_per_s * flops_per_token / 1e9;
  out["fraction_of_gemm_peak"] = tokens_per_s * flops_per_token / 1e9 / peak_gflops;
  return out;
}

std::vector<int32_t> ParseList(const std::string& text) {
  std::vector<int32_t> values;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (!item.empty()) values.push_back(std::atoi(item.c_str()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

int Main(int argc, char** argv) {
  CLI::App app{"Sluice CPU engine throughput benchmark"};
  std::string model_dir = std::string(SLUICE_SOURCE_DIR) + "/models/sluice-mini-moe";
  std::string out_path = std::string(SLUICE_SOURCE_DIR) + "/bench/results/cpu_engine.json";
  std::string batches_text = "1,8,32", decode_tokens_text = "64,64,32", prefill_text = "512,1024";
  int32_t prompt_len = 128;
  int64_t bandwidth_bytes = 0;
  int runs = 5;
  app.add_option("--model", model_dir, "model directory (config.json + safetensors)");
  app.add_option("--out", out_path, "JSON output path");
  app.add_option("--batches", batches_text, "decode batch sizes, comma-separated");
  app.add_option("--decode-tokens", decode_tokens_text, "max_tokens per batch size");
  app.add_option("--prompt-len", prompt_len, "decode prompt length in tokens");
  app.add_option("--prefill", prefill_text, "prefill prompt lengths, comma-separated");
  app.add_option("--bandwidth-bytes", bandwidth_bytes, "bandwidth buffer (0: max(1 GiB, 4×L3))");
  app.add_option("--runs", runs, "repetitions for bandwidth, GEMM and prefill timings");
  CLI11_PARSE(app, argc, argv);

  const std::vector<int32_t> batches = ParseList(batches_text);
  const std::vector<int32_t> decode_tokens = ParseList(decode_tokens_text);
  const std::vector<int32_t> prefill_lengths = ParseList(prefill_text);
  if (batches.size() != decode_tokens.size()) {
    std::cerr << "--batches and --decode-tokens must have the same length\n";
    return 1;
  }

  Json result;
  const int64_t l3 = L3CacheBytes();
  result["machine"] = {{"cpu_model", CpuModel()},
                       {"hardware_threads", std::thread::hardware_concurrency()},
                       {"kernel_threads", kernels::NumCpuThreads()},
                       {"l3_cache_bytes", l3},
                       {"git_commit", GitCommit()},
                       {"timestamp_utc", UtcNow()},
                       {"loadavg_1min_at_start", LoadAverage()}};

  const Clock::time_point load_start = Clock::now();
  auto model = LoadModel(model_dir);
  if (!model.ok()) {
    std::cerr << "LoadModel(" << model_dir << "): " << model.status() << "\n";
    return 1;
  }
  const double load_seconds = SecondsSince(load_start);
  const ModelBytes bytes = GetModelBytes(**model);
  const ModelConfig config = (*model)->config();
  int32_t max_batch = 1;
  for (int32_t b : batches) max_batch = std::max(max_batch, b);
  int64_t working_set = bytes.WeightBytesPerStep(max_batch);
  result["model"] = {{"dir", model_dir},
                     {"architecture", config.architecture_name},
                     {"load_seconds", load_seconds},
                     {"weight_bytes_per_token", bytes.weight_bytes_per_token},
                     {"kv_bytes_per_token", bytes.kv_bytes_per_token},
                     {"n_routed_experts", bytes.n_routed},
                     {"num_experts_per_tok", bytes.top_k},
                     {"num_moe_layers", bytes.num_moe_layers},
                     {"expert_bytes", bytes.expert_bytes},
                     {"decode_working_set_bytes", working_set}};

  if (bandwidth_bytes <= 0) bandwidth_bytes = std::max<int64_t>(int64_t{1} << 30, 4 * l3);
  const Json bandwidth = MeasureBandwidth(bandwidth_bytes, working_set, runs);
  result["memory_bandwidth"] = bandwidth;
  const double read_gbps = bandwidth["read_gb_per_s"].get<double>();
  const double working_set_gbps = bandwidth["working_set_read_gb_per_s"].get<double>();

  const Json gemm = MeasureGemm(config, runs);
  double peak_gflops = 0.0;
  for (const Json& g : gemm) peak_gflops = std::max(peak_gflops, g["gflops"].get<double>());
  result["gemm_peak"] = {{"shapes", gemm}, {"peak_gflops", peak_gflops}};

  EngineOptions options;
  int32_t longest_prefill = 0;
  for (int32_t l : prefill_lengths) longest_prefill = std::max(longest_prefill, l);
  // One step prefills every prompt of a decode batch, or a whole prefill prompt.
  options.max_num_batched_tokens = std::max(max_batch * prompt_len, longest_prefill);
  options.max_num_seqs = std::max(max_batch, 1);
  options.kv_cache_bytes = 512LL << 20;
  auto engine = LLMEngine::Create(*std::move(model), options);
  if (!engine.ok()) {
    std::cerr << "LLMEngine::Create: " << engine.status() << "\n";
    return 1;
  }
  result["engine_options"] = {{"block_size", options.block_size},
                              {"max_num_batched_tokens", options.max_num_batched_tokens},
                              {"max_num_seqs", options.max_num_seqs},
                              {"num_kv_blocks", (*engine)->num_total_blocks()}};

  std::mt19937_64 rng(2024);
  int64_t next_id = 0;
  // Warm-up: first-touch of the KV cache and scratch buffers.
  if (auto warm = RunDecode(**engine, bytes, read_gbps, working_set_gbps, max_batch, prompt_len, 4,
                            rng, &next_id);
      !warm.ok()) {
    std::cerr << "warm-up: " << warm.status() << "\n";
    return 1;
  }

  Json decode = Json::array();
  for (size_t i = 0; i < batches.size(); ++i) {
    auto run = RunDecode(**engine, bytes, read_gbps, working_set_gbps, batches[i], prompt_len,
                         decode_tokens[i], rng, &next_id);
    if (!run.ok()) {
      std::cerr << "decode batch " << batches[i] << ": " << run.status() << "\n";
      return 1;
    }
    decode.push_back(*run);
    std::cerr << "decode batch " << batches[i] << ": " << (*run)["tokens_per_s"] << " tokens/s\n";
  }
  result["decode"] = decode;

  Json prefill = Json::array();
  for (int32_t length : prefill_lengths) {
    auto run = RunPrefill(**engine, length, std::max(3, runs / 2), peak_gflops, rng, &next_id);
    if (!run.ok()) {
      std::cerr << "prefill " << length << ": " << run.status() << "\n";
      return 1;
    }
    prefill.push_back(*run);
    std::cerr << "prefill " << length << ": " << (*run)["tokens_per_s"] << " tokens/s\n";
  }
  result["prefill"] = prefill;
  result["machine"]["loadavg_1min_at_end"] = LoadAverage();

  const std::string text = result.dump(2);
  std::cout << text << "\n";
  std::ofstream file(out_path);
  if (!file) {
    std::cerr << "cannot write " << out_path << "\n";
    return 1;
  }
  file << text << "\n";
  return 0;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) { return sluice::Main(argc, argv); }
