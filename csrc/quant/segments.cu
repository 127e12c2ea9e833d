// \brief Host entries of the MoE segments casts (column-wise, blocks restarting at every segment of rows;
// padded: every segment's q_t columns padded to a multiple of `pad`): the plan of a call (quant/plan.h) and
// the launch of its kernel: the carried-sectors kernel (kernels/quant/segments_carry.cuh), the persistent TMA
// kernel (kernels/quant/colwise_kernel_sm90.cuh, with packed tiles or block tiles in some order), or the generic
// kernel for rows that are not 16-byte aligned.
#include "ops.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "checks.h"
#include "kernels/common/dynamic_smem.h"
#include "kernels/quant/segment_order.h"
#include "kernels/quant/segment_table.cuh"
#include "kernels/quant/segments_carry.cuh"
#include "quant/colwise_launch.h"
#include "quant/launch.h"
#include "quant/plan.h"

namespace wgrad {

namespace {

constexpr int64_t kMaxRowBlocks = std::numeric_limits<int32_t>::max();  // gridDim.x of the generic kernel

// ---- the carried-sectors kernel ---------------------------------------------------------------------------

// The dynamic tail's counter for a launch on `stream`: 0 when the launch starts, and every launch leaves it
// at 0. Outside graph capture, one counter per (device, stream) (launches on one stream run one after the
// other; launches on two streams use two counters), made once and zeroed on its stream. In a graph
// being captured, a buffer of the call's own, set to 0 by a memset node before the kernel's (a graph may be
// replayed on any stream, beside eager calls). `keep` holds that buffer until the launch is enqueued.
int32_t* carry_counter(const torch::stable::Tensor& x, cudaStream_t stream, torch::stable::Tensor& keep) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  WGRAD_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    keep = empty_1d(x, 1, ScalarType::Int);
    WGRAD_CUDA_CHECK(cudaMemsetAsync(keep.mutable_data_ptr<int32_t>(), 0, sizeof(int32_t), stream));
    return keep.mutable_data_ptr<int32_t>();
  }
  // A thread's last (device, stream) skips the lock and the map: a training step casts on one stream.
  struct Last {
    int device = -1;
    cudaStream_t stream = nullptr;
    int32_t* counter = nullptr;
  };
  thread_local Last last;
  const int device = x.get_device_index();
  if (last.counter != nullptr && last.device == device && last.stream == stream) return last.counter;
  static std::mutex mutex;
  // (Never freed: a tensor destroyed after the CUDA runtime at exit would crash; so `last` never dangles.)
  static auto* counters = new std::map<std::pair<int, cudaStream_t>, torch::stable::Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  torch::stable::Tensor& counter = (*counters)[{device, stream}];
  if (!counter.defined()) {
    counter = empty_1d(x, 1, ScalarType::Int);
    WGRAD_CUDA_CHECK(cudaMemsetAsync(counter.mutable_data_ptr<int32_t>(), 0, sizeof(int32_t), stream));
  }
  last = {device, stream, counter.mutable_data_ptr<int32_t>()};
  return last.counter;
}

// Whether the carry kernel can take the cast: 16-bit x with 16-byte aligned rows (its 16-byte loads), at most
// kMaxWarpSegments segments (its warps' table build), a table that fits its shared memory, C < 2^22 (its
// 32-bit offsets).
template <typename T>
bool carry_kernel_fits(const quant::QuantizeParams& p, const quant::SegmentTableArgs& segments, bool vec) {
  using Cfg = quant::SegmentsCarryConfig;
  return sizeof(T) == 2 && vec && p.rows > 0 && segments.num_segments <= quant::kMaxWarpSegments &&
         segments.num_row_blocks <= Cfg::kMaxTableEntries && p.cols <= Cfg::kMaxCols;
}

