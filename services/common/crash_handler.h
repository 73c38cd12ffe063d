// A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) in a `sluice` process prints what
// happened and where before the process dies:
//
//   *** SIGSEGV (fault address 0x0) in thread 12345 ***
//     #0 0x55d0c8a1b2c3 sluice+0x1a2b2c3 sluice::LLMEngine::Step()
//     #1 ...
//
// Each frame names its module and the offset into it, so a stripped binary's trace resolves with
// `addr2line -Cfe UNSTRIPPED_BINARY OFFSET`; names are printed when the binary keeps its symbol
// table. The signal is then re-raised with its default action: the exit status (128 + signal)
// and any core dump are what they would be without the handler. Only fatal signals are caught:
// SIGTERM / SIGINT stay with the commands' own shutdown paths.
#ifndef SLUICE_SERVICES_COMMON_CRASH_HANDLER_H_
#define SLUICE_SERVICES_COMMON_CRASH_HANDLER_H_

namespace sluice {

// Installs the handler for the whole process; the calling thread also gets an alternate signal
// stack, so its stack overflow still prints. `argv0` is main's argv[0], for symbolization. Call
// once, early in main.
void InstallCrashHandler(const char* argv0);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_CRASH_HANDLER_H_
