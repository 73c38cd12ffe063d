// kvstore_tool: puts and gets deterministic test blocks through KvStoreClient (UCX data path, or
// the inline gRPC path with --inline). Used by tests/integration/test_kvstore.py; handy by hand.
//
//   kvstore_tool put --shards HOST:PORT[,HOST:PORT...] --count N [--first F] [--layout L]
//                    [--block-bytes B] [--inline]
//   kvstore_tool get  (same flags)
// Block i (F <= i < F + N) has key (L, hi = i * 0x9E3779B97F4A7C15, lo = i) and bytes
// derived from (L, i). Prints one JSON line: put {"stored","present","failed","error"};
// get {"found","exact","missing":[i...],"corrupt","error"}; both add "seconds" (the client call
// alone, for throughput). Exit 0 unless the call failed.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/kvstore/kvstore_client.h"
#include "transfer/kv_transfer.h"

namespace {

using sluice::kvstore::BlockKey;

void FillBlock(uint64_t layout, uint64_t i, uint8_t* out, int64_t bytes) {
  uint64_t x = (layout * 0x100000001B3ull) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0x243F6A8885A308D3ull;
  for (int64_t b = 0; b < bytes; ++b) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[b] = static_cast<uint8_t>(x);
  }
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvstore test client"};
  std::string command, shards;
  int64_t count = 16, first = 0, block_bytes = 4096;
  uint64_t layout = 1;
  bool use_inline = false;
  double timeout_s = 10;
  app.add_option("command", command, "put | get")->required()->check(CLI::IsMember({"put", "get"}));
  app.add_option("--shards", shards, "Comma-separated kvstore host:port list")->required();
  app.add_option("--count", count)->check(CLI::Range(1, 1 << 20));
  app.add_option("--first", first)->check(CLI::NonNegativeNumber);
  app.add_option("--layout", layout);
  app.add_option("--block-bytes", block_bytes)->check(CLI::Range(1, 1 << 30));
  app.add_option("--timeout-s", timeout_s)->check(CLI::PositiveNumber);
  app.add_flag("--inline", use_inline, "Bytes over gRPC instead of UCX");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<sluice::transfer::KvTransferAgent> agent;
  std::vector<uint8_t> heap;
  void* base = nullptr;
  const int64_t total = count * block_bytes;
  if (!use_inline) {
    auto created = sluice::transfer::KvTransferAgent::Create({});
    if (!created.ok()) {
      std::fprintf(stderr, "UCX: %s\n", created.status().ToString().c_str());
      return 1;
    }
    agent = std::move(*created);
    auto region = agent->AllocateRegion(total);
    if (!region.ok()) {
      std::fprintf(stderr, "allocate: %s\n", region.status().ToString().c_str());
      return 1;
    }
    base = region->base;
  } else {
    heap.resize(static_cast<size_t>(total));
    base = heap.data();
  }
  const sluice::transfer::KvRegion local{base, count, block_bytes};
  std::vector<BlockKey> keys;
  std::vector<int32_t> ids;
  for (int64_t j = 0; j < count; ++j) {
    const uint64_t i = static_cast<uint64_t>(first + j);
    keys.push_back(BlockKey{layout, i * 0x9E3779B97F4A7C15ull, i});
    ids.push_back(static_cast<int32_t>(j));
  }

  sluice::kvstore::KvStoreClientOptions options;
  options.shards = absl::StrSplit(shards, ',', absl::SkipEmpty());
  options.agent = agent.get();
  auto client = sluice::kvstore::CreateKvStoreClient(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  auto block = [&](int64_t j) { return static_cast<uint8_t*>(base) + j * block_bytes; };
  if (command == "put") {
    for (int64_t j = 0; j < count; ++j) FillBlock(layout, first + j, block(j), block_bytes);
    const absl::Time start = absl::Now();
    auto r = (*client)->Put(keys, local, ids, deadline);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
      return 1;
    }
    std::printf("{\"stored\": %lld, \"present\": %lld, \"failed\": %lld, \"error\": %s, "
                "\"seconds\": %.6f}\n",
                static_cast<long long>(r->num_stored), static_cast<long long>(r->num_present),
                static_cast<long long>(r->num_failed), JsonString(r->error.ToString()).c_str(),
                seconds);
    return 0;
  }
  std::memset(base, 0, static_cast<size_t>(total));
  const absl::Time start = absl::Now();
  auto r = (*client)->Get(keys, local, ids, deadline);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return 1;
  }
  int64_t found = 0, exact = 0;
  std::vector<int64_t> missing;
  std::vector<uint8_t> want(static_cast<size_t>(block_bytes));
  for (int64_t j = 0; j < count; ++j) {
    if (!r->found[j]) {
      missing.push_back(first + j);
      continue;
    }
    ++found;
    FillBlock(layout, first + j, want.data(), block_bytes);
    if (std::memcmp(want.data(), block(j), static_cast<size_t>(block_bytes)) == 0) ++exact;
  }
  std::printf("{\"found\": %lld, \"exact\": %lld, \"missing\": [%s], \"corrupt\": %lld, "
              "\"error\": %s, \"seconds\": %.6f}\n",
              static_cast<long long>(found), static_cast<long long>(exact),
              absl::StrJoin(missing, ", ").c_str(), static_cast<long long>(r->num_corrupt),
              JsonString(r->error.ToString()).c_str(), seconds);
  return 0;
}