// kCtasPerSm CTAs per SM, each one contiguous range of the tiles (segments_carry.cuh), with or without the
// dynamic tail (carry_tail_max_remainder).
template <typename T>
void launch_segments_carry(const torch::stable::Tensor& x, const quant::QuantizeParams& p,
                           const quant::SegmentTableArgs& segments, const SegmentsPlan& plan, int num_sms,
                           cudaStream_t stream) {
  using Cfg = quant::SegmentsCarryConfig;
  auto kernel = &quant::quantize_fp8_1x128_segments_carry_kernel<T>;
  const int smem_bytes = Cfg::smem_bytes(segments.num_row_blocks);
  WGRAD_CUDA_CHECK(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem_bytes));
  // Every CTA of the grid is resident at once (none waits for another to finish), without asking the driver:
  // the launch bounds keep the registers within 65536 / (kThreads * kCtasPerSm), and kCtasPerSm CTAs of the
  // largest table's shared memory, plus the 1 KB the SM reserves per CTA, fit in an SM90 SM's 228 KB.
  static_assert(Cfg::kCtasPerSm * (Cfg::smem_bytes(Cfg::kMaxTableEntries) + 1024) <= 228 * 1024,
                "kCtasPerSm CTAs of the largest table fit in one SM's shared memory");
  const unsigned grid = static_cast<unsigned>(num_sms * Cfg::kCtasPerSm);
  quant::CarryDynamic dyn;
  torch::stable::Tensor keep;  // (a counter of the call's own, in graph capture)
  if (const std::optional<int32_t> max_remainder = carry_tail_max_remainder(plan, grid)) {
    dyn.max_remainder = *max_remainder;
    dyn.counter = carry_counter(x, stream, keep);
  }
  kernel<<<grid, Cfg::kThreads, smem_bytes, stream>>>(p, segments, dyn);
  WGRAD_KERNEL_LAUNCH_CHECK();
}

// ---- the persistent TMA kernel ----------------------------------------------------------------------------

// The segments kernel's automatic tile order, tabulated here for every count of used row blocks B the
// sizes can give (B in [ceil(R / 128), floor((R + 127 G) / 128)]: at most G + 1 values), instead of being
// chosen by every CTA at its start: that choice cost ~0.5-1.4 us per launch (the same order forced ran 1-5
// points of a copy faster on the small shapes). Cached per thread for the last shape (a training step
// casts the same shapes again and again).
void tabulate_auto_strips(quant::ColwiseSm90Params& params, int64_t grid, int groups) {
  struct Table {
    int64_t rows = -1, segments = -1, col_tiles = -1, grid = -1;
    int groups = -1;
    int32_t first = 0, count = 0;
    int8_t strips[2][quant::kMaxWarpSegments + 1] = {};  // [0] some start inside a 16-byte chunk, [1] none
  };
  thread_local Table cached;
  const int64_t rows = params.segments.rows, segments = params.segments.num_segments;
  if (cached.rows != rows || cached.segments != segments || cached.col_tiles != params.num_col_tiles ||
      cached.grid != grid || cached.groups != groups) {
    Table t;
    t.rows = rows;
    t.segments = segments;
    t.col_tiles = params.num_col_tiles;
    t.grid = grid;
    t.groups = groups;
    const quant::SegmentBlockRange range = quant::segment_block_range(rows, segments);
    t.first = static_cast<int32_t>(range.first);
    t.count = static_cast<int32_t>(range.last - range.first + 1);
    WGRAD_CHECK(t.count >= 1 && t.count <= quant::kMaxWarpSegments + 1, "internal: ", t.count, " block counts");
    for (int starts16 = 0; starts16 < 2; ++starts16) {
      for (int32_t i = 0; i < t.count; ++i) {
        t.strips[starts16][i] = static_cast<int8_t>(quant::auto_segment_strip(
            t.first + i, static_cast<int32_t>(t.col_tiles), static_cast<int32_t>(grid) * groups, groups,
            starts16 != 0));
      }
    }
    cached = t;
  }
  params.auto_strip_first = cached.first;
  params.auto_strip_count = cached.count;
  for (int starts16 = 0; starts16 < 2; ++starts16) {
    std::copy(cached.strips[starts16], cached.strips[starts16] + cached.count, params.auto_strips[starts16]);
  }
}

