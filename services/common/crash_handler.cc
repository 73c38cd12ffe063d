#include "services/common/crash_handler.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "absl/debugging/symbolize.h"

namespace sluice {
namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kMaxFrames = 64;

// Formatting with write(2) only: the handler runs in a process whose heap or stdio lock may be
// what broke.
void Write(const char* s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

void WriteUnsigned(uintptr_t v, int base) {
  char buf[32];
  int i = sizeof(buf);
  buf[--i] = '\0';
  do {
    buf[--i] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0 && i > 0);
  if (base == 16) Write("0x");
  Write(buf + i);
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "signal";
  }
}

// `exact`: `pc` is the faulting instruction itself, not a return address (which points after its
// call, so the call's own byte is looked up).
void WriteFrame(int index, void* pc, bool exact) {
  Write("  #");
  WriteUnsigned(static_cast<uintptr_t>(index), 10);
  Write(" ");
  WriteUnsigned(reinterpret_cast<uintptr_t>(pc), 16);
  void* lookup = exact ? pc : static_cast<char*>(pc) - 1;
  Dl_info info;
  if (dladdr(lookup, &info) != 0 && info.dli_fname != nullptr) {
    const char* base = strrchr(info.dli_fname, '/');
    Write(" ");
    Write(base != nullptr ? base + 1 : info.dli_fname);
    Write("+");
    WriteUnsigned(reinterpret_cast<uintptr_t>(lookup) - reinterpret_cast<uintptr_t>(info.dli_fbase),
                  16);
  }
  char symbol[512];
  if (absl::Symbolize(lookup, symbol, sizeof(symbol))) {
    Write(" ");
    Write(symbol);
  }
  Write("\n");
}

void OnFatalSignal(int sig, siginfo_t* info, void* ucontext) {
  Write("*** ");
  Write(SignalName(sig));
  if (sig == SIGSEGV || sig == SIGBUS) {
    Write(" (fault address ");
    WriteUnsigned(reinterpret_cast<uintptr_t>(info->si_addr), 16);
    Write(")");
  }
  Write(" in thread ");
  WriteUnsigned(static_cast<uintptr_t>(syscall(SYS_gettid)), 10);
  Write(" ***\n");
  // The interrupted instruction first, then the unwound stack (libgcc's unwinder steps through
  // the signal frame and needs no frame pointers) from the caller of the interrupted function.
  void* fault_pc = nullptr;
#if defined(__x86_64__)
  fault_pc = reinterpret_cast<void*>(static_cast<ucontext_t*>(ucontext)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  fault_pc = reinterpret_cast<void*>(static_cast<ucontext_t*>(ucontext)->uc_mcontext.pc);
#endif
  void* frames[kMaxFrames];
  const int n = backtrace(frames, kMaxFrames);
  int first = 0;  // the frame of the interrupted function, when it is found
  for (int i = 0; i < n; ++i) {
    if (frames[i] == fault_pc) first = i;
  }
  int index = 0;
  if (first == 0 && fault_pc != nullptr) WriteFrame(index++, fault_pc, /*exact=*/true);
  for (int i = first; i < n; ++i) WriteFrame(index++, frames[i], /*exact=*/i == first && first > 0);
  // Default action again (SA_RESETHAND), then re-raise: the process dies of `sig` as it would have.
  raise(sig);
}

}  // namespace

void InstallCrashHandler(const char* argv0) {
  absl::InitializeSymbolizer(argv0);
  // The first backtrace() loads libgcc_s (malloc, dlopen): not in the handler.
  void* warm[1];
  backtrace(warm, 1);
  static char alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_sigaction = OnFatalSignal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int sig : kFatalSignals) sigaction(sig, &sa, nullptr);
}

}  // namespace sluice
