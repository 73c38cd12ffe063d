// kv_transfer_bench: KV block transfer throughput between two processes on this host.
//
// Forks a peer process that registers a KV region of 256 KiB blocks (by default) and publishes
// its RemoteKvDescriptor over a pipe; the parent pulls (or pushes) batches of 1, 4, 16, 64 MiB.
// The remote blocks of a batch are fragmented like a paged KV cache after some churn: runs of
// `run_blocks` consecutive blocks separated by equal gaps, so one batch costs
// ceil(num_blocks / run_blocks) RMA operations. Prints one JSON object per batch size to stdout:
//   {"op","transports","batch_bytes","block_bytes","num_rma_ops","iters","seconds","gb_per_s",
//    "p50_us","p99_us"}
// where gb_per_s = batch_bytes * iters / seconds / 1e9 and p50_us/p99_us are the quantiles of one
// Pull/Push call's wall time (the transfer alone: no control messages). UCX is initialized only
// after fork.
//
// Usage: kv_transfer_bench [--transports=sm] [--op=pull|push] [--block_kib=256]
//          [--run_blocks=8] [--sizes_mib=1,4,16,64] [--min_seconds=0.5] [--max_iters=2000]
//          [--peer_failure_detection=0|1] [--memory=host|cuda]
// --memory=cuda (CUDA builds): both sides' KV in device memory, registered as such (UCX moves it
// with cuda_ipc on one host, or its own cuda_copy staging over tcp).
// --staged_slots=N [--staged_slot_kib=8192]: the local KV (--memory) moves through Sluice's own
// pipelined staging (transfer/staged_transfer.h; CudaDeviceCopier, or HostMemcpyCopier for host
// memory) and the peer's KV is host memory.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(SLUICE_BENCH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "transfer/block_runs.h"
#include "transfer/device_copier.h"
#include "transfer/kv_transfer.h"
#include "transfer/staged_transfer.h"
#if defined(SLUICE_BENCH_CUDA)
#include "transfer/cuda/cuda_device_copier.h"
#endif

namespace {

using sluice::transfer::BlockRun;
using sluice::transfer::KvRegion;
using sluice::transfer::KvTransferAgent;
using sluice::transfer::KvTransferOptions;
using sluice::transfer::RemoteKvDescriptor;

struct Flags {
  std::string transports = "sm";
  std::string op = "pull";
  int64_t block_kib = 256;
  int32_t run_blocks = 8;
  std::vector<int64_t> sizes_mib = {1, 4, 16, 64};
  double min_seconds = 0.5;
  int64_t max_iters = 2000;
  bool peer_failure_detection = false;
  bool ucx_alloc = true;  // both sides' KV memory from AllocateRegion (else std::vector)
  std::string memory = "host";  // host, or cuda: both sides' KV in device memory (cudaMalloc)
  // > 0: the local side's KV (--memory) is not registered and moves through StagedKvTransfer
  // with this many slots of staged_slot_kib each; the peer's KV is then host memory.
  int32_t staged_slots = 0;
  int64_t staged_slot_kib = 8192;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return false;
    const std::string key = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    int64_t n = 0;
    if (key == "transports") {
      f->transports = value;
    } else if (key == "op" && (value == "pull" || value == "push")) {
      f->op = value;
    } else if (key == "block_kib" && absl::SimpleAtoi(value, &f->block_kib) && f->block_kib > 0) {
    } else if (key == "run_blocks" && absl::SimpleAtoi(value, &f->run_blocks) &&
               f->run_blocks > 0) {
    } else if (key == "min_seconds" && absl::SimpleAtod(value, &f->min_seconds)) {
    } else if (key == "max_iters" && absl::SimpleAtoi(value, &f->max_iters) && f->max_iters > 0) {
    } else if (key == "peer_failure_detection" && absl::SimpleAtoi(value, &n)) {
      f->peer_failure_detection = n != 0;
    } else if (key == "staged_slots" && absl::SimpleAtoi(value, &f->staged_slots) &&
               f->staged_slots >= 0) {
    } else if (key == "staged_slot_kib" && absl::SimpleAtoi(value, &f->staged_slot_kib) &&
               f->staged_slot_kib > 0) {
    } else if (key == "memory" && (value == "host" || value == "cuda")) {
      f->memory = value;
    } else if (key == "ucx_alloc" && absl::SimpleAtoi(value, &n)) {
      f->ucx_alloc = n != 0;
    } else if (key == "sizes_mib") {
      f->sizes_mib.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        if (!absl::SimpleAtoi(s, &n) || n <= 0) return false;
        f->sizes_mib.push_back(n);
      }
    } else {
      return false;
    }
  }
  return true;
}

uint8_t Pattern(int64_t block, int64_t offset) {
  return static_cast<uint8_t>((block * 131 + offset * 7) % 251);
}

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

KvTransferOptions AgentOptions(const Flags& f) {
  KvTransferOptions options;
  options.transports = f.transports;
  options.peer_failure_detection = f.peer_failure_detection;
  return options;
}

