// \brief The measurement build's knobs (setup.py: WGRAD_DIAG_VARIANTS=1): the bits a kernel's parameters
// carry there (the GEMM's kDiag* in tile_config.h, the column quantization's kQuantDiag*), 0 in every
// other build, where the branches on them compile away. Torch-free.
#pragma once

namespace wgrad {

template <class Params>
__device__ __forceinline__ int diag_of([[maybe_unused]] const Params& p) {
#ifdef WGRAD_DIAG_VARIANTS
  return p.diag;
#else
  return 0;
#endif
}

}  // namespace wgrad
