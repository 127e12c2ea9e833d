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

template <class Params>
__device__ __forceinline__ int diag_of([[maybe_unused]] const Params& p) {
#ifdef WGRAD_DIAG_VARIANTS
  return p.diag;
#else
  return 0;
#endif
}

}  // namespace wgrad