// KvMemory: the KV array of one side, registered with `agent`: UCX-allocated or plain host
// memory, or (--memory=cuda, CUDA builds) device memory registered with its memory type.
struct KvMemory {
  uint8_t* base = nullptr;
  bool cuda = false;
  std::vector<uint8_t> owned;
  ~KvMemory() {
#if defined(SLUICE_BENCH_CUDA)
    if (cuda && base != nullptr) cudaFree(base);
#endif
  }
};

// memory: "host" or "cuda"; register = false: not registered with the agent (staged transfers).
absl::Status Allocate(const Flags& f, const std::string& memory, bool register_memory,
                      KvTransferAgent& agent, int64_t bytes, KvMemory* m) {
  if (memory == "cuda") {
#if defined(SLUICE_BENCH_CUDA)
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      return absl::InternalError("cudaMalloc failed (no GPU?)");
    }
    m->base = static_cast<uint8_t*>(p);
    m->cuda = true;
    if (!register_memory) return absl::OkStatus();
    return agent.RegisterRegion(p, bytes, sluice::transfer::MemoryType::kCuda).status();
#else
    return absl::InvalidArgumentError("--memory=cuda needs a CUDA build");
#endif
  }
  if (f.ucx_alloc && register_memory) {
    auto h = agent.AllocateRegion(bytes);
    if (!h.ok()) return h.status();
    m->base = static_cast<uint8_t*>(h->base);
    return absl::OkStatus();
  }
  m->owned.resize(static_cast<size_t>(bytes));
  m->base = m->owned.data();
  if (!register_memory) return absl::OkStatus();
  return agent.RegisterRegion(m->base, bytes).status();
}

// Copies [offset, offset + bytes) of `m` to or from host `data`.
void CopyBytes(const KvMemory& m, int64_t offset, uint8_t* data, int64_t bytes, bool to_memory) {
#if defined(SLUICE_BENCH_CUDA)
  if (m.cuda) {
    if (to_memory) {
      cudaMemcpy(m.base + offset, data, bytes, cudaMemcpyHostToDevice);
    } else {
      cudaMemcpy(data, m.base + offset, bytes, cudaMemcpyDeviceToHost);
    }
    return;
  }
#endif
  if (to_memory) {
    std::memcpy(m.base + offset, data, bytes);
  } else {
    std::memcpy(data, m.base + offset, bytes);
  }
}

