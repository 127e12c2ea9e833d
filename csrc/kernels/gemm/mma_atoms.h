// \brief The WGMMA and shared-memory layouts of the mainloop, on their own so that host-side C++
// tests can check the accumulator fragment layout the kernel's promotion and epilogue rely on.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "kernels/gemm/tile_config.h"

namespace wgrad {

using Fp8 = cute::float_e4m3_t;

// Two consumer warpgroups side by side along N: warpgroup w owns the 128 x BLOCK_N/2 block of columns
// [w * BLOCK_N/2, (w + 1) * BLOCK_N/2) and issues two m64 x n(BLOCK_N/2) x k32 WGMMAs (rows 0-63 and
// 64-127) per k32 step. Side by side rather than stacked along M: the B tile is then read from shared
// memory once per K block instead of once per warpgroup, and each thread needs the scales of BLOCK_N/8
// columns instead of BLOCK_N/4 — shared-memory wavefronts are what bounds this kernel (ncu on an H100:
// the shared-memory pipe is the busiest unit of the mainloop).
template <int kBlockN>
using TiledMmaSm90 = decltype(cute::make_tiled_mma(
    cute::GMMA::ss_op_selector<Fp8, Fp8, float, cute::Shape<cute::_64, cute::Int<kBlockN / 2>, cute::Int<kBlockK>>>(),
    cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>{}));

// One WGMMA per warpgroup spans all its columns. (Without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, set in
// setup.py, CuTe would silently pick a narrower atom for N = 72 or 80 and the fragment order the
// promotion and epilogue index by would change.)
template <int kBlockN>
constexpr bool kOneAtomPerWarpgroup =
    cute::size<1>(typename TiledMmaSm90<kBlockN>::AtomShape_MNK{}) == kBlockN / 2;
static_assert(kOneAtomPerWarpgroup<128> && kOneAtomPerWarpgroup<144> && kOneAtomPerWarpgroup<160> &&
                  kOneAtomPerWarpgroup<kMGroupedBlockN>,
              "CuTe must provide m64 x n(BLOCK_N/2) x k32 FP8 WGMMA atoms");

// K-major, 128-byte swizzle: what TMA's SWIZZLE_128B writes for 128-byte rows and what WGMMA reads.
template <int kRows, int kStages>
using SmemLayoutKSw128 = decltype(cute::tile_to_shape(
    cute::GMMA::Layout_K_SW128_Atom<Fp8>{},
    cute::make_shape(cute::Int<kRows>{}, cute::Int<kBlockK>{}, cute::Int<kStages>{})));

}  // namespace wgrad
