// \brief The measurement build (setup.py: WGRAD_DIAG_VARIANTS=1, -DWGRAD_DIAG_VARIANTS): "where the time
// goes" variants of the GEMM. The host reads the bits below from WGRAD_DIAG (common/knobs.h) into the
// kernel's parameters; each bit drops part of the work, so the results are wrong: for timing only. In
// every other build the parameters hold no bits, diag_of is the constant 0 and the branches on it
// compile away. Torch-free.
#pragma once

namespace wgrad {

constexpr int kDiagScalesOnce = 1;   // load the scales at a tile's first K block only
constexpr int kDiagNoPromotion = 2;  // accumulate a whole tile in the WGMMA scratch, no promotion
constexpr int kDiagNoEpilogue = 4;   // no epilogue at all (the reduce-add; the loaded epilogue always runs)
constexpr int kDiagPlainStore = 32;  // the epilogue's TMA stores overwrite out instead of adding
constexpr int kDiagNoStaging = 64;   // the epilogue stores whatever its smem buffer holds (no STS)
constexpr int kDiagHalfB = 128;      // B is loaded for every other K block only (contiguous-K: aligned blocks)
// Not a drop but a delay: consumer warpgroup 1 starts its first tile ~1 us (256), ~2 us (512) or ~3 us (both)
// after warpgroup 0, so that one warpgroup's epilogue and tile start can run under the other's WGMMAs (the
// stage ring bounds the lead to kStages - 1 blocks). The results stay right.
constexpr int kDiagStagger1us = 256;
constexpr int kDiagStagger2us = 512;

// Spins the calling warp for the stagger that `diag` asks of consumer warpgroup `wg` (none for warpgroup 0).
__device__ __forceinline__ void diag_stagger(int diag, int wg) {
  const long long ns = (diag & kDiagStagger1us ? 1000 : 0) + (diag & kDiagStagger2us ? 2000 : 0);
  if (wg == 0 || ns == 0) return;
  long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (long long now = start; now - start < ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  __syncwarp();  // converged before the warpgroup's first WGMMA (.sync.aligned)
}

template <class Params>
__device__ __forceinline__ int diag_of([[maybe_unused]] const Params& p) {
#ifdef WGRAD_DIAG_VARIANTS
  return p.diag;
#else
  return 0;
#endif
}

}  // namespace wgrad
