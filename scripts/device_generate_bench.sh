#!/usr/bin/env bash
# Bundles `sluice` (CUDA backend) for the GPU machine and writes the one script that runs the
# offline batch benchmark there (bench/generate_bench.py: `sluice generate --device cuda` against
# HF transformers `generate`, same prompts, greedy).
#
# Here:    scripts/device_generate_bench.sh
#            SLUICE_DEVICE_BUILD_DIR   build folder (default build-hD; configured NATIVE=OFF, CUDA=ON,
#                                      CUDA arch 90a by scripts/device_bundle.sh)
#            SLUICE_GENERATE_BUNDLE    bundle folder (default device/generate-bench: ignored by git,
#                                      so the device tool must `carry` it)
# There:   device/generate-bench/run_generate_bench.sh [OUT_DIR]   (default $OUT)
#            runs, in order: the llama-tiny fixture's config with dummy weights (the CUDA Llama
#            runner; HF gets the same weights through generate_bench.py --dummy-weights), then
#            models/sluice-mini-moe (trained DeepSeek-V3, the CUDA DeepSeek runner);
#            GENERATE_BENCH_ARGS  extra generate_bench.py arguments (default
#                                 --num-prompts 1000 --max-tokens 128)
#          writes generate_<model>.json and generate_<model>.log per model and gpu.csv to OUT_DIR.
# The bundle is sluice + its non-system libraries (no UCX transport modules: generate never
# starts UCX), xz-packed, plus llama-tiny's config.json: it must fit beside the tracked tree in
# the device tool's 64 MiB, which the last lines printed here check.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle="${SLUICE_GENERATE_BUNDLE:-device/generate-bench}"
SLUICE_DEVICE_BUILD_DIR="${SLUICE_DEVICE_BUILD_DIR:-build-hD}" SLUICE_DEVICE_BUNDLE_DIR="$bundle" \
  SLUICE_DEVICE_COMPRESS=0 scripts/device_bundle.sh sluice >/dev/null
rm -rf "$bundle/run_on_device.sh" "$bundle/lib/ucx"  # the kernel-test runner; UCX plugins
(cd "$bundle" && tar -cf - sluice lib | xz -9e -T2 >bundle.tar.xz && rm -rf sluice lib)
mkdir -p "$bundle/fixtures/llama-tiny"
cp ../shared/fixtures/llama-tiny/{config.json,generation_config.json} "$bundle/fixtures/llama-tiny/"

cat >"$bundle/run_generate_bench.sh" <<'RUN'
#!/usr/bin/env bash
# Runs bench/generate_bench.py on this GPU machine; results go to ${1:-$OUT}.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-${OUT:?give an output folder}}"
mkdir -p "$out"
[ -x "$here/sluice" ] || tar -xJf "$here/bundle.tar.xz" -C "$here"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if [ -e "$d/libcublasLt.so.13" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; break; fi
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.csv"
"$here/sluice" --help >/dev/null || { echo "sluice does not start"; ldd "$here/sluice"; exit 1; }
cd "$repo"
# llama-tiny: config only; the tokenizer is the one every fixture and model shares.
cp models/sluice-mini-moe/tokenizer.json models/sluice-mini-moe/tokenizer_config.json \
  "$here/fixtures/llama-tiny/"
rc=0
run() {  # NAME MODEL_DIR [generate_bench.py args...]
  local name=$1 model=$2
  shift 2
  PYTHONUNBUFFERED=1 python3 bench/generate_bench.py --model "$model" --sluice "$here/sluice" \
    --device cuda --timeout 240 --out "$out/generate_$name.json" "$@" \
    ${GENERATE_BENCH_ARGS:---num-prompts 1000 --max-tokens 128} >"$out/generate_$name.log" 2>&1 \
    || rc=1
  tail -n 45 "$out/generate_$name.log"
}
run llama-tiny-dummy "$here/fixtures/llama-tiny" --dummy-weights
run sluice-mini-moe models/sluice-mini-moe
exit $rc
RUN
chmod +x "$bundle/run_generate_bench.sh"
tree=$(git ls-files -z | xargs -0 cat | wc -c)
extra=$(git ls-files -z --others --exclude-standard | xargs -0 -r cat | wc -c)
size=$(du -sb "$bundle" | cut -f1)
echo "device_generate_bench: tracked $tree + untracked $extra + bundle $size bytes" \
  "= $((tree + extra + size)) (limit 67108864)"
[ $((tree + extra + size)) -le 67108864 ] || echo "device_generate_bench: WARNING: over 64 MiB"
echo "(device_bundle.sh's size line above is for the bundle before xz, UCX plugins included)"
