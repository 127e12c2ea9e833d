// \brief The parameters every FP8 1x128 quantization kernel takes (plain pointers, shapes and strides) and
// the row-block table of the MoE segments casts. Torch-free; host and device.
#pragma once

#include <cstdint>

namespace wgrad::quant {

// BothSegments: the row-wise outputs of x and, from the same read, the column-wise outputs over row segments
// (the MoE activation or output gradient: row-wise for the expert GEMM, column-wise per expert for wgrad).
enum class QuantMode { Rowwise, Colwise, Both, ColwiseSegments, BothSegments };

constexpr bool has_rowwise(QuantMode m) {
  return m == QuantMode::Rowwise || m == QuantMode::Both || m == QuantMode::BothSegments;
}
constexpr bool has_colwise(QuantMode m) { return m != QuantMode::Rowwise; }
constexpr bool has_segments(QuantMode m) { return m == QuantMode::ColwiseSegments || m == QuantMode::BothSegments; }

// One 128-row block of the column-wise output: rows [row_start, row_start + row_count) of x, written to
// q_t columns [out_start, out_start + row_count) (out_start == row_start but for padded segments).
// row_count == 0: an unused scale column (its scales are zeroed); row_count < 0: the segment sizes
// failed validation (every scale becomes NaN, q_t is not written).
struct RowBlock {
  int32_t row_start;
  int32_t row_count;
  int32_t out_start;
};

struct QuantizeParams {
  const void* x;          // [rows, cols], row-major, bf16 / fp16 / fp32
  int64_t rows;
  int64_t cols;
  bool ue8m0;             // power-of-two scales, rounded up

  uint8_t* q;             // rowwise: [rows, cols] e4m3, row-major
  float* scales;          // rowwise: (r, kb) at kb * scales_ld + r
  int64_t scales_ld;

  uint8_t* q_t;           // colwise: [cols, q_t_ld] e4m3, (c, r) at c * q_t_ld + r; q_t_ld % 16 == 0
  int64_t q_t_ld;
  float* scales_t;        // colwise: (c, rb) at rb * scales_t_ld + c
  int64_t scales_t_ld;

  const RowBlock* row_blocks;  // ColwiseSegments: one entry per scale column (row block)
  // ColwiseSegments: 0, or the padding of every segment's q_t columns (16, 32, 64 or 128): segment g then
  // starts at q_t column sum_{h<g} align_up(size_h, seg_pad), the columns between segments and those
  // after the last one (up to q_t_ld) are 0.
  int64_t seg_pad;
};

// The segments of the MoE path, on the device: validated and turned into the row-block table by
// build_segment_table below (inside the column kernel, or by build_segment_table_kernel).
struct SegmentTableArgs {
  const int32_t* sizes = nullptr;  // [num_segments] rows of each segment; must be >= 0 and sum to rows
  int64_t num_segments = 0;
  int64_t rows = 0;
  int64_t num_row_blocks = 0;      // the scale columns of the output: entries of the table
  int64_t pad = 0;                 // QuantizeParams::seg_pad
  int32_t* padded_sizes = nullptr; // padded: [num_segments] align_up(size_g, pad) (summing to at most K)
};

}  // namespace wgrad::quant