// Whether a segments cast with block tiles takes the kernel without strips (SegmentTiles::kRowMajorBlocks: no
// carries, handoffs or order choice compiled in), which walks them in row-major order whatever the sizes: a
// plan's order 1; one segment, or segments padded to whole 32-byte sectors (no block starts inside a
// sector, so the automatic order is row-major); or the automatic order (auto_segment_strip, the rule of the
// host's table and of the kernel) row-major at the typical count of used blocks (typical_segment_blocks in
// segment_order.h) for both kinds of segment starts. (Invalid sizes give no tiles, whatever the order.)
bool row_major_segments(const quant::ColwiseSm90Params& params, int64_t rows, int64_t segments, int64_t grid,
                        int groups) {
  if (params.segment_order >= 0) return params.segment_order == 1;
  if (segments == 1 || (params.q.seg_pad > 0 && params.q.seg_pad % 32 == 0)) return true;
  // (32-bit: the launch's tiles, B times the column tiles, are fewer than 2^31.)
  const auto blocks = static_cast<int32_t>(quant::typical_segment_blocks(rows, segments));
  const auto col_tiles = static_cast<int32_t>(params.num_col_tiles);
  const auto workers = static_cast<int32_t>(grid * groups);
  return quant::auto_segment_strip(blocks, col_tiles, workers, groups, false) == 1 &&
         quant::auto_segment_strip(blocks, col_tiles, workers, groups, true) == 1;
}

// The persistent TMA kernel on the segments: packed tiles (kPacked: unpadded, the table built in the kernel),
// or block tiles in the plan's order, by the kernel without strips when that order is known to be row-major
// before the launch (row_major_segments). `in_kernel`: the segment table's arguments when every CTA builds
// it in shared memory (sizes == nullptr: p.row_blocks is a table in global memory).
template <typename T, bool kPacked>
void launch_segments_tma(const char* op, const quant::QuantizeParams& p, int64_t row_blocks,
                         const quant::SegmentTableArgs& in_kernel, int64_t num_segments, const SegmentsPlan& plan,
                         int num_sms, cudaStream_t stream) {
  constexpr quant::QuantMode kMode = quant::QuantMode::ColwiseSegments;
  constexpr quant::SegmentTiles kTiles = kPacked ? quant::SegmentTiles::kPacked : quant::SegmentTiles::kBlocks;
  using Cfg = quant::ColwiseSm90Config<T, kMode, kTiles>;
  quant::ColwiseSm90Params params = colwise_sm90_params<Cfg, T>(op, p, row_blocks);
  params.segments = in_kernel;
  params.segment_order = plan.order;
  params.segment_shared = plan.shared_order;
  const int64_t grid = colwise_sm90_grid(params, num_sms);
  if constexpr (!kPacked) {
    // (The row-major kernel has no order to choose: the host's table of the automatic order is for the other.)
    if (row_major_segments(params, p.rows, num_segments, grid, Cfg::kGroups)) {
      using RowMajorCfg = quant::ColwiseSm90Config<T, kMode, quant::SegmentTiles::kRowMajorBlocks>;
      static_assert(sizeof(typename RowMajorCfg::SharedStorage) <= sizeof(typename Cfg::SharedStorage),
                    "the row-major kernel's storage fits wherever the other's does");
      launch_colwise_sm90<RowMajorCfg>(
          &quant::quantize_fp8_1x128_colwise_sm90_kernel<T, kMode, quant::SegmentTiles::kRowMajorBlocks>, grid,
          params, stream);
      return;
    }
    if (params.segment_order < 0 && in_kernel.sizes != nullptr && in_kernel.num_segments <= quant::kMaxWarpSegments) {
      tabulate_auto_strips(params, grid, Cfg::kGroups);
    }
  }
  launch_colwise_sm90<Cfg>(&quant::quantize_fp8_1x128_colwise_sm90_kernel<T, kMode, kTiles>, grid, params, stream);
}

