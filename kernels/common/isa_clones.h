// SLUICE_AVX512_CLONES: marks a CPU kernel's hot function to be compiled twice in a baseline
// x86-64 build (SLUICE_NATIVE=OFF), once for AVX-512, the loader picking the clone the CPU runs
// (GCC target_clones; flatten inlines the callees into each clone). The baseline keeps a 16-lane
// V16 (vec16.h) in four SSE registers and spills a tile's accumulators to the stack on every step;
// AVX-512 holds each in one register.
//
// Contract: the file is compiled with -ffp-contract=off in that build (kernels/CMakeLists.txt),
// so both clones perform the same IEEE operations in the same order and give bit-identical
// results: which clone runs never changes an output. Empty where the build already targets the
// machine (SLUICE_NATIVE, __AVX512F__) or the compiler is not GCC.
#ifndef SLUICE_KERNELS_COMMON_ISA_CLONES_H_
#define SLUICE_KERNELS_COMMON_ISA_CLONES_H_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX512F__)
#define SLUICE_AVX512_CLONES __attribute__((target_clones("avx512f", "default"), flatten))
#else
#define SLUICE_AVX512_CLONES
#endif

#endif  // SLUICE_KERNELS_COMMON_ISA_CLONES_H_
