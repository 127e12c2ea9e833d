// \brief Named-barrier ids of the SM90 kernels (offset past CUTLASS's reserved ids by NamedBarrier): the
// GEMM's and the column-wise cast's. Torch-free.
#pragma once

#include <cstdint>

namespace wgrad {

// The GEMM (kernels/gemm/).
enum class NamedBarrierId : uint32_t {
  // Both consumer warpgroups: the zeroed tail of a contiguous-K group's last block is visible.
  TailMask = 0,
  // One per consumer warpgroup: its half of the epilogue staging buffer is free / fully written.
  EpilogueWg0 = 1,
  EpilogueWg1 = 2,
  // The producer warpgroup's shifting warps (contiguous-K groups at unaligned offsets): a stage's
  // shifted tiles are complete.
  ShiftDone = 3,
};

// The column-wise cast (kernels/quant/colwise_kernel_sm90.cuh): consumer group g synchronises its own
// threads on Consumers + g.
enum class QuantBarrierId : uint32_t { Consumers = 0 };

}  // namespace wgrad