// Both over padded segments (QuantMode::BothSegments): the row-wise outputs and the column-wise segments from one
// read of x, by the row-major block-tile kernel (segments padded to whole 32-byte sectors are row-major), the
// table built in the kernel.
template <typename T>
void launch_both_segments_tma(const char* op, const quant::QuantizeParams& p, int64_t row_blocks,
                              const quant::SegmentTableArgs& in_kernel, int num_sms, cudaStream_t stream) {
  constexpr quant::QuantMode kMode = quant::QuantMode::BothSegments;
  constexpr quant::SegmentTiles kTiles = quant::SegmentTiles::kRowMajorBlocks;
  using Cfg = quant::ColwiseSm90Config<T, kMode, kTiles>;
  quant::ColwiseSm90Params params = colwise_sm90_params<Cfg, T>(op, p, row_blocks);
  params.segments = in_kernel;
  launch_colwise_sm90<Cfg>(&quant::quantize_fp8_1x128_colwise_sm90_kernel<T, kMode, kTiles>,
                           colwise_sm90_grid(params, num_sms), params, stream);
}

// The segment table in global memory (one-CTA kernel), for the kernels that cannot build it themselves.
// Returns the workspace that holds it (alive until the launches that read it are enqueued).
torch::stable::Tensor build_segment_table_global(const torch::stable::Tensor& x, const quant::SegmentTableArgs& a,
                                                 quant::QuantizeParams& p, cudaStream_t stream) {
  constexpr int64_t kInts = sizeof(quant::RowBlock) / sizeof(int32_t);
  static_assert(sizeof(quant::RowBlock) == kInts * sizeof(int32_t) &&
                sizeof(quant::SegmentStart) == sizeof(quant::RowBlock));
  torch::stable::Tensor workspace = empty_1d(x, kInts * (a.num_row_blocks + a.num_segments), ScalarType::Int);
  auto* table = reinterpret_cast<quant::RowBlock*>(workspace.mutable_data_ptr<int32_t>());
  auto* seg = reinterpret_cast<quant::SegmentStart*>(table + a.num_row_blocks);
  quant::build_segment_table_kernel<<<1, quant::kTableThreads, 0, stream>>>(a, seg, table);
  WGRAD_KERNEL_LAUNCH_CHECK();
  p.row_blocks = table;
  return workspace;
}

// Every segments cast: the carry kernel where the plan takes it, else the TMA kernel (packed tiles where the
// plan takes them) for 16-byte aligned rows and R > 0, else the generic kernel; the table built in the TMA
// kernel when it fits there, else in global memory first. With row-wise outputs in p (p.q set: both over
// padded segments), one kernel for both where the row-major TMA kernel takes the cast with its table in
// shared memory (16-byte aligned rows, R > 0, pad a multiple of 32, the automatic plan); elsewhere the
// row-wise kernel first, then the column-wise cast as above (the same bits either way).
void launch_segments(const char* op, const torch::stable::Tensor& x, const quant::QuantizeParams& p_in,
                     int64_t row_blocks, const quant::SegmentTableArgs& segments, const SegmentsPlan& plan,
                     cudaStream_t stream) {
  quant::QuantizeParams p = p_in;
  const int num_sms = num_sms_of(x);
  const bool vec = vector_rows(p);
  torch::stable::Tensor workspace;
  dispatch_x_type(x, [&](auto tag) {
    using T = decltype(tag);
    constexpr quant::QuantMode kMode = quant::QuantMode::ColwiseSegments;
    if (p.q != nullptr) {
      constexpr int64_t kBothEntries =
          quant::ColwiseSm90Config<T, quant::QuantMode::BothSegments, quant::SegmentTiles::kRowMajorBlocks>::
              kTableEntries;
      const bool fused = vec && p.rows > 0 && p.seg_pad > 0 && p.seg_pad % 32 == 0 && plan.order < 0 &&
                         segments.num_row_blocks + segments.num_segments <= kBothEntries;
      if (fused) {
        launch_both_segments_tma<T>(op, p, row_blocks, segments, num_sms, stream);
        return;
      }
      launch_rowwise_cast(x, p, stream);
      p.q = nullptr;
      p.scales = nullptr;
    }
    if (carry_kernel_fits<T>(p, segments, vec) &&
        take_carry_kernel(plan, p.rows, p.cols, segments.num_segments, p.seg_pad)) {
      if constexpr (sizeof(T) == 2) launch_segments_carry<T>(x, p, segments, plan, num_sms, stream);
      return;
    }
    // R == 0 (only unused scale columns to zero) has no TMA view of x: the generic kernel.
    const bool column_kernel = vec && p.rows > 0;
    constexpr int64_t kEntries = quant::ColwiseSm90Config<T, kMode>::kTableEntries;
    constexpr int64_t kPackedEntries =
        quant::ColwiseSm90Config<T, kMode, quant::SegmentTiles::kPacked>::kTableEntries;
    static_assert(kPackedEntries <= kEntries, "a table that packed tiles take is built in the kernel");
    const int64_t entries = segments.num_row_blocks + segments.num_segments;
    quant::SegmentTableArgs in_kernel{};  // sizes == nullptr: no table to build in the kernel
    if (column_kernel && entries <= kEntries) {
      in_kernel = segments;
    } else {
      workspace = build_segment_table_global(x, segments, p, stream);
    }
    if (!column_kernel) {
      launch_generic<kMode, T>(p, row_blocks, stream);
    } else if (p.seg_pad == 0 && entries <= kPackedEntries && take_packed_tiles(plan, p.rows, segments.num_segments)) {
      launch_segments_tma<T, true>(op, p, row_blocks, in_kernel, segments.num_segments, plan, num_sms, stream);
    } else {
      launch_segments_tma<T, false>(op, p, row_blocks, in_kernel, segments.num_segments, plan, num_sms, stream);
    }
  });
}

