// PagedAttentionOptions: the plan-time choices of PagedAttentionCuda
// (paged_attention_cuda.h), in a header without CUDA so that runner options can carry them.
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_OPTIONS_H_
#define SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_OPTIONS_H_

namespace sluice::kernels {

// PagedAttentionOptions: the choices of a launch, fixed when it is planned. Pass the same
// options to PagedAttentionCudaWorkspaceBytes and to the launch (the split-KV plan, so the
// workspace, depends on the kernel). The defaults are what serving runs: the plan's shape
// rules (paged_attention_plan.cu) pick the kernel per launch. The other values force one of
// the same kernels at every shape, for tests and A/B benchmarks; a forced kernel that does not
// serve a launch's head dims or device falls back along the chain as the default does.
enum class PagedDecodeKernel {
  // Persistent decode warps where the unsplit (sequence, KV head) units fill the GPU's
  // resident warps at least once (Llama-3-8B batch 256 on an H200), else warp rings.
  kAuto,
  kWarpRings,         // CTAs of per-warp cp.async rings for every decode launch
  kPersistentWarps,   // persistent decode warps for every decode launch
};
// Prefill launches (some sequence's query rows, query tokens × group, exceed 16) try the
// kernels in this order, each where it serves; the option names the first one tried.
enum class PagedPrefillKernel {
  kWgmma,     // sm_90a wgmma, head dims 128/128, no sliding window, scale > 0
  kFa2,       // FlashAttention-2 tiles (128 rows × 64 keys), larger head dim 33..128, scale > 0
  kMmaTiles,  // 128 rows × 32 keys, Q in shared memory, head dims ≤ 128, scale > 0
  kCtaTiles,  // 64-row CTA tiles: any supported head dims (192/128, 256)
};
struct PagedAttentionOptions {
  PagedDecodeKernel decode_kernel = PagedDecodeKernel::kAuto;
  PagedPrefillKernel prefill_kernel = PagedPrefillKernel::kWgmma;
  // Launch the attention kernel and its split-KV combine as programmatic dependents of the
  // kernel before them (kernels/cuda/pdl.cuh; only where PdlSupported()), with the reads before
  // the wait that PagedAttentionCuda / PagedAttentionRopeDecodeCuda document. Same results;
  // CUDA model runners set it from CudaRunnerOptions::decode_pdl_level (>= 1).
  bool pdl = false;
  // Batch-invariant mode (paged_attention_invariant.h): every launch, decode or prefill, runs
  // one kernel that reduces each query row's keys in fixed splits of kBatchInvariantSplitKeys
  // positions, so a row's bits do not depend on the batch, the step's token count or how its
  // prompt was chunked; decode_kernel / prefill_kernel and the RoPE decode fusion are unused.
  bool batch_invariant = false;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_OPTIONS_H_
