// \brief How the MoE segments cast runs: the kernel, the TMA kernel's tile order and packed tiles, the carry
// kernel's dynamic tail. The public ops take every choice automatically from the shape (SegmentsPlan{}); the
// private op _quantize_fp8_1x128_colwise_segments_with_plan takes a plan string (parse_segments_plan), so
// that tests reach every path. Every plan gives the same bits; only the speed differs. Torch-free but for
// the parse's error.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "kernels/quant/segments_carry_plan.h"

namespace wgrad {

enum class PlanChoice : int8_t { kAuto, kOn, kOff };

struct SegmentsPlan {
  // kTma: the persistent TMA kernel of every column cast (kernels/quant/colwise_kernel_sm90.cuh); kCarry: the
  // carried-sectors kernel (kernels/quant/segments_carry.cuh) wherever it can take the cast (unpadded, 16-bit
  // x with 16-byte aligned rows, at most kMaxWarpSegments segments, a table that fits), else the TMA kernel.
  enum class Kernel : int8_t { kAuto, kTma, kCarry };
  Kernel kernel = Kernel::kAuto;
  // The TMA kernel's tile order (TileOrder): -1 automatic (choose_segment_order), 0 ranges, S >= 1 strips of
  // S blocks (1: row-major); shared_order: strips or ranges shared by a CTA's consumer groups.
  int order = -1;
  bool shared_order = false;
  // The TMA kernel's packed tiles (unpadded casts whose table fits in the kernel; build_packed_tiles).
  PlanChoice packed = PlanChoice::kAuto;
  // The carry kernel's dynamic tail (CarryDynamic): on takes it at every launch, off never.
  PlanChoice tail = PlanChoice::kAuto;
};

// "auto" (or "") or comma-separated items, each at most once:
//   kernel=auto|tma|carry   order=auto|ranges|cranges|S|cS (S in [1, 64]; c: shared by a CTA's groups)
//   packed=auto|on|off      tail=auto|on|off
// e.g. "kernel=tma,order=c12". Anything else throws std::runtime_error naming `op` and the plan.
SegmentsPlan parse_segments_plan(const char* op, const std::string& plan);

// ---- the automatic choices -----------------------------------------------------------------------------

// Packed tiles at kPackedMaxRowsPerSegment rows per segment or fewer on average: there they were faster in
// every cell measured (H200, % of a copy, packed / one tile per block: 4096 x 7168 with 256 segments 32.9 /
// 16.3, with 64 segments 44.0 / 41.2; 16384 x 7168 with 256 segments 43.7 / 41.8), and one tile per block
// is faster above (16384 x 7168 with 128 segments: 42.2 / 55.7).
constexpr int64_t kPackedMaxRowsPerSegment = 64;
inline bool take_packed_tiles(const SegmentsPlan& plan, int64_t rows, int64_t segments) {
  if (plan.packed == PlanChoice::kAuto) return rows <= kPackedMaxRowsPerSegment * segments;
  return plan.packed == PlanChoice::kOn;
}

// The carry kernel for a cast it can take (see SegmentsPlan::Kernel): automatically where
// carry_kernel_by_default measured it faster; unpadded casts only (padded ones always take the TMA kernel).
inline bool take_carry_kernel(const SegmentsPlan& plan, int64_t rows, int64_t cols, int64_t segments, int64_t pad) {
  if (pad != 0 || plan.kernel == SegmentsPlan::Kernel::kTma) return false;
  return plan.kernel == SegmentsPlan::Kernel::kCarry || quant::carry_kernel_by_default(rows, cols, segments);
}

// The dynamic tail's CarryDynamic::max_remainder for a grid of `ctas` CTAs, or nullopt (no tail, no
// counter). Automatic: the remainder tiles % CTAs from the counter when it is at most half the CTAs, else
// one range per CTA.
inline std::optional<int32_t> carry_tail_max_remainder(const SegmentsPlan& plan, unsigned ctas) {
  if (plan.tail == PlanChoice::kOff) return std::nullopt;
  if (plan.tail == PlanChoice::kOn) return std::numeric_limits<int32_t>::max();
  return static_cast<int32_t>(ctas / 2);
}

}  // namespace wgrad