// The peer: registers `num_blocks` blocks, sends its descriptor, serves RMA until the parent
// closes `done_fd`.
int RunPeer(const Flags& f, int64_t num_blocks, int desc_fd, int done_fd) {
  const int64_t block_bytes = f.block_kib * 1024;
  auto agent = KvTransferAgent::Create(AgentOptions(f));
  if (!agent.ok()) {
    std::fprintf(stderr, "peer: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  KvMemory memory;
  const std::string peer_memory = f.staged_slots > 0 ? "host" : f.memory;
  if (absl::Status s = Allocate(f, peer_memory, true, **agent, num_blocks * block_bytes, &memory);
      !s.ok()) {
    std::fprintf(stderr, "peer: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> block(block_bytes);
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int64_t o = 0; o < block_bytes; o += 4096) block[o] = Pattern(b, o);
    CopyBytes(memory, b * block_bytes, block.data(), block_bytes, /*to_memory=*/true);
  }
  const KvRegion region{memory.base, num_blocks, block_bytes};
  auto desc = (*agent)->Describe({&region, 1});
  if (!desc.ok()) return 1;
  const std::string bytes = desc->Serialize();
  const uint64_t size = bytes.size();
  if (!WriteAll(desc_fd, &size, sizeof(size)) || !WriteAll(desc_fd, bytes.data(), size)) return 1;
  char c;
  while (read(done_fd, &c, 1) > 0) {
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) {
    std::fprintf(stderr, "bad flags; see the usage comment at the top of kv_transfer_bench.cc\n");
    return 2;
  }
  const int64_t block_bytes = f.block_kib * 1024;
  int64_t max_blocks = 0;
  for (int64_t mib : f.sizes_mib)
    max_blocks = std::max(max_blocks, mib * 1024 * 1024 / block_bytes);
  // Runs of run_blocks separated by gaps of run_blocks: the remote side spans twice the batch.
  const int64_t remote_blocks = 2 * (max_blocks + f.run_blocks);

  int desc_pipe[2], done_pipe[2];
  if (pipe(desc_pipe) != 0 || pipe(done_pipe) != 0) return 1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(desc_pipe[0]);
    close(done_pipe[1]);
    _exit(RunPeer(f, remote_blocks, desc_pipe[1], done_pipe[0]));
  }
  close(desc_pipe[1]);
  close(done_pipe[0]);
  uint64_t size = 0;
  std::string bytes;
  if (!ReadAll(desc_pipe[0], &size, sizeof(size)) || size > (1 << 20)) return 1;
  bytes.resize(size);
  if (!ReadAll(desc_pipe[0], bytes.data(), size)) return 1;
  auto remote = RemoteKvDescriptor::Parse(bytes);
  if (!remote.ok()) return 1;

  auto agent = KvTransferAgent::Create(AgentOptions(f));
  if (!agent.ok()) {
    std::fprintf(stderr, "%s\n", agent.status().ToString().c_str());
    return 1;
  }
  KvMemory memory;
  if (absl::Status s = Allocate(f, f.memory, f.staged_slots == 0, **agent,
                                max_blocks * block_bytes, &memory);
      !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::unique_ptr<sluice::transfer::DeviceCopier> copier;
  std::unique_ptr<sluice::transfer::StagedKvTransfer> staged;
  if (f.staged_slots > 0) {
    if (f.memory == "cuda") {
#if defined(SLUICE_BENCH_CUDA)
      auto c = sluice::transfer::CudaDeviceCopier::Create(-1, f.staged_slots);
      if (!c.ok()) {
        std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
        return 1;
      }
      copier = *std::move(c);
#endif
    } else {
      copier = std::make_unique<sluice::transfer::HostMemcpyCopier>(f.staged_slots);
    }
    auto st = sluice::transfer::StagedKvTransfer::Create(
        agent->get(), copier.get(), {f.staged_slot_kib * 1024, f.staged_slots});
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.status().ToString().c_str());
      return 1;
    }
    staged = *std::move(st);
  }
  const KvRegion region{memory.base, max_blocks, block_bytes};
  std::vector<uint8_t> local;  // host copy of the pulled bytes, for the check
  int rc = 0;
  for (int64_t mib : f.sizes_mib) {
    const int64_t n = mib * 1024 * 1024 / block_bytes;
    std::vector<int32_t> remote_ids, local_ids;
    for (int64_t i = 0; i < n; ++i) {
      remote_ids.push_back(
          static_cast<int32_t>((i / f.run_blocks) * 2 * f.run_blocks + i % f.run_blocks));
      local_ids.push_back(static_cast<int32_t>(i));
    }
    const std::vector<BlockRun> remote_runs = sluice::transfer::CoalesceBlocks(remote_ids);
    const std::vector<BlockRun> local_runs = sluice::transfer::CoalesceBlocks(local_ids);
    auto once = [&] {
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      if (staged != nullptr) {
        return f.op == "pull"
                   ? staged->Pull(*remote, remote_runs, {&region, 1}, local_runs, deadline)
                   : staged->Push(*remote, remote_runs, {&region, 1}, local_runs, deadline);
      }
      return f.op == "pull"
                 ? (*agent)->Pull(*remote, remote_runs, {&region, 1}, local_runs, deadline)
                 : (*agent)->Push(*remote, remote_runs, {&region, 1}, local_runs, deadline);
    };
    absl::Status s = once();  // warm-up (endpoint, rkey, page faults)
    if (s.ok() && f.op == "pull") {
      local.resize(n * block_bytes);
      CopyBytes(memory, 0, local.data(), n * block_bytes, /*to_memory=*/false);
      for (int64_t i = 0; i < n && s.ok(); ++i) {
        for (int64_t o = 0; o < block_bytes; o += 4096) {
          if (local[i * block_bytes + o] != Pattern(remote_ids[i], o)) {
            s = absl::DataLossError("pulled bytes differ from the peer's pattern");
            break;
          }
        }
      }
    }
    int64_t iters = 0;
    std::vector<double> latencies_us;  // one per transfer call
    const absl::Time start = absl::Now();
    absl::Duration elapsed;
    while (s.ok()) {
      const absl::Time t0 = absl::Now();
      s = once();
      const absl::Time t1 = absl::Now();
      latencies_us.push_back(absl::ToDoubleMicroseconds(t1 - t0));
      ++iters;
      elapsed = t1 - start;
      if (iters >= f.max_iters || (iters >= 3 && elapsed >= absl::Seconds(f.min_seconds))) break;
    }
    std::sort(latencies_us.begin(), latencies_us.end());
    auto quantile = [&](double q) {
      if (latencies_us.empty()) return 0.0;
      return latencies_us[std::min(latencies_us.size() - 1,
                                   static_cast<size_t>(q * latencies_us.size()))];
    };
    if (!s.ok()) {
      std::fprintf(stderr, "%s %lld MiB: %s\n", f.op.c_str(), static_cast<long long>(mib),
                   s.ToString().c_str());
      rc = 1;
      break;
    }
    const double seconds = absl::ToDoubleSeconds(elapsed);
    const double batch_bytes = static_cast<double>(n * block_bytes);
    std::printf(
        "{\"op\":\"%s\",\"transports\":\"%s\",\"batch_bytes\":%.0f,\"block_bytes\":%lld,"
        "\"num_rma_ops\":%zu,\"iters\":%lld,\"seconds\":%.6f,\"gb_per_s\":%.4f,"
        "\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
        f.op.c_str(), f.transports.c_str(), batch_bytes, static_cast<long long>(block_bytes),
        remote_runs.size(), static_cast<long long>(iters), seconds,
        batch_bytes * iters / seconds / 1e9, quantile(0.5), quantile(0.99));
    std::fflush(stdout);
  }
  staged.reset();  // deregisters its staging from the agent
  copier.reset();
  agent->reset();
  close(done_pipe[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  return rc;
}
