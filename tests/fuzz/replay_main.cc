// fuzz_replay: the fuzz targets of tests/fuzz in a build without libFuzzer (the regular build,
// so ctest runs every target on each CI run). For one target it replays a corpus, then feeds
// inputs mutated from it by a fixed-seed generator for a bounded time:
//
//   fuzz_replay TARGET [-seconds=S] [-runs=N] [-seed=K] [-max_len=L] [-timeout=T]
//               [-artifact_prefix=P] PATH...
//
// PATH: files or folders (every regular file below, in name order). After the replay, mutated
// inputs run for S seconds (default 30; $SLUICE_FUZZ_SECONDS, when set, overrides -seconds) or N
// inputs, whichever ends first; the same seed gives the same sequence of inputs. A crash, an abort (an
// uncaught exception, a target's invariant trap) or an input running past T seconds (default 10)
// writes the input to P<target>-crash-<n> (default prefix: the working folder) and fails; replay
// it with `fuzz_replay TARGET FILE` (or the libFuzzer build's target, under ASan).
//
// This is not coverage-guided: it finds what mutations of the seeds reach. scripts/fuzz.sh runs
// the same targets under libFuzzer with ASan + UBSan for the deep runs.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using TestOneInput = int (*)(const uint8_t*, size_t);
using Initialize = int (*)(int*, char***);

// Each target's LLVMFuzzerTestOneInput / LLVMFuzzerInitialize is renamed at compile time
// (tests/fuzz/CMakeLists.txt) to sluice_fuzz_<name>_TestOneInput / _Initialize; the latter is
// optional (weak).
#define SLUICE_FUZZ_TARGET(name)                                                    \
  extern "C" int sluice_fuzz_##name##_TestOneInput(const uint8_t*, size_t);        \
  extern "C" int sluice_fuzz_##name##_Initialize(int*, char***) __attribute__((weak));
#include "fuzz_targets.inc"
#undef SLUICE_FUZZ_TARGET

