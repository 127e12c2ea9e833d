// \brief The WGMMA and shared-memory layouts of the mainloop, on their own so that host-side C++
// tests can check the accumulator fragment layout the kernel's promotion and epilogue rely on.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "tile_config.h"

namespace wgrad {

using Fp8 = cute::float_e4m3_t;

// Two consumer warpgroups stacked along M, each m64 x nBLOCK_N x k32 per instruction.
template <int kBlockN>
using TiledMmaSm90 = decltype(cute::make_tiled_mma(
    cute::GMMA::ss_op_selector<Fp8, Fp8, float, cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kBlockK>>>(),
    cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

// K-major, 128-byte swizzle: what TMA's SWIZZLE_128B writes for 128-byte rows and what WGMMA reads.
template <int kRows, int kStages>
using SmemLayoutKSw128 = decltype(cute::tile_to_shape(
    cute::GMMA::Layout_K_SW128_Atom<Fp8>{},
    cute::make_shape(cute::Int<kRows>{}, cute::Int<kBlockK>{}, cute::Int<kStages>{})));

}  // namespace wgrad
