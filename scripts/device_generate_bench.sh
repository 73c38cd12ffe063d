#!/usr/bin/env bash
# Bundles `sluice` (CUDA backend) for the GPU machine and writes the one script that runs the
# offline batch benchmark there (bench/generate_bench.py: `sluice generate --device cuda` against
# HF transformers `generate`, same prompts, greedy).
#
# Here:    scripts/device_generate_bench.sh
#            SLUICE_DEVICE_BUILD_DIR   build folder (default build-hD; configured NATIVE=OFF, CUDA=ON)
#            SLUICE_GENERATE_BUNDLE    bundle folder (default device/generate-bench: ignored by git,
#                                      so the device tool must `carry` it)
# There:   device/generate-bench/run_generate_bench.sh [OUT_DIR]   (default $OUT)
#            GENERATE_BENCH_MODELS     model folders, repo-relative or bundle fixtures (default:
#                                      the Llama fixture llama-tiny, then models/sluice-mini-moe)
#            GENERATE_BENCH_ARGS       extra generate_bench.py arguments (default
#                                      --num-prompts 1000 --max-tokens 128)
#          writes generate_<model>.json and generate_<model>.log per model and gpu.csv to OUT_DIR.
# The bundle (sluice + its non-system libraries, xz-packed, and the llama-tiny fixture) must fit
# beside the tracked tree in the device tool's 64 MiB; its size is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle="${SLUICE_GENERATE_BUNDLE:-device/generate-bench}"
SLUICE_DEVICE_BUILD_DIR="${SLUICE_DEVICE_BUILD_DIR:-build-hD}" SLUICE_DEVICE_BUNDLE_DIR="$bundle" \
  SLUICE_DEVICE_COMPRESS=1 scripts/device_bundle.sh sluice
rm -f "$bundle/run_on_device.sh"  # the kernel-test runner device_bundle.sh writes; not ours
fixture=../shared/fixtures/llama-tiny
mkdir -p "$bundle/fixtures/llama-tiny"
cp "$fixture"/{config.json,generation_config.json,model.safetensors,tokenizer.json,tokenizer_config.json} \
  "$bundle/fixtures/llama-tiny/"

cat >"$bundle/run_generate_bench.sh" <<'RUN'
#!/usr/bin/env bash
# Runs bench/generate_bench.py on this GPU machine for each model; results go to ${1:-$OUT}.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-${OUT:?give an output folder}}"
mkdir -p "$out"
[ -x "$here/sluice" ] || tar -xJf "$here/bundle.tar.xz" -C "$here"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if [ -e "$d/libcublasLt.so.13" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; break; fi
done
[ -d "$here/lib/ucx" ] && export UCX_MODULE_DIR="$here/lib/ucx"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.csv"
"$here/sluice" --help >/dev/null || { echo "sluice does not start (libraries?)"; ldd "$here/sluice"; exit 1; }
cd "$repo"
rc=0
for model in ${GENERATE_BENCH_MODELS:-$here/fixtures/llama-tiny models/sluice-mini-moe}; do
  name="$(basename "$model")"
  PYTHONUNBUFFERED=1 python3 bench/generate_bench.py --model "$model" --sluice "$here/sluice" \
    --device cuda --out "$out/generate_$name.json" \
    ${GENERATE_BENCH_ARGS:---num-prompts 1000 --max-tokens 128} 2>&1 \
    | tee "$out/generate_$name.log" | tail -n 40 || rc=1
  [ -s "$out/generate_$name.json" ] || rc=1
done
exit $rc
RUN
chmod +x "$bundle/run_generate_bench.sh"
du -sh "$bundle"
du -sb "$bundle"
