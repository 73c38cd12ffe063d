// tokenizer_bench: encode throughput of the byte-level BPE tokenizer.
//
//   tokenizer_bench --tokenizer PATH/tokenizer.json --text FILE [--iters N] [--per-line]
//                   [--ids-out FILE]
//
// Encodes the whole file (as one string, add_special_tokens=false, special tokens parsed; with
// --per-line each line including its '\n' separately, ids concatenated) once to warm up (the
// BPE word cache fills as it would in a server), then N timed times on one thread. Prints JSON:
// {"tokens", "bytes", "iters", "seconds" (mean per encode), "tokens_per_second", "mb_per_second"
// (10^6 bytes), "load_seconds"}. --ids-out writes the ids as a JSON array (for cross-checking
// against HF tokenizers).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"Byte-level BPE encode throughput"};
  std::string tokenizer_path;
  std::string text_path;
  std::string ids_out;
  int iters = 10;
  bool per_line = false;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  app.add_option("--text", text_path, "UTF-8 text file to encode")->required();
  app.add_option("--iters", iters, "timed iterations")->check(CLI::PositiveNumber);
  app.add_flag("--per-line", per_line, "encode each line separately");
  app.add_option("--ids-out", ids_out, "write the ids as a JSON array here");
  CLI11_PARSE(app, argc, argv);

  using Clock = std::chrono::steady_clock;
  const auto load_start = Clock::now();
  auto tokenizer = sluice::Tokenizer::FromFile(tokenizer_path);
  const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot open " << text_path << "\n";
    return 1;
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  std::vector<std::string_view> units;
  if (per_line) {
    for (size_t pos = 0; pos < text.size();) {
      const size_t nl = text.find('\n', pos);
      const size_t end = nl == std::string::npos ? text.size() : nl + 1;
      units.emplace_back(text.data() + pos, end - pos);
      pos = end;
    }
  } else {
    units.emplace_back(text);
  }
  const auto encode_all = [&] {
    std::vector<int32_t> all;
    for (std::string_view unit : units) {
      const std::vector<int32_t> ids = (*tokenizer)->Encode(unit, /*add_special_tokens=*/false);
      all.insert(all.end(), ids.begin(), ids.end());
    }
    return all;
  };
  std::vector<int32_t> ids = encode_all();
  const auto start = Clock::now();
  size_t checksum = 0;
  for (int i = 0; i < iters; ++i) {
    ids = encode_all();
    checksum += ids.size();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iters;
  if (checksum != ids.size() * static_cast<size_t>(iters)) {
    std::cerr << "non-deterministic encode\n";
    return 1;
  }
  if (!ids_out.empty()) {
    std::ofstream out(ids_out);
    out << nlohmann::json(ids).dump();
  }
  const nlohmann::json result = {
      {"tokens", ids.size()},
      {"bytes", text.size()},
      {"iters", iters},
      {"mode", per_line ? "per_line" : "whole_text"},
      {"seconds", seconds},
      {"tokens_per_second", ids.size() / seconds},
      {"mb_per_second", text.size() / seconds / 1e6},
      {"load_seconds", load_seconds},
  };
  std::cout << result.dump() << std::endl;
  return 0;
}