// The unpadded cast (pad 0) or the padded one. Sizes stay on the device: the kernels validate them and work
// out the row range of every scale column (for tables of more than 768 (fp32) or 3072 entries, and for the
// generic kernel, a one-CTA kernel in global memory first), then quantize all k_block_capacity(K, G)
// columns (no host synchronisation, capturable in a CUDA graph). Invalid sizes (a negative one, or a sum !=
// R): every scale is NaN and q_t is not written (padded: the padded sizes are meaningless then).
// `rowwise`: also the row-wise cast of x into q and scales (R == 0 or C == 0: nothing to write).
struct SegmentsOutputs {
  torch::stable::Tensor q, scales, q_t, scales_t, padded;
};

SegmentsOutputs segments_cast(const char* op, const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                              int64_t pad, bool ue8m0, const SegmentsPlan& plan, bool rowwise = false) {
  check_sm90(op, x);
  const DeviceGuard guard(x.get_device_index());
  const cudaStream_t stream = current_stream(x);
  const int64_t rows = x.size(0), cols = x.size(1), groups = sizes.size(0);
  quant::SegmentTableArgs segments;
  segments.sizes = sizes.const_data_ptr<int32_t>();
  segments.num_segments = groups;
  segments.rows = rows;
  quant::QuantizeParams p = base_params(x, ue8m0);
  SegmentsOutputs o;
  if (rowwise) {
    o.q = empty_q(x);
    o.scales = empty_mn_major_scales(x, rows, ceil_div(cols, kScaleBlockK));
    set_rowwise(p, o.q, o.scales);
  }
  torch::stable::Tensor& q_t = o.q_t;
  torch::stable::Tensor& scales_t = o.scales_t;
  torch::stable::Tensor& padded = o.padded;
  int64_t row_blocks = 0;
  if (pad == 0) {
    row_blocks = k_block_capacity(rows, groups);
    WGRAD_CHECK(row_blocks <= kMaxRowBlocks, op, ": ceil(R/128) + G - 1 must be <= 2^31 - 1, got ", row_blocks);
    q_t = empty_q_t(x);
    scales_t = empty_mn_major_scales(x, cols, row_blocks);
    if (row_blocks == 0 || cols == 0) return o;
  } else {
    // Every segment's q_t columns padded to a multiple of `pad` with zero columns (and the columns after the
    // last segment zero too): q_t [C, K] with K = padded_segment_columns(R, G, pad), scales [C, ceil(K/128) +
    // G - 1], and the padded sizes (int32 [G] on the device: align_up(size_g, pad)) that the k-grouped
    // contiguous-K GEMM takes with them; it does not read the zero columns past their sum. Zero columns add
    // nothing to a GEMM, so any token counts work end to end; with pad >= 32 every block starts on a 32-byte
    // sector of q_t (the fast store path).
    const int64_t k = padded_segment_columns(rows, groups, pad);
    WGRAD_CHECK(k <= std::numeric_limits<int32_t>::max(), op, ": R + G (pad - 1) must be < 2^31, got ", k);
    row_blocks = k_block_capacity(k, groups);
    WGRAD_CHECK(row_blocks <= kMaxRowBlocks, op, ": ceil(K/128) + G - 1 must be <= 2^31 - 1, got ", row_blocks);
    const int64_t q_t_ld = align_up(k > 0 ? k : 1, kQtRowAlign);
    const torch::stable::Tensor q_t_rows = empty_2d(x, cols, q_t_ld, ScalarType::Float8_e4m3fn);
    if (rows == 0) {  // no block of x to write the zero columns (and padding)
      WGRAD_CUDA_CHECK(cudaMemsetAsync(q_t_rows.mutable_data_ptr(), 0, cols * q_t_ld, stream));
    }
    q_t = as_strided(q_t_rows, {cols, k}, {q_t_ld, 1});
    scales_t = empty_mn_major_scales(x, cols, row_blocks);
    padded = empty_1d(sizes, groups, ScalarType::Int);
    segments.pad = pad;
    segments.padded_sizes = padded.mutable_data_ptr<int32_t>();  // written by the segment table's builder
    segments.num_row_blocks = row_blocks;
    if (row_blocks == 0 || cols == 0) {  // no cast to launch: the one-CTA table kernel alone writes padded
      build_segment_table_global(x, segments, p, stream);
      return o;
    }
    p.seg_pad = pad;
  }
  segments.num_row_blocks = row_blocks;
  set_colwise(p, q_t, scales_t);
  launch_segments(op, x, p, row_blocks, segments, plan, stream);
  return o;
}

}  // namespace

