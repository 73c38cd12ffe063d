#!/usr/bin/env bash
# Builds GPU test/bench binaries here and bundles them for a GPU machine that has CUDA but none
# of our Debian dependencies (the `run` device tool's machines).
#
# Usage: scripts/device_bundle.sh [TARGET...]   (default: kernels_cuda_test cuda_kernel_bench)
#   SLUICE_DEVICE_BUILD_DIR   build folder (default build-device; SLUICE_NATIVE=OFF so the
#                             binaries run on any x86-64 CPU, SLUICE_CUDA=ON)
#   SLUICE_DEVICE_BUNDLE_DIR  bundle folder (default device/cuda-kernels; /device/ is ignored by
#                             git, so name it in the device tool's `carry`)
#   SLUICE_JOBS               parallel build jobs (default 2)
# The bundle holds the stripped binaries, lib/ with their non-system shared libraries (rpath
# $ORIGIN/lib, via ../shared/tools/device-bundle.sh; cuBLAS and the CUDA driver come from the
# target's CUDA install; cudart is linked statically) and run_on_device.sh, which runs
# kernels_cuda_test and cuda_kernel_bench and writes their logs and JSON to $OUT (or the
# folder given as its first argument).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${SLUICE_DEVICE_BUILD_DIR:-build-device}"
bundle="${SLUICE_DEVICE_BUNDLE_DIR:-device/cuda-kernels}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(kernels_cuda_test cuda_kernel_bench)
bundler="$(cd .. && pwd)/shared/tools/device-bundle.sh"
[ -x "$bundler" ] || { echo "device_bundle: $bundler not found" >&2; exit 1; }

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_NATIVE=OFF \
  -DSLUICE_CUDA=ON >/dev/null
cmake --build "$build" -j "${SLUICE_JOBS:-2}" --target "${targets[@]}"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
bins=()
for t in "${targets[@]}"; do
  cp "$build/bin/$t" "$stage/$t"
  strip --strip-debug "$stage/$t"
  bins+=("$stage/$t")
done
rm -rf "$bundle"
"$bundler" "$bundle" "${bins[@]}"

cat >"$bundle/run_on_device.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the bundled CUDA kernel tests and bench on a GPU machine; results go to ${1:-$OUT}.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-${OUT:?give an output folder}}"
mkdir -p "$out"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if [ -e "$d/libcublasLt.so.13" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; break; fi
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
  | tee "$out/gpu.csv"
rc=0
if [ -x "$here/kernels_cuda_test" ]; then
  "$here/kernels_cuda_test" --gtest_output="json:$out/kernels_cuda_test.json" 2>&1 \
    | tee "$out/kernels_cuda_test.log" || rc=1
  if command -v compute-sanitizer >/dev/null; then
    # Out-of-bounds and race checks on our own kernels (cuBLASLt's excluded: slow and not ours).
    timeout 180 compute-sanitizer --tool memcheck --error-exitcode 3 \
      "$here/kernels_cuda_test" --gtest_filter='-LinearCuda*' >"$out/sanitizer.log" 2>&1 || rc=1
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 3 \
      "$here/kernels_cuda_test" --gtest_filter='Rope*:RmsNorm*:AddRmsNorm*' \
      >>"$out/sanitizer.log" 2>&1 || rc=1
    tail -n 3 "$out/sanitizer.log"
  fi
fi
if [ -x "$here/cuda_kernel_bench" ]; then
  "$here/cuda_kernel_bench" "$out/cuda_kernels_h200.json" >"$out/bench.log" 2>&1 || rc=1
  cat "$out/bench.log"
fi
exit $rc
RUN
chmod +x "$bundle/run_on_device.sh"
du -sh "$bundle"
