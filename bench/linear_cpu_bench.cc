// linear_cpu_bench: LinearBf16Cpu (kernels/linear/linear.h) time per call over row counts m, on
// the matrix shapes of sluice-mini-moe, for A/B runs of the CPU GEMM's tiling between builds.
//
//   linear_cpu_bench [--rows 1,2,3,4,6,8,11,16,64,256] [--footprint-mb 96] [--runs 5]
//                    [--out FILE]
//
// Each shape [n, k] (bf16 weights, float32 activations) is allocated in enough copies to fill
// --footprint-mb, and consecutive calls cycle through them: like a model step, each call reads
// weights that are not in cache (the default is three times a 32 MiB L3). Per (shape, m): the
// median over --runs of the mean time per call, multiply-adds per second (m·n·k / time) and
// weight bytes per second (2·n·k / time). Threads: SLUICE_CPU_THREADS, as in the engine.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/linear/linear.h"

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

// sluice-mini-moe (hidden 384, vocab 8192, MLA q_lora 192 / kv_lora 128, dense intermediate
// 1024, experts 96 wide).
constexpr Shape kShapes[] = {
    {"lm_head", 8192, 384},         {"dense_gate_up", 2048, 384}, {"dense_down", 384, 1024},
    {"expert_gate_up", 192, 384},   {"expert_down", 384, 96},     {"q_b_proj", 384, 192},
    {"kv_a_proj", 160, 384},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"LinearBf16Cpu time per call over row counts"};
  std::string rows_text = "1,2,3,4,6,8,11,16,64,256";
  int64_t footprint_mb = 96;
  int runs = 5;
  std::string out_path;
  app.add_option("--rows", rows_text, "row counts m, comma-separated");
  app.add_option("--footprint-mb", footprint_mb, "weight bytes cycled through per shape")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", runs, "timed runs per point (the median is kept)")
      ->check(CLI::PositiveNumber);
  app.add_option("--out", out_path, "JSON output path");
  CLI11_PARSE(app, argc, argv);
  std::vector<int64_t> rows;
  for (const auto part : absl::StrSplit(rows_text, ',')) {
    int64_t m = 0;
    if (!absl::SimpleAtoi(part, &m) || m <= 0) {
      std::cerr << "linear_cpu_bench: --rows takes positive integers, got '" << part << "'\n";
      return 2;
    }
    rows.push_back(m);
  }

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  nlohmann::json results = nlohmann::json::array();
  for (const Shape& shape : kShapes) {
    const int64_t matrix = shape.n * shape.k;
    const int64_t copies =
        std::max<int64_t>(1, footprint_mb * (int64_t{1} << 20) / (matrix * 2));
    std::vector<uint16_t> w(matrix * copies);
    for (auto& v : w) v = sluice::kernels::ToBf16(dist(rng));
    const int64_t max_m = *std::max_element(rows.begin(), rows.end());
    std::vector<float> x(max_m * shape.k), y(max_m * shape.n);
    for (auto& v : x) v = dist(rng);
    for (const int64_t m : rows) {
      // About 20 ms of multiply-adds per run at 40 GMAC/s, at least one pass over the copies.
      const int64_t calls = std::max<int64_t>(copies, 800'000'000 / (m * matrix));
      std::vector<double> us;
      for (int r = 0; r < runs; ++r) {
        const auto start = std::chrono::steady_clock::now();
        for (int64_t c = 0; c < calls; ++c) {
          sluice::kernels::LinearBf16Cpu(x.data(), w.data() + (c % copies) * matrix, nullptr,
                                         y.data(), m, shape.n, shape.k);
        }
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                               start)
                         .count() /
                     static_cast<double>(calls));
      }
      std::sort(us.begin(), us.end());
      const double median_us = us[us.size() / 2];
      results.push_back({{"shape", shape.name},
                         {"n", shape.n},
                         {"k", shape.k},
                         {"m", m},
                         {"us_per_call", median_us},
                         {"gmac_per_s", static_cast<double>(m * matrix) / median_us / 1e3},
                         {"weight_gb_per_s", static_cast<double>(2 * matrix) / median_us / 1e3}});
      std::cout << shape.name << " m=" << m << ": " << median_us << " us, "
                << results.back()["gmac_per_s"].get<double>() << " GMAC/s\n";
    }
  }
  nlohmann::json doc = {{"bench", "linear_cpu_bench"},
                        {"footprint_mb", footprint_mb},
                        {"runs", runs},
                        {"results", results}};
  if (!out_path.empty()) {
    std::ofstream(out_path) << doc.dump(2) << "\n";
  }
  return 0;
}
