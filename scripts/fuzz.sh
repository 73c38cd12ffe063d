#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang, ASan+UBSan, CPU-only, in build-fuzz/) and runs
# each for a bounded time.
#
#   scripts/fuzz.sh                    every target for 30 s
#   scripts/fuzz.sh -t 300 jinja_fuzz  one target for 5 minutes
#   scripts/fuzz.sh -j 2 -t 300        two targets at a time (one process each)
#   scripts/fuzz.sh --regress          only replay the checked-in corpora (seconds; what CI's
#                                      bounded default does first)
#   scripts/fuzz.sh --unit-tests ...   first run the unit + golden tests of the same parsers, of
#                                      the network services and of the engine's threads in this
#                                      ASan+UBSan build (build-fuzz/bin/*_tests_sanitized)
#
# Each target starts from tests/fuzz/corpus/<target>/ (hand-written seeds and the regression
# input of every finding) plus seeds made from the fixtures (tests/fuzz/make_seeds.py); new
# inputs accumulate in build-fuzz/corpus/<target>/ across runs. A crash, leak, UB report or
# timeout fails the run and leaves its input in build-fuzz/findings/<target>/. The summary
# (executions, corpus size, coverage, result per target) is printed at the end and written to
# build-fuzz/fuzz_summary.tsv. SLUICE_FUZZ_BUILD_DIR overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=30
PARALLEL=1
REGRESS_ONLY=0
UNIT_TESTS=0
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t|--time) SECONDS_PER_TARGET="$2"; shift 2 ;;
    -j|--parallel) PARALLEL="$2"; shift 2 ;;
    --regress) REGRESS_ONLY=1; shift ;;
    --unit-tests) UNIT_TESTS=1; shift ;;
    -h|--help) sed -n 2,19p "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
ALL_TARGETS=()
for f in tests/fuzz/*_fuzz.cc; do
  ALL_TARGETS+=("$(basename "$f" .cc)")
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")

BUILD_DIR="${SLUICE_FUZZ_BUILD_DIR:-build-fuzz}"
if ! command -v clang++ >/dev/null; then
  echo "[fuzz] clang++ not found: scripts/install_deps.sh installs it" >&2
  exit 2
fi
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DSLUICE_FUZZ=ON -DSLUICE_CUDA=OFF \
    -DSLUICE_NATIVE=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
fi
cmake --build "$BUILD_DIR" -j "${SLUICE_JOBS:-$(nproc)}" --target "${TARGETS[@]}"
if [ "$UNIT_TESTS" = 1 ]; then
  cmake --build "$BUILD_DIR" -j "${SLUICE_JOBS:-$(nproc)}" --target parser_tests_sanitized \
    network_tests_sanitized engine_tests_sanitized
  for t in parser_tests_sanitized network_tests_sanitized engine_tests_sanitized; do
    echo "[fuzz] $t: unit + golden tests under ASan+UBSan"
    ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" \
      UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" UCX_MEM_MALLOC_HOOKS=no \
      UCX_LOG_LEVEL=fatal UCX_WARN_UNUSED_ENV_VARS=n "$BUILD_DIR/bin/$t"
  done
fi

SEEDS="$BUILD_DIR/seeds"
rm -rf "$SEEDS"
python3 tests/fuzz/make_seeds.py "$SEEDS"
# Leaks are findings; UB aborts (compiled with -fno-sanitize-recover).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
SUMMARY="$BUILD_DIR/fuzz_summary.tsv"
ROWS="$BUILD_DIR/summary.d"
rm -rf "$ROWS"
mkdir -p "$ROWS"

# One target: its regression inputs, then the timed run; its summary row goes to $ROWS/<target>
# (so that targets run side by side with -j never share a file) and its exit status says
# whether it found something.
fuzz_one() {
  local t="$1"
  local bin="$BUILD_DIR/bin/$t"
  local corpus="$BUILD_DIR/corpus/$t"
  local findings="$BUILD_DIR/findings/$t"
  local log="$BUILD_DIR/logs/$t.log"
  local row="$ROWS/$t"
  mkdir -p "$corpus" "$findings" "tests/fuzz/corpus/$t" "$SEEDS/$t" "$(dirname "$log")"
  # Replay the checked-in corpus first: every past finding must stay fixed.
  echo "[fuzz] $t: regression inputs"
  if ! "$bin" -runs=0 -rss_limit_mb=4096 -timeout=30 "tests/fuzz/corpus/$t" > "$log.regress" 2>&1; then
    echo "[fuzz] $t: a regression input fails (log: $log.regress)" >&2
    tail -30 "$log.regress" >&2
    printf "%s\t0\t0\t0\t-\tREGRESSION\n" "$t" > "$row"
    return 1
  fi
  if [ "$REGRESS_ONLY" = 1 ]; then
    printf "%s\t0\t0\t0\t-\tok\n" "$t" > "$row"
    return 0
  fi
  echo "[fuzz] $t: ${SECONDS_PER_TARGET}s"
  local rc=0
  "$bin" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$findings/" \
    "$corpus" "tests/fuzz/corpus/$t" "$SEEDS/$t" > "$log" 2>&1 || rc=$?
  local execs size cov
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  size=$(ls "$corpus" | wc -l)
  # Coverage of the last status line: edges (cov) / features (ft).
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 | awk '{print $2 "/" $4}' || true)
  if [ "$rc" -ne 0 ]; then
    echo "[fuzz] $t: FINDING (rc $rc), inputs in $findings, log $log" >&2
    grep -E "ERROR|runtime error|SUMMARY|Test unit written" "$log" | head -10 >&2
    printf "%s\t%s\t%s\t%s\t%s\tFINDING\n" "$t" "$SECONDS_PER_TARGET" "${execs:-0}" "$size" \
      "${cov:--}" > "$row"
    return 1
  fi
  printf "%s\t%s\t%s\t%s\t%s\tok\n" "$t" "$SECONDS_PER_TARGET" "${execs:-0}" "$size" "${cov:--}" \
    > "$row"
}

# Up to $PARALLEL targets at a time (each one process: libFuzzer's own -jobs is not used).
FAILED=0
for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n || FAILED=1; done
  fuzz_one "$t" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || FAILED=1; done
printf "target\tseconds\texecutions\tcorpus\tcov/ft\tresult\n" > "$SUMMARY"
for t in "${TARGETS[@]}"; do
  if [ -f "$ROWS/$t" ]; then cat "$ROWS/$t" >> "$SUMMARY"; else
    printf "%s\t0\t0\t0\t-\tNOT RUN\n" "$t" >> "$SUMMARY"; FAILED=1; fi
  grep -q "ok$" "$ROWS/$t" 2>/dev/null || FAILED=1
done
echo "[fuzz] summary ($SUMMARY):"
column -t -s $'\t' "$SUMMARY"
exit "$FAILED"
