#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: C++ unit + golden tests (ctest), then the
# end-to-end tests that drive `sluice serve` with the official OpenAI Python SDK (pytest).
#
#   scripts/test.sh                              everything, in build/
#   scripts/test.sh --sanitize address,undefined unit, golden, e2e and integration tests under
#                                                ASan+UBSan (CPU-only build in build-asan/)
#   scripts/test.sh --sanitize thread            the concurrent parts (scheduler, async engine,
#                                                transfer, registry, kvstore, HTTP) under TSan
#                                                (CPU-only build in build-tsan/)
#   scripts/test.sh --sanitize ... --subset      only the sanitized subsets (tests/sanitized:
#                                                the network services' and the engine's
#                                                threads' unit tests, and without TSan the
#                                                parsers'; a fraction of the full build)
#   scripts/test.sh --fuzz SECONDS               the parsers' unit tests under ASan+UBSan, then
#                                                every libFuzzer target for SECONDS each, after
#                                                replaying its regression inputs (clang build in
#                                                build-fuzz/; scripts/fuzz.sh)
# Sanitizer reports fail the run (halt_on_error); SLUICE_BUILD_DIR overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."

SANITIZE=""
FUZZ_SECONDS=""
SUBSET=0
while [ $# -gt 0 ]; do
  case "$1" in
    --fuzz) FUZZ_SECONDS="$2"; shift 2 ;;
    --fuzz=*) FUZZ_SECONDS="${1#*=}"; shift ;;
    --sanitize) SANITIZE="$2"; shift 2 ;;
    --sanitize=*) SANITIZE="${1#*=}"; shift ;;
    --subset) SUBSET=1; shift ;;
    *) echo "usage: $0 [--sanitize address,undefined|thread [--subset]] [--fuzz SECONDS]" >&2
       exit 2 ;;
  esac
done

scripts/install_deps.sh
if [ -n "$FUZZ_SECONDS" ]; then
  echo "[test] fuzz targets, ${FUZZ_SECONDS}s each"
  exec scripts/fuzz.sh --unit-tests -t "$FUZZ_SECONDS"
fi
if [ -z "$SANITIZE" ]; then
  scripts/build.sh
  BUILD_DIR="${SLUICE_BUILD_DIR:-build}"
  echo "[test] ctest"
  (cd "$BUILD_DIR" && ctest --output-on-failure -j "${SLUICE_JOBS:-$(nproc)}")
  echo "[test] end-to-end (pytest)"
  SLUICE_BIN="$PWD/$BUILD_DIR/bin/sluice" .venv/bin/python -m pytest -q tests/e2e
  echo "[test] integration (multi-process: router + prefill/decode workers, k8s manifests)"
  SLUICE_BIN="$PWD/$BUILD_DIR/bin/sluice" .venv/bin/python -m pytest -q tests/integration
  exit 0
fi

# Sanitized builds are CPU-only (nvcc objects carry no instrumentation) and unoptimized enough
# for useful stacks.
case "$SANITIZE" in
  thread) DEFAULT_DIR=build-tsan ;;
  *) DEFAULT_DIR=build-asan ;;
esac
export SLUICE_BUILD_DIR="${SLUICE_BUILD_DIR:-$DEFAULT_DIR}"
BUILD_DIR="$SLUICE_BUILD_DIR"
JOBS="${SLUICE_JOBS:-$(nproc)}"
SANITIZE_FLAGS=(-DSLUICE_SANITIZE="$SANITIZE" -DSLUICE_CUDA=OFF -DSLUICE_NATIVE=OFF
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g"
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g")
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# The system libraries (Abseil, gRPC, UCX) are not instrumented: tests/sanitized/tsan.supp.
# ignore_noninstrumented_modules: memcpy & co. called from them (protobuf parsing a message out
# of gRPC's recycled buffers) are not checked; each word of such a copy was a suppressed report,
# and TSan's de-duplication of those is quadratic (a 3.2 MiB inline kvstore put kept the server
# busy for over 10 minutes). Sluice's own accesses are all still checked.
TSAN_BASE="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1"
export TSAN_OPTIONS="$TSAN_BASE:suppressions=$PWD/tests/sanitized/tsan.supp"
# UCX's memory hooks do not mix with the sanitizers (its madvise hook crashes thread exit under
# TSan); quiet logs for the peers the transfer tests kill on purpose.
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
export UCX_LOG_LEVEL=fatal UCX_WARN_UNUSED_ENV_VARS=n
if [ "$SUBSET" = 1 ]; then
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -S . -B "$BUILD_DIR" -G Ninja "${SANITIZE_FLAGS[@]}"
  fi
  TARGETS=(network_tests_sanitized engine_tests_sanitized)
  [ "$SANITIZE" = "thread" ] || TARGETS+=(parser_tests_sanitized)
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"
  for t in "${TARGETS[@]}"; do
    echo "[test] $t under $SANITIZE"
    "$BUILD_DIR/bin/$t"
  done
  exit 0
fi
scripts/build.sh "${SANITIZE_FLAGS[@]}"
if [ "$SANITIZE" = "thread" ]; then
  # The parts with threads of their own; TSan's slowdown makes the rest not worth its time.
  FILTER='*Scheduler*:*AsyncScheduling*:*LlmEngine*:*DisaggEngine*:*KvConnector*:*Transfer*'
  FILTER+=':*Registry*:*Prober*:*KvStore*:*Kvstore*:*Http*:*Service*:*Quota*:*ApiAuth*'
  FILTER+=':*EmbeddingHandoff*'
  echo "[test] unit tests under TSan ($FILTER)"
  "$BUILD_DIR/bin/unit_tests" --gtest_filter="$FILTER"
  [ -x "$BUILD_DIR/bin/transfer_test" ] && "$BUILD_DIR/bin/transfer_test"
  exit 0
fi
echo "[test] ctest under $SANITIZE"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS")
echo "[test] end-to-end and integration under $SANITIZE"
SLUICE_BIN="$PWD/$BUILD_DIR/bin/sluice" SLUICE_STARTUP_TIMEOUT=1200 \
  .venv/bin/python -m pytest -q tests/e2e tests/integration
