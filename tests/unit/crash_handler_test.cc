#include "services/common/crash_handler.h"

#include <signal.h>

#include <cstdint>

#include <gtest/gtest.h>

namespace sluice {
namespace {

// A frame that a trace must name: not inlined, so it stays on the stack.
// The address comes from a volatile global, so the compiler cannot see (and drop) the null store.
volatile uintptr_t g_fault_address = 0;
__attribute__((noinline)) void FaultHere() { *reinterpret_cast<volatile int*>(g_fault_address) = 1; }

TEST(CrashHandlerDeathTest, SegfaultPrintsTheFaultAddressAndTheStackAndDiesOfTheSignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        InstallCrashHandler("unit_tests");
        FaultHere();
      },
      testing::KilledBySignal(SIGSEGV),
      "\\*\\*\\* SIGSEGV \\(fault address 0x0\\) in thread [0-9]+ \\*\\*\\*\n"
      "  #0 0x[0-9a-f]+ unit_tests\\+0x[0-9a-f]+[^\n]*FaultHere");
}

TEST(CrashHandlerDeathTest, AbortIsReportedAndStillAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        InstallCrashHandler("unit_tests");
        abort();
      },
      testing::KilledBySignal(SIGABRT), "\\*\\*\\* SIGABRT in thread [0-9]+ \\*\\*\\*\n  #0 0x");
}

}  // namespace
}  // namespace sluice
