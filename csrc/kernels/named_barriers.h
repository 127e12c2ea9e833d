// \brief Named-barrier ids of the SM90 wgrad kernel (offset past CUTLASS's reserved ids by NamedBarrier).
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

namespace wgrad {

enum class NamedBarrierId : uint32_t {
  // Both consumer warpgroups: the zeroed tail of a contiguous-K group's last block is visible.
  TailMask = 0,
  // One per consumer warpgroup: its half of the epilogue staging buffer is free / fully written.
  EpilogueWg0 = 1,
  EpilogueWg1 = 2,
  // The issue order of the two consumer warpgroups' WGMMAs (ConsumerOrder below).
  Wg0Issued = 3,
  Wg1Issued = 4,
};

// Makes the two consumer warpgroups take turns on the tensor cores, one K block each:
//     WG0 block 0, WG1 block 0, WG0 block 1, WG1 block 1, ...   (over every tile, in order)
// Each warpgroup waits for the other one's previous turn before it issues its WGMMAs and signals once
// they are issued. The tensor cores run a block of WG0 and then the same block of WG1, so each
// warpgroup promotes its scratch accumulators while the other one's WGMMAs run, instead of both
// promoting at once while the tensor cores idle. Only the issue order is fixed; the WGMMAs themselves
// stay asynchronous. Both warpgroups walk the same tiles and K blocks, so the turns always pair up.
struct ConsumerOrder {
  int warp_group;     // 0 or 1: which consumer warpgroup this thread belongs to
  bool first = true;  // WG0's very first turn waits for nobody

  __device__ void wait_turn() {
    if (warp_group == 0) {
      if (!first) cutlass::arch::NamedBarrier::sync(256, static_cast<uint32_t>(NamedBarrierId::Wg1Issued));
      first = false;
    } else {
      cutlass::arch::NamedBarrier::sync(256, static_cast<uint32_t>(NamedBarrierId::Wg0Issued));
    }
  }
  __device__ void end_turn() {
    cutlass::arch::NamedBarrier::arrive(
        256, static_cast<uint32_t>(warp_group == 0 ? NamedBarrierId::Wg0Issued : NamedBarrierId::Wg1Issued));
  }
};

}  // namespace wgrad
