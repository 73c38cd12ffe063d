#!/usr/bin/env bash
# Builds GPU test/bench binaries here and bundles them for a GPU machine that has CUDA but none
# of our Debian dependencies (the `run` device tool's machines).
#
# Usage: scripts/device_bundle.sh [TARGET...]   (default: kernels_cuda_test cuda_kernel_bench)
#   Model runner targets: cuda_model_test (engine/cuda GPU tests; the llama-tiny,
#   deepseek-v3-tiny and qwen3-hybrid-tiny fixtures are copied into the bundle's fixtures/ and
#   found through SLUICE_SHARED_DIR, sluice-mini-moe is linked at run time from the repository
#   copy the bundle sits in) and cuda_decode_bench (Llama-3-8B and DeepSeek-V2-Lite shapes, with
#   bench/configs/ and bench/hf_baseline.py, run beside it with the device's own PyTorch +
#   transformers when `python3 -c "import transformers"` works there). With >= 2 GPUs,
#   nccl_communicator_test 2, cuda_tp_test and cuda_decode_bench --tp 2 run first (libnccl.so.2
#   from the device's pip nvidia-nccl package; NCCL_NVLS_ENABLE=0).
#   SLUICE_DEVICE_BUILD_DIR   build folder (default build-device; SLUICE_NATIVE=OFF so the
#                             binaries run on any x86-64 CPU, SLUICE_CUDA=ON)
#   SLUICE_DEVICE_BUNDLE_DIR  bundle folder (default device/cuda-kernels; /device/ is ignored by
#                             git, so name it in the device tool's `carry`)
#   SLUICE_JOBS               parallel build jobs (default 2)
#   SLUICE_DEVICE_CUDA_ARCHS  CMAKE_CUDA_ARCHITECTURES (default 90a: the device machines are
#                             H200s; one architecture keeps the binaries' device code, and so
#                             the bundle, half the size of the default 90a;80)
#   SLUICE_DEVICE_COMPRESS=1  pack the bundle (all but run_on_device.sh) into bundle.tar.xz,
#                             unpacked by run_on_device.sh: the device tool carries at most
#                             64 MiB with the tracked tree, which is already most of it
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
  -DSLUICE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${SLUICE_DEVICE_CUDA_ARCHS:-90a}" >/dev/null
cmake --build "$build" -j "${SLUICE_JOBS:-2}" --target "${targets[@]}"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
bins=()
for t in "${targets[@]}"; do
  cp "$build/bin/$t" "$stage/$t"
  # Debug info only: the symbol table stays (about 0.2 MB compressed per binary), so a crash's
  # stack trace (services/common/crash_handler.h) names its functions on the device machine.
  strip --strip-debug "$stage/$t"
  bins+=("$stage/$t")