namespace {

struct Target {
  const char* name;
  TestOneInput test;
  Initialize init;
};
const Target kTargets[] = {
#define SLUICE_FUZZ_TARGET(name) \
  {#name, sluice_fuzz_##name##_TestOneInput, sluice_fuzz_##name##_Initialize},
#include "fuzz_targets.inc"
#undef SLUICE_FUZZ_TARGET
};

// The input being run, for the crash handler and the watchdog (set before each run).
std::vector<uint8_t> g_current;
std::atomic<int64_t> g_started_ms{0};  // when the current input began (0: none running)
char g_artifact[4096];                 // where a failing input is written
std::string g_origin;                  // what the current input is (a file, or mutation n)

void WriteArtifact() {
  const int fd = open(g_artifact, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < g_current.size()) {
    const ssize_t n = write(fd, g_current.data() + done, g_current.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
}

void Say(const char* text) { (void)!write(2, text, strlen(text)); }

void OnFatalSignal(int sig) {
  WriteArtifact();
  Say("\nfuzz_replay: FINDING: signal ");
  Say(strsignal(sig));
  Say(" on ");
  Say(g_origin.c_str());
  Say("; input written to ");
  Say(g_artifact);
  Say("\n");
  signal(sig, SIG_DFL);
  raise(sig);
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<uint8_t> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return std::vector<uint8_t>(s.begin(), s.end());
}

// Tokens the text parsers care about (JSON, Jinja, HTTP, UTF-8 edge cases).
const char* const kDictionary[] = {
    "\"", "{", "}", "[", "]", ":", ",", "\\", "\\u0000", "\\ud800", "\\uDFFF", "null", "true",
    "false", "-1", "0", "1e308", "-0", "1e-400", "99999999999999999999", "{{", "}}", "{%", "%}",
    "{#", "#}", " if ", " for ", " in ", " endfor ", " endif ", "|", "loop.", "\r\n",
    "\r\n\r\n", "Content-Length: ", "Transfer-Encoding: chunked\r\n", "Authorization: Bearer ",
    "\xc0\x80", "\xed\xa0\x80", "\xef\xbf\xbd", "\xf4\x90\x80\x80", "\xff", "\x00",
    "\"messages\"", "\"content\"", "\"role\"", "\"max_tokens\"", "\"n\"", "\"logprobs\"",
    "\"top_logprobs\"", "\"stop\"", "\"tools\"", "\"response_format\"", "\"image_url\"",
    "data:image/png;base64,", "IHDR", "IDAT", "IEND", "\xff\xd8\xff", "RIFF", "WEBPVP8 ",
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"F32\"", "\"BF16\""};

const uint64_t kInteresting[] = {0,          1,          0x7f,       0x80,       0xff,
                                 0x100,      0x7fff,     0x8000,     0xffff,     0x10000,
                                 0x7fffffff, 0x80000000, 0xffffffff, 0x100000000,
                                 0x7fffffffffffffffULL, 0x8000000000000000ULL,
                                 0xffffffffffffffffULL};

// Mutator: libFuzzer-like byte mutations, deterministic for a seed.
class Mutator {
 public:
  Mutator(uint64_t seed, size_t max_len) : rng_(seed), max_len_(max_len) {}

  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  void Mutate(std::vector<uint8_t>& data, const std::vector<std::vector<uint8_t>>& corpus) {
    const int steps = 1 + static_cast<int>(Below(4));
    for (int i = 0; i < steps; ++i) Step(data, corpus);
    if (data.size() > max_len_) data.resize(max_len_);
  }

 private:
  void Insert(std::vector<uint8_t>& data, const uint8_t* bytes, size_t n) {
    const size_t at = Below(data.size() + 1);
    data.insert(data.begin() + static_cast<std::ptrdiff_t>(at), bytes, bytes + n);
  }

  void Step(std::vector<uint8_t>& data, const std::vector<std::vector<uint8_t>>& corpus) {
    switch (Below(data.empty() ? 3 : 11)) {
      case 0: {  // insert random bytes
        uint8_t bytes[8];
        const size_t n = 1 + Below(8);
        for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(rng_());
        Insert(data, bytes, n);
        break;
      }
      case 1: {  // insert a dictionary token
        const char* token = kDictionary[Below(std::size(kDictionary))];
        const size_t n = std::max<size_t>(1, strlen(token));  // "\x00" is one NUL byte
        Insert(data, reinterpret_cast<const uint8_t*>(token), n);
        break;
      }
      case 2: {  // splice in a piece of another corpus input
        const std::vector<uint8_t>& other = corpus[Below(corpus.size())];
        if (other.empty()) break;
        const size_t from = Below(other.size());
        const size_t n = 1 + Below(std::min<size_t>(other.size() - from, 256));
        Insert(data, other.data() + from, n);
        break;
      }
      case 3:  // flip a bit
        data[Below(data.size())] ^= static_cast<uint8_t>(1u << Below(8));
        break;
      case 4:  // a random byte
        data[Below(data.size())] = static_cast<uint8_t>(rng_());
        break;
      case 5:  // +- a small delta
        data[Below(data.size())] += static_cast<uint8_t>(Below(33) - 16);
        break;
      case 6: {  // overwrite with an interesting integer, 1/2/4/8 bytes little-endian
        const uint64_t v = kInteresting[Below(std::size(kInteresting))];
        const size_t width = size_t{1} << Below(4);
        const size_t at = Below(data.size());
        for (size_t i = 0; i < width && at + i < data.size(); ++i) {
          data[at + i] = static_cast<uint8_t>(v >> (8 * i));
        }
        break;
      }
      case 7: {  // erase a range
        const size_t at = Below(data.size());
        const size_t n = 1 + Below(std::min<size_t>(data.size() - at, 64));
        data.erase(data.begin() + static_cast<std::ptrdiff_t>(at),
                   data.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 8: {  // duplicate a range elsewhere
        const size_t at = Below(data.size());
        const size_t n = 1 + Below(std::min<size_t>(data.size() - at, 64));
        std::vector<uint8_t> piece(data.begin() + static_cast<std::ptrdiff_t>(at),
                                   data.begin() + static_cast<std::ptrdiff_t>(at + n));
        Insert(data, piece.data(), piece.size());
        break;
      }
      case 9:  // truncate
        data.resize(Below(data.size()));
        break;
      default: {  // repeat a byte many times (deep nesting, long runs)
        const uint8_t b = data[Below(data.size())];
        const size_t n = 16 + Below(1024);
        std::vector<uint8_t> run(n, b);
        Insert(data, run.data(), run.size());
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  size_t max_len_;
};

bool ParseFlag(const std::string& arg, const char* name, int64_t* value) {
  const std::string prefix = std::string("-") + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  *value = std::strtoll(arg.c_str() + prefix.size(), nullptr, 10);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TARGET [-seconds=S] [-runs=N] [-seed=K] [-max_len=L] "
                         "[-timeout=T] [-artifact_prefix=P] PATH...\ntargets:",
                 argv[0]);
    for (const Target& t : kTargets) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  const Target* target = nullptr;
  for (const Target& t : kTargets) {
    if (std::strcmp(t.name, argv[1]) == 0) target = &t;
  }
  if (target == nullptr) {
    std::fprintf(stderr, "fuzz_replay: unknown target '%s'\n", argv[1]);
    return 2;
  }
  int64_t seconds = 30, runs = -1, seed = 1, max_len = 8192, timeout = 10;
  std::string prefix;
  std::vector<std::filesystem::path> paths;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (ParseFlag(arg, "seconds", &seconds) || ParseFlag(arg, "runs", &runs) ||
        ParseFlag(arg, "seed", &seed) || ParseFlag(arg, "max_len", &max_len) ||
        ParseFlag(arg, "timeout", &timeout)) {
      continue;
    }
    if (arg.rfind("-artifact_prefix=", 0) == 0) {
      prefix = arg.substr(std::strlen("-artifact_prefix="));
      continue;
    }
    paths.emplace_back(arg);
  }
  // The environment has the last word (a quick local ctest run: SLUICE_FUZZ_SECONDS=2).
  if (const char* env = std::getenv("SLUICE_FUZZ_SECONDS"); env != nullptr && *env != '\0') {
    seconds = std::strtoll(env, nullptr, 10);
  }

  // The corpus, in a fixed order.
  std::vector<std::filesystem::path> files;
  for (const auto& path : paths) {
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (std::filesystem::is_regular_file(path)) {
      files.push_back(path);
    } else {
      std::fprintf(stderr, "fuzz_replay: no such file or folder: %s\n", path.c_str());
      return 2;
    }
  }
  std::sort(files.begin(), files.end());

  for (int sig : {SIGSEGV, SIGABRT, SIGILL, SIGFPE, SIGBUS, SIGTRAP}) signal(sig, OnFatalSignal);
  int fake_argc = 1;
  char** fake_argv = argv;
  if (target->init != nullptr) target->init(&fake_argc, &fake_argv);

  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int64_t started = g_started_ms.load();
      if (started != 0 && NowMs() - started > timeout * 1000) {
        WriteArtifact();
        Say("\nfuzz_replay: FINDING: timeout on ");
        Say(g_origin.c_str());
        Say("; input written to ");
        Say(g_artifact);
        Say("\n");
        _exit(1);
      }
    }
  });

  int64_t n_artifact = 0;
  auto run = [&](std::vector<uint8_t> input, std::string origin) {
    g_current = std::move(input);
    g_origin = std::move(origin);
    std::snprintf(g_artifact, sizeof(g_artifact), "%s%s-crash-%lld", prefix.c_str(),
                  target->name, static_cast<long long>(n_artifact++));
    // An empty vector's data() may be null; targets get a valid pointer.
    static const uint8_t kEmpty = 0;
    g_started_ms.store(NowMs());
    target->test(g_current.empty() ? &kEmpty : g_current.data(), g_current.size());
    g_started_ms.store(0);
  };

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<uint8_t>> corpus;
  for (const auto& file : files) {
    corpus.push_back(ReadFile(file));
    run(corpus.back(), "corpus file " + file.string());
  }
  const double replay_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (corpus.empty()) corpus.emplace_back();

  Mutator mutator(static_cast<uint64_t>(seed), static_cast<size_t>(max_len));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int64_t executed = 0;
  std::vector<uint8_t> previous;
  while ((runs < 0 || executed < runs) && std::chrono::steady_clock::now() < until) {
    // Mostly a fresh mutation of a corpus input; sometimes a further one of the last input, to
    // reach inputs several steps away.
    std::vector<uint8_t> input = (!previous.empty() && mutator.Below(4) == 0)
                                     ? previous
                                     : corpus[mutator.Below(corpus.size())];
    mutator.Mutate(input, corpus);
    previous = input;
    run(std::move(input), "mutated input " + std::to_string(executed) + " (seed " +
                              std::to_string(seed) + ")");
    ++executed;
  }
  done.store(true);
  watchdog.join();
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz_replay %s: %zu corpus inputs (%.1f s), %lld mutated inputs, %.1f s in all, "
              "seed %lld: no finding\n",
              target->name, files.size(), replay_s, static_cast<long long>(executed), total_s,
              static_cast<long long>(seed));
  return 0;
}