std::tuple<torch::stable::Tensor, torch::stable::Tensor> quantize_fp8_1x128_colwise_segments_cuda(
    const torch::stable::Tensor& x, const torch::stable::Tensor& sizes, bool ue8m0) {
  check_quantize_fp8_1x128_segments(x, sizes);
  const SegmentsOutputs o = segments_cast("quantize_fp8_1x128_colwise_segments", x, sizes, 0, ue8m0, SegmentsPlan{});
  return {o.q_t, o.scales_t};
}

std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor>
quantize_fp8_1x128_colwise_segments_padded_cuda(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                                int64_t pad, bool ue8m0) {
  check_quantize_fp8_1x128_segments_padded(x, sizes, pad);
  const SegmentsOutputs o =
      segments_cast("quantize_fp8_1x128_colwise_segments_padded", x, sizes, pad, ue8m0, SegmentsPlan{});
  return {o.q_t, o.scales_t, o.padded};
}

std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor,
           torch::stable::Tensor>
quantize_fp8_1x128_both_segments_padded_cuda(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                             int64_t pad, bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_both_segments_padded";
  check_quantize_fp8_1x128_both_segments_padded(x, sizes, pad);
  const SegmentsOutputs o = segments_cast(op, x, sizes, pad, ue8m0, SegmentsPlan{}, true);
  return {o.q, o.scales, o.q_t, o.scales_t, o.padded};
}

std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor>
quantize_fp8_1x128_colwise_segments_with_plan_cuda(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                                   int64_t pad, bool ue8m0, std::string_view plan) {
  const SegmentsPlan parsed = parse_segments_plan("_quantize_fp8_1x128_colwise_segments_with_plan", std::string(plan));
  if (pad == 0) {
    check_quantize_fp8_1x128_segments(x, sizes);
    const SegmentsOutputs o = segments_cast("quantize_fp8_1x128_colwise_segments", x, sizes, 0, ue8m0, parsed);
    return {o.q_t, o.scales_t, clone(sizes)};
  }
  check_quantize_fp8_1x128_segments_padded(x, sizes, pad);
  const SegmentsOutputs o = segments_cast("quantize_fp8_1x128_colwise_segments_padded", x, sizes, pad, ue8m0, parsed);
  return {o.q_t, o.scales_t, o.padded};
}

}  // namespace wgrad