done
rm -rf "$bundle"
"$bundler" "$bundle" "${bins[@]}"
# CUDA builds link the CUDA-aware UCX of .deps/ucx-cu13 (cmake/ucx.cmake). Its transport modules
# (cuda_copy, cuda_ipc) replace the Debian ones the bundler copied, and its ucx_perftest and
# ucx_info come along for bench/kv_transfer_bench.py.
ucx_cuda=.deps/ucx-cu13/libucx
if ldd "${bins[@]}" 2>/dev/null | grep ucx-cu13 >/dev/null; then  # not -q: SIGPIPE under pipefail
  # The wheel's tools find its libraries through LD_LIBRARY_PATH, not their rpath.
  LD_LIBRARY_PATH="$ucx_cuda/lib" "$bundler" "$bundle" "$ucx_cuda/bin/ucx_perftest" \
    "$ucx_cuda/bin/ucx_info" >/dev/null
  rm -rf "$bundle/lib/ucx"
  mkdir -p "$bundle/lib/ucx"
  for m in "$ucx_cuda"/lib/ucx/*.so.0; do cp -L "$m" "$bundle/lib/ucx/"; done
  for m in "$bundle"/lib/ucx/*.so.0; do patchelf --force-rpath --set-rpath '$ORIGIN/..' "$m"; done
fi
for t in "${targets[@]}"; do
  case "$t" in
    cuda_model_test)
      mkdir -p "$bundle/fixtures"
      # llama-tiny, qwen3-hybrid-tiny and deepseek-v3-tiny with the goldens of their first 2
      # prompts (5 and 17 tokens; the 64- and 150-token cases are 2.1 and 4.9 MB of logits),
      # logits stored as F16, qwen3-hybrid-tiny's float16 weights as stored (1.4 MB, already 2
      # bytes a weight), deepseek-v3-tiny's float32 weights stored as bf16 (rounded to nearest even, as the CUDA
      # runner's loader rounds them, so the device sees the same values;
      # e_score_correction_bias stays float32 as the runner keeps it): the device tool sends at
      # most 64 MiB and the tracked tree (models/sluice-mini-moe included) is 57.8 MB of it.
      # sluice-mini-moe is not copied: it is tracked (models/sluice-mini-moe, goldens of 5- to
      # 150-token prompts); run_on_device.sh links it into the bundle's models/.
      for m in llama-tiny qwen3-hybrid-tiny deepseek-v3-tiny; do
        mkdir -p "$bundle/fixtures/$m"
        # The tokenizer too, so `sluice serve` / prefill / decode can serve these models there
        # (scripts/gpu_disagg_runs.sh --bundle).
        cp ../shared/fixtures/$m/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json} \
          "$bundle/fixtures/$m/"
      done
      for m in llama-tiny qwen3-hybrid-tiny; do
        cp ../shared/fixtures/$m/model.safetensors "$bundle/fixtures/$m/"
      done
      # llava-tiny for the CUDA vision tower (cuda_vision_test.cc) and language model
      # (cuda_llava_test.cc): weights, configs, the three images and (below) the vision goldens
      # (pixel values, hidden states, features) and the prompts' ids, images, greedy tokens and
      # logits (F16, as above: 1.5 MB).
      mkdir -p "$bundle/fixtures/llava-tiny"
      cp ../shared/fixtures/llava-tiny/{config.json,preprocessor_config.json,model.safetensors,image_0.png,image_1.png,image_2.jpg} \
        "$bundle/fixtures/llava-tiny/"
      # And what `sluice serve --device cuda` on llava-tiny reads besides.
      cp ../shared/fixtures/llava-tiny/{generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja,processor_config.json} \
        "$bundle/fixtures/llava-tiny/"
      python3 - ../shared/fixtures "$bundle/fixtures" <<'PY'
import json, struct, sys
from array import array
src_dir, dst_dir = sys.argv[1], sys.argv[2]

def rewrite(src, dst, keep, to_bf16, to_f16=lambda k: False):
    """Copies the tensors `keep(name)` of safetensors `src` to `dst`, F32 -> BF16 (round to
    nearest even) for the names `to_bf16(name)`, F32 -> F16 (struct's round to nearest even)
    for the names `to_f16(name)`."""
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out, blobs, off = {}, [], 0
    for k, v in header.items():
        if k == "__metadata__":
            out[k] = v
            continue
        if not keep(k):
            continue
        b, e = v["data_offsets"]
        blob = data[b:e]
        if v["dtype"] == "F32" and to_bf16(k):
            blob = array("H", ((x + 0x7FFF + ((x >> 16) & 1)) >> 16
                               for x in array("I", blob))).tobytes()
            v = dict(v, dtype="BF16")
        elif v["dtype"] == "F32" and to_f16(k):
            n = len(blob) // 4
            blob = struct.pack(f"<{n}e", *struct.unpack(f"<{n}f", blob))
            v = dict(v, dtype="F16")
        blobs.append(blob)
        out[k] = dict(v, data_offsets=[off, off + len(blob)])
        off += len(blob)
    text = json.dumps(out).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))

never = lambda k: False
# Golden logits as F16: all |logit| < 2.4 in these fixtures (llava-tiny's too), so the error is < 0.001 (half an
# F16 ulp in [2, 4)), far inside the tests' 0.15 bound, for half the bytes.
for model in ("llama-tiny", "qwen3-hybrid-tiny", "deepseek-v3-tiny"):
    rewrite(f"{src_dir}/{model}/golden.safetensors", f"{dst_dir}/{model}/golden.safetensors",
            lambda k: k.rsplit("_", 1)[-1] in ("0", "1"), never,
            lambda k: k.startswith("logits_"))
rewrite(f"{src_dir}/llava-tiny/golden.safetensors", f"{dst_dir}/llava-tiny/golden.safetensors",
        lambda k: k.startswith(("pixel_values_", "vision_hidden_", "image_features_", "input_ids_",
                                "prompt_images_", "greedy_", "logits_")), never,
        lambda k: k.startswith("logits_"))
rewrite(f"{src_dir}/deepseek-v3-tiny/model.safetensors",
        f"{dst_dir}/deepseek-v3-tiny/model.safetensors", lambda k: True,
        lambda k: not k.endswith("e_score_correction_bias"))
PY
      ;;
    cuda_decode_bench)
      mkdir -p "$bundle/configs"
      cp -r bench/configs/. "$bundle/configs/"
      # GEMM tuning tables: CudaRunnerOptions::gemm_tuning "auto" finds them beside the binary.
      if [ -d configs/gemm_tuning ]; then cp -r configs/gemm_tuning "$bundle/configs/"; fi
      cp bench/hf_baseline.py "$bundle/" ;;
  esac
done
# UCX transport modules only matter to binaries that load UCX.
if ! grep -lq libucp "$bundle"/lib/*.so* 2>/dev/null && ! ldd "${bins[@]}" | grep -q libucp; then
  rm -rf "$bundle/lib/ucx"
fi

cat >"$bundle/run_on_device.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the bundled CUDA kernel tests and bench on a GPU machine; results go to ${1:-$OUT}.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ -f "$here/bundle.tar.xz" ] && tar -xJf "$here/bundle.tar.xz" -C "$here"
out="${1:-${OUT:?give an output folder}}"
mkdir -p "$out"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if [ -e "$d/libcublasLt.so.13" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; break; fi
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
  | tee "$out/gpu.csv"
rc=0
# Multi-GPU binaries (cuda_tp_test, nccl_communicator_test, cuda_decode_bench --tp) load
# libnccl.so.2, which is not bundled (200+ MB): the device's pip nvidia-nccl package provides it.
nccl_dir="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib"
[ -e "$nccl_dir/libnccl.so.2" ] && export LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the lent machines
gpus="$(nvidia-smi -L | grep -c '^GPU')"
if [ "$gpus" -ge 2 ]; then
  # Bounded: a rank that fails leaves its peers waiting in NCCL.
  [ -x "$here/nccl_communicator_test" ] && { timeout 180 "$here/nccl_communicator_test" 2 2>&1 \
    | tee "$out/nccl_communicator_test.log"; [ "${PIPESTATUS[0]}" = 0 ] || rc=1; }
  [ -x "$here/cuda_tp_test" ] && { timeout 300 "$here/cuda_tp_test" \
    --gtest_output="json:$out/cuda_tp_test.json" 2>&1 | tee "$out/cuda_tp_test.log";
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1; }
  [ -x "$here/cuda_decode_bench" ] && { timeout 500 "$here/cuda_decode_bench" \
    --config "$here/configs/llama3-8b" --tp 2 --batches 1,64 --context 1024 \
    --out "$out/cuda_llama8b_tp2.json" 2>&1 | tee "$out/cuda_decode_bench_tp2.log";
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1; }
fi
if [ -x "$here/kernels_cuda_test" ]; then
  "$here/kernels_cuda_test" --gtest_output="json:$out/kernels_cuda_test.json" 2>&1 \
    | tee "$out/kernels_cuda_test.log" || rc=1
  # SLUICE_DEVICE_SANITIZER=0 skips the sanitizer passes (minutes) when device time is short.
  if [ "${SLUICE_DEVICE_SANITIZER:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
    # Out-of-bounds and race checks on our own kernels (cuBLASLt's excluded: slow and not ours).
    timeout 180 compute-sanitizer --tool memcheck --error-exitcode 3 \
      "$here/kernels_cuda_test" --gtest_filter='-LinearCuda*' >"$out/sanitizer.log" 2>&1 || rc=1
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 3 \
      "$here/kernels_cuda_test" --gtest_filter='Rope*:RmsNorm*:AddRmsNorm*' \
      >>"$out/sanitizer.log" 2>&1 || rc=1
    tail -n 3 "$out/sanitizer.log"
  fi
fi
if [ -x "$here/cuda_model_test" ]; then
  # sluice-mini-moe from the repository copy this bundle sits in (models/ is tracked).
  if [ ! -e "$here/models/sluice-mini-moe" ]; then
    d="$here"
    while [ "$d" != / ]; do
      d="$(dirname "$d")"
      if [ -f "$d/models/sluice-mini-moe/model.safetensors" ]; then
        mkdir -p "$here/models" && ln -s "$d/models/sluice-mini-moe" "$here/models/sluice-mini-moe"
        break
      fi
    done
  fi
  # SLUICE_MODEL_TEST_FILTER: a gtest filter (e.g. to leave out models not carried along).
  SLUICE_SHARED_DIR="$here" "$here/cuda_model_test" --gtest_output="json:$out/cuda_model_test.json" \
    --gtest_filter="${SLUICE_MODEL_TEST_FILTER:-*}" \
    2>&1 | tee "$out/cuda_model_test.log" || rc=1
fi
if [ -x "$here/cuda_decode_bench" ]; then
  "$here/cuda_decode_bench" --config "$here/configs/llama3-8b" --out "$out/cuda_llama8b.json" \
    2>&1 | tee "$out/cuda_decode_bench.log" || rc=1
  # DeepSeek-V2-Lite shapes (MLA + MoE, 15.7B parameters, dummy bf16 weights: 31 GB).
  "$here/cuda_decode_bench" --config "$here/configs/deepseek-v2-lite" --batches 1,64 \
    --prefill 4096 --out "$out/cuda_dsv2lite.json" 2>&1 | tee "$out/cuda_dsv2lite_bench.log" || rc=1
  if python3 -c "import transformers" 2>/dev/null; then
    python3 "$here/hf_baseline.py" --config "$here/configs/llama3-8b" --out "$out/hf_llama8b.json" \
      2>&1 | grep -v Warning | tee "$out/hf_baseline.log" || rc=1
  fi
fi
if [ -x "$here/cuda_kernel_bench" ]; then
  "$here/cuda_kernel_bench" "$out/cuda_kernels_h200.json" >"$out/bench.log" 2>&1 || rc=1
  cat "$out/bench.log"
fi
exit $rc
RUN
chmod +x "$bundle/run_on_device.sh"
if [ "${SLUICE_DEVICE_COMPRESS:-0}" = 1 ]; then
  (cd "$bundle" && ls -A | grep -v '^run_on_device.sh$' | tar -cJf bundle.tar.xz -T - &&
    ls -A | grep -Ev '^(run_on_device.sh|bundle.tar.xz)$' | xargs rm -rf)
fi
du -sh "$bundle"
# The device tool sends the tracked and untracked-not-ignored files plus carried paths, 64 MiB
# at most.
tree_bytes=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null |
  awk 'END {print $1}')
bundle_bytes=$(du -sb "$bundle" | cut -f1)
echo "device_bundle: working tree $tree_bytes + bundle $bundle_bytes bytes (limit 67108864)"
[ $((tree_bytes + bundle_bytes)) -le 67108864 ] ||
  echo "device_bundle: WARNING: over the device tool's 64 MiB (SLUICE_DEVICE_COMPRESS=1?)" >&2
