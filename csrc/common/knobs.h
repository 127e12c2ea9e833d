// \brief Every environment knob the extension reads (the only reads of the environment in csrc/):
//   WGRAD_BLOCK_N  forces the GEMM's tile width to one of kBlockNCandidates (any other value is ignored).
//                  Read at every call, so that a sweep (scripts/profile_dense.py) can change it between
//                  calls. Documented for users.
//   WGRAD_FP32_EPILOGUE  forces the fp32 GEMMs' epilogue: "reduce-add" or "loaded" (out loaded ahead);
//                  unset or empty, the call's shape decides (tile_config.h: select_fp32_config). Read at every
//                  call. Documented for users.
//   WGRAD_DIAG     measurement build only (setup.py: WGRAD_DIAG_VARIANTS=1): the bits of
//                  kernels/common/diag.h that drop parts of the GEMM's work, for timing. Any other build
//                  never reads it.
// Everything else a call could vary (the quantization kernels' paths among them) is chosen from the
// shapes; tests reach the forced paths through explicit arguments (quant/plan.h), not the environment.
#pragma once

#include <cstdlib>
#include <string_view>

#include "common/stable.h"
#include "kernels/gemm/tile_config.h"

namespace wgrad {

// WGRAD_BLOCK_N when it names a candidate width, else 0 (the heuristic of tile_config.h decides).
inline int forced_block_n() {
  const char* v = std::getenv("WGRAD_BLOCK_N");
  if (v == nullptr) return 0;
  const int forced = std::atoi(v);
  for (int bn : kBlockNCandidates) {
    if (bn == forced) return bn;
  }
  return 0;
}

// WGRAD_FP32_EPILOGUE: 0 (reduce-add), 1 (loaded), or -1 when unset or empty (the heuristic decides).
inline int forced_fp32_epilogue() {
  const char* v = std::getenv("WGRAD_FP32_EPILOGUE");
  if (v == nullptr || *v == '\0') return -1;
  const std::string_view s(v);
  WGRAD_CHECK(s == "reduce-add" || s == "loaded", "WGRAD_FP32_EPILOGUE must be 'reduce-add' or 'loaded', got '", v,
              "'");
  return s == "loaded" ? 1 : 0;
}

// The measurement build's WGRAD_DIAG bits (0 when unset); 0 in every other build, without reading it.
inline int diag_bits() {
#ifdef WGRAD_DIAG_VARIANTS
  const char* v = std::getenv("WGRAD_DIAG");
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long bits = std::strtol(v, &end, 10);
  WGRAD_CHECK(*v != '\0' && *end == '\0', "WGRAD_DIAG must be an integer (bits of kDiag*), got '", v, "'");
  return static_cast<int>(bits);
#else
  return 0;
#endif
}

}  // namespace wgrad
