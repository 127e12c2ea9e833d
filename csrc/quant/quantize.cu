// \brief Host entries of the FP8 1x128 quantization ops: checks, output allocation in the layouts the GEMMs
// take (see the contract in registration.cpp), launch. Device code: kernels/quantize.cuh.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <type_traits>

#include "checks.h"
#include "kernels/quant/quantize.cuh"
#include "kernels/quant/colwise_sm90.cuh"
#include "kernels/quant/rowwise.cuh"
#include "kernels/quant/segments_carry.cuh"
#include "kernels/gemm/tile_config.h"
#include "kernels/common/tma_descriptor.h"
#include "ops.h"

namespace wgrad {

namespace {

using quant::QuantizeParams;
using quant::QuantMode;

constexpr int64_t kQtRowAlign = 16;            // q_t rows are TMA-ready: 16-byte row stride
constexpr int64_t kVecElems = 8;               // one thread's columns: one aligned vector access
constexpr int64_t kMaxRowBlocks = std::numeric_limits<int32_t>::max();  // gridDim.x
constexpr int64_t kMaxColTiles = 65535;                                 // gridDim.y

void check_x(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [R, C] (the Python layer flattens leading dims), got ", x.dim(),
              "-D ", x.sizes());
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kBFloat16 || dt == at::kHalf || dt == at::kFloat, op,
              ": x must be bfloat16, float16 or float32, got ", dt);
  TORCH_CHECK(x.is_contiguous(), op, ": x must be contiguous (row-major [R, C]), got strides ", x.strides(),
              " for shape ", x.sizes());
  TORCH_CHECK(x.size(0) <= std::numeric_limits<int32_t>::max(), op, ": x must have at most 2^31 - 1 rows, got ",
              x.size(0));
  TORCH_CHECK(ceil_div(x.size(1), kScaleBlockK) <= kMaxColTiles, op, ": x must have at most ",
              kMaxColTiles * kScaleBlockK, " columns (one CTA per 128), got ", x.size(1));
}

void check_sizes(const char* op, const at::Tensor& x, const at::Tensor& sizes) {
  TORCH_CHECK(sizes.scalar_type() == at::kInt, op, ": sizes must be int32, got ", sizes.scalar_type());
  TORCH_CHECK(sizes.dim() == 1, op, ": sizes must be 1-D [G], got ", sizes.dim(), "-D ", sizes.sizes());
  TORCH_CHECK(sizes.size(0) >= 1, op, ": sizes must name at least one segment, got an empty tensor");
  TORCH_CHECK(sizes.is_contiguous(), op, ": sizes must be contiguous, got strides ", sizes.strides());
  TORCH_CHECK(sizes.device() == x.device(), op, ": sizes must be on ", x.device(), " like x, got ", sizes.device());
  if (sizes.device().is_cpu()) {
    // On the CPU the values can be read without a synchronisation; on CUDA the kernel validates them.
    const int32_t* s = sizes.const_data_ptr<int32_t>();
    int64_t sum = 0;
    for (int64_t g = 0; g < sizes.size(0); ++g) {
      TORCH_CHECK(s[g] >= 0, op, ": sizes[", g, "] must be >= 0, got ", s[g]);
      sum += s[g];
    }
    TORCH_CHECK(sum == x.size(0), op, ": sum(sizes) must equal the rows of x, R = ", x.size(0), ", got ", sum);
  }
}

void check_pad(const char* op, int64_t pad) {
  TORCH_CHECK(pad == 16 || pad == 32 || pad == 64 || pad == 128, op, ": pad must be 16, 32, 64 or 128, got ", pad);
}

// [mn, kb] float32 in the TMA-aligned MN-major layout: (m, kb) at kb * scale_ld(mn) + m.
at::Tensor empty_mn_major_scales(const at::Tensor& like, int64_t mn, int64_t kb) {
  return at::empty({kb, scale_ld(mn)}, like.options().dtype(at::kFloat)).narrow(1, 0, mn).t();
}

// [C, R] float8_e4m3fn with row stride align_up(R, 16) (R.. are padding, written as 0 by the kernels).
at::Tensor empty_q_t(const at::Tensor& x) {
  const int64_t r = x.size(0), c = x.size(1);
  return at::empty({c, align_up(r > 0 ? r : 1, kQtRowAlign)}, x.options().dtype(at::kFloat8_e4m3fn))
      .narrow(1, 0, r);
}

at::Tensor empty_q(const at::Tensor& x) { return at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn)); }

template <typename T>
constexpr CUtensorMapDataType tma_dtype() {
  if constexpr (std::is_same_v<T, float>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  else if constexpr (std::is_same_v<T, __half>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  else return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// A TMA descriptor of x [rows, cols] (rows `pitch` elements apart, 16-byte aligned) with boxes of box_cols x
// box_rows elements, no swizzle, into *map; a failure is an error that starts with `what`.
template <typename T>
void encode_x_descriptor(CUtensorMap* map, const void* x, int64_t rows, int64_t cols, int64_t pitch, int box_cols,
                         int box_rows, const char* what) {
  const std::string err = encode_matrix_descriptor(map, tma_dtype<T>(), sizeof(T), x, rows, cols, pitch, box_cols,
                                                   box_rows);
  TORCH_CHECK(err.empty(), what, ": TMA descriptor of x: ", err);
}

// Most CTAs per SM of the row-wise grid. Default: no limit, one pass of every slot per CTA (the CTA
// scheduler hands out the rest as CTAs finish, which evens out the last wave); measured 1-5 % faster
// than a persistent grid of 4 CTAs per SM on the small seed shapes (docs/perf-notes.md). The tuning
// knob WGRAD_ROWWISE_CTAS_PER_SM (read at every call, so that a sweep can change it) caps it; 0 = no cap.
int64_t rowwise_ctas_per_sm() {
  int64_t n = 0;
  if (const char* v = std::getenv("WGRAD_ROWWISE_CTAS_PER_SM")) {
    n = std::strtol(v, nullptr, 10);
    TORCH_CHECK(n >= 0 && n <= 1024, "WGRAD_ROWWISE_CTAS_PER_SM must be in [0, 1024], got '", v, "'");
  }
  return n == 0 ? std::numeric_limits<int32_t>::max() : n;
}

// The tile order of the segments kernel (TileOrder in colwise_sm90.cuh): -1 lets the kernel
// choose (choose_segment_order), 0 one contiguous range of blocks per consumer group or (shared) per CTA,
// S >= 1 strips of S consecutive blocks dealt round-robin (1: row-major), per consumer group or (shared)
// per CTA, whose groups take the strip's or range's blocks in turn. Tuning knob WGRAD_SEGMENT_ORDER = auto
// (or unset) | ranges | cranges (shared ranges) | S | cS (shared strips; S from 1 to 64), read at every
// call; the result is the same bits whatever the order.
struct SegmentOrderKnob {
  int order;
  bool shared;
};
SegmentOrderKnob segment_order_knob() {
  const char* v = std::getenv("WGRAD_SEGMENT_ORDER");
  if (v == nullptr || std::strcmp(v, "auto") == 0) return {-1, false};
  if (std::strcmp(v, "ranges") == 0) return {0, false};
  if (std::strcmp(v, "cranges") == 0) return {0, true};
  const bool shared = v[0] == 'c';
  long n = 0;
  TORCH_CHECK(parse_knob_int(v + (shared ? 1 : 0), &n) && n >= 1 && n <= 64,
              "WGRAD_SEGMENT_ORDER must be auto, ranges, cranges or a strip length in [1, 64] (cN: shared strips), "
              "got '", v, "'");
  return {static_cast<int>(n), shared};
}

// Packed tiles for the segments cast (build_packed_tiles in colwise_sm90.cuh: consecutive short
// blocks share a tile), for unpadded casts whose table fits in the kernel. Knob WGRAD_SEGMENTS_PACKED, read
// at every call: 0 never, 1 always, auto (or unset: the default) at kPackedMaxRowsPerSegment rows per segment
// or fewer on average, where they were faster in every cell measured (docs/perf-notes.md, session 22, % of a
// copy, packed / not: 4096 x 7168 with 256 segments 32.9 / 16.3, 64 segments 44.0 / 41.2; 16384 x 7168 with
// 256 segments 43.7 / 41.8) and one tile per block is faster above (16384 x 7168 with 128 segments 42.2 /
// 55.7).
constexpr int64_t kPackedMaxRowsPerSegment = 64;
bool want_packed_tiles(int64_t rows, int64_t segments) {
  const char* v = std::getenv("WGRAD_SEGMENTS_PACKED");
  if (v == nullptr || std::strcmp(v, "auto") == 0) return rows <= kPackedMaxRowsPerSegment * segments;
  if (std::strcmp(v, "0") == 0) return false;
  if (std::strcmp(v, "1") == 0) return true;
  TORCH_CHECK(false, "WGRAD_SEGMENTS_PACKED must be 0, 1 or auto, got '", v, "'");
  return false;
}

// CTAs of the persistent column kernel for `tiles` tiles, `groups` consumer groups per CTA. Default
// ("full"): one per SM. "even": the fewest CTAs that give no group more tiles than the full grid does
// (e.g. 8192 x 2112: 1088 tiles, 132 x 3 groups take at most 3 each; 121 CTAs do the same with every
// group busy to the end). N: at most N. Tuning knob WGRAD_COLWISE_GRID, read at every call.
int64_t colwise_grid(int64_t tiles, int groups, int num_sms) {
  const int64_t full = std::min<int64_t>(tiles, num_sms);
  const char* v = std::getenv("WGRAD_COLWISE_GRID");
  if (v == nullptr || std::strcmp(v, "full") == 0) return full;
  if (std::strcmp(v, "even") == 0) {
    const int64_t rounds = ceil_div(tiles, full * groups);  // most tiles of a group
    return ceil_div(tiles, rounds * groups);
  }
  long n = 0;
  TORCH_CHECK(parse_knob_int(v, &n) && n >= 1, "WGRAD_COLWISE_GRID must be full, even or a CTA count >= 1, got '",
              v, "'");
  return std::min<int64_t>(full, n);
}

// The kernel of the segments cast with 16-bit x, at most kMaxWarpSegments segments and a table of at most
// SegmentsCarryConfig<128, 8>::kMaxTableEntries entries: "carry" (segments_carry.cuh: every shared
// sector written whole), "tma" (the persistent TMA kernel of the other casts) or "auto": unpadded (pad 0),
// carry where carry_kernel_by_default measured it faster (two or more segments, R >= 4096, at least 256 rows
// per segment, C >= 2048, R x C >= 2^24); padded, tma (the carry kernel's padded form, built in session 36
// without a GPU, is not measured yet). Knob WGRAD_SEGMENT_KERNEL, read at every call; default auto.
bool want_segments_carry(int64_t rows, int64_t cols, int64_t segments, int64_t pad) {
  const char* v = std::getenv("WGRAD_SEGMENT_KERNEL");
  if (v == nullptr || std::strcmp(v, "auto") == 0) {
    return pad == 0 && quant::carry_kernel_by_default(rows, cols, segments);
  }
  if (std::strcmp(v, "tma") == 0) return false;
  if (std::strcmp(v, "carry") == 0) return true;
  TORCH_CHECK(false, "WGRAD_SEGMENT_KERNEL must be auto, carry or tma, got '", v, "'");
  return false;
}

// The carry kernel's tile: columns x rows per thread (SegmentsCarryConfig), "128x8", "64x8" or "64x4"; knob
// WGRAD_CARRY_TILE, read at every call; default 128x8. (Others only where the segment table fits their
// shared memory, else 128x8.)
enum class CarryTile { k128x8, k64x8, k64x4 };
CarryTile carry_tile() {
  const char* v = std::getenv("WGRAD_CARRY_TILE");
  if (v == nullptr || std::strcmp(v, "128x8") == 0) return CarryTile::k128x8;
  if (std::strcmp(v, "64x8") == 0) return CarryTile::k64x8;
  if (std::strcmp(v, "64x4") == 0) return CarryTile::k64x4;
  TORCH_CHECK(false, "WGRAD_CARRY_TILE must be 128x8, 64x8 or 64x4, got '", v, "'");
  return CarryTile::k128x8;
}

// The carry kernel's dynamic tail (CarryDynamic, carry_split) for a grid of `ctas` CTAs, without its counter:
// "auto" (the default: the remainder tiles % CTAs from the counter, one at a time, when it is at most half the
// CTAs; else one range per CTA), "off" (one range per CTA: nullopt), or "BACK:CHUNK" (always: static ranges of
// tiles / CTAs - BACK tiles, the rest from the counter in runs of CHUNK tiles). Knob WGRAD_CARRY_DYNAMIC, read
// at every call.
std::optional<quant::CarryDynamic> carry_dynamic_knob(unsigned ctas) {
  const char* v = std::getenv("WGRAD_CARRY_DYNAMIC");
  quant::CarryDynamic d;
  if (v == nullptr || std::strcmp(v, "auto") == 0) {
    d.max_remainder = static_cast<int32_t>(ctas / 2);
    return d;
  }
  if (std::strcmp(v, "off") == 0) return std::nullopt;
  const char* colon = std::strchr(v, ':');
  long back = -1, chunk = 0;
  const bool ok = colon != nullptr && parse_knob_int(std::string(v, colon).c_str(), &back) &&
                  parse_knob_int(colon + 1, &chunk) && back >= 0 && back <= 64 && chunk >= 1 && chunk <= 64;
  TORCH_CHECK(ok, "WGRAD_CARRY_DYNAMIC must be auto, off or BACK:CHUNK (0-64, 1-64), got '", v, "'");
  d.back = static_cast<int32_t>(back);
  d.chunk = static_cast<int32_t>(chunk);
  d.max_remainder = std::numeric_limits<int32_t>::max();
  return d;
}

// The carry kernel's L2 prefetch before its table (carry_prefetch_guess, CarryPrefetch): the first N tiles of
// the walk every CTA most likely takes, guessed from R, C and the count of segments, N in 0-4, asked a row at a
// time ("N") or a TMA box per tile ("boxN"). Knob WGRAD_CARRY_PREFETCH, read at every call; default 0 (none)
// until measured (docs/perf-notes.md, sessions 35-36).
// Returns the tiles and the form; the caller encodes the descriptor of x where boxes are asked for.
quant::CarryPrefetch carry_prefetch_knob() {
  quant::CarryPrefetch pf{};
  const char* v = std::getenv("WGRAD_CARRY_PREFETCH");
  if (v == nullptr) return pf;
  pf.boxes = std::strncmp(v, "box", 3) == 0;
  long n = -1;
  TORCH_CHECK(parse_knob_int(pf.boxes ? v + 3 : v, &n) && n >= (pf.boxes ? 1 : 0) && n <= 4,
              "WGRAD_CARRY_PREFETCH must be a tile count 0 to 4 or box1 to box4, got '", v, "'");
  pf.tiles = static_cast<int32_t>(n);
  return pf;
}

// The dynamic tail's counter for a launch on `stream`: 0 when the launch starts, and every launch leaves it
// at 0. Outside graph capture, one counter per (device, stream) (launches on one stream run one after the
// other; launches on two streams use two counters), made once with at::zeros on its stream. In a graph
// being captured, a buffer of the call's own, set to 0 by a memset node before the kernel's (a graph may be
// replayed on any stream, beside eager calls). `keep` holds that buffer until the launch is enqueued.
int32_t* carry_counter(const at::Tensor& x, cudaStream_t stream, at::Tensor& keep) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    keep = at::empty({1}, x.options().dtype(at::kInt));
    C10_CUDA_CHECK(cudaMemsetAsync(keep.data_ptr<int32_t>(), 0, sizeof(int32_t), stream));
    return keep.data_ptr<int32_t>();
  }
  // A thread's last (device, stream) skips the lock and the map: a training step casts on one stream.
  struct Last {
    int device = -1;
    cudaStream_t stream = nullptr;
    int32_t* counter = nullptr;
  };
  thread_local Last last;
  const int device = x.get_device();
  if (last.counter != nullptr && last.device == device && last.stream == stream) return last.counter;
  static std::mutex mutex;
  // (Never freed: a tensor destroyed after the CUDA runtime at exit would crash; so `last` never dangles.)
  static auto* counters = new std::map<std::pair<int, cudaStream_t>, at::Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& counter = (*counters)[{device, stream}];
  if (!counter.defined()) counter = at::zeros({1}, x.options().dtype(at::kInt));
  last = {device, stream, counter.data_ptr<int32_t>()};
  return last.counter;
}

// The segments kernel's automatic tile order, tabulated here for every count of used row blocks B the
// sizes can give (B in [ceil(R / 128), floor((R + 127 G) / 128)]: at most G + 1 values), instead of being
// chosen by every CTA at its start: that choice cost ~0.5-1.4 us per launch (the same order forced by
// WGRAD_SEGMENT_ORDER ran 1-5 points of a copy faster on the small shapes; docs/perf-notes.md, session
// 12). Cached per thread for the last shape (a training step casts the same shapes again and again).
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
    TORCH_CHECK(t.count >= 1 && t.count <= quant::kMaxWarpSegments + 1, "internal: ", t.count, " block counts");
    for (int starts16 = 0; starts16 < 2; ++starts16) {
      for (int32_t i = 0; i < t.count; ++i) {
        t.strips[starts16][i] = static_cast<int8_t>(quant::auto_segment_strip(
            t.first + i, static_cast<int32_t>(t.col_tiles), static_cast<int32_t>(grid) * groups, groups, starts16 != 0));
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
// carries, handoffs or order choice compiled in), which walks them in row-major order whatever the sizes: an
// order forced to 1 by WGRAD_SEGMENT_ORDER; one segment, or segments padded to whole 32-byte sectors (no
// block starts inside a sector, so the automatic order is row-major); or the automatic order
// (auto_segment_strip, the rule of the host's table and of the kernel) row-major at the typical count of
// used blocks (typical_segment_blocks in segment_order.h) for both kinds of segment starts. (Invalid sizes
// give no tiles, whatever the order.)
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

// Row-wise: one pass of every slot per CTA (8 CTAs of 256 threads resident per SM for 16-bit x), see above.
template <typename T, bool kVec>
void launch_rowwise(const QuantizeParams& p, int num_sms, cudaStream_t stream) {
  using Cfg = quant::RowwiseConfig;
  const int64_t blocks = p.rows * ceil_div(p.cols, kScaleBlockK);
  const int64_t wanted = ceil_div(blocks, int64_t{Cfg::kBlocksPerCta} * Cfg::kUnroll<T, kVec>);
  const int64_t grid = std::min<int64_t>(wanted, num_sms * rowwise_ctas_per_sm());
  quant::quantize_fp8_1x128_rowwise_kernel<T, kVec><<<static_cast<unsigned>(grid), Cfg::kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Column-wise, both, segments with 16-byte aligned rows: the persistent TMA kernel, one CTA per SM.
// segments.sizes set (ColwiseSegments): every CTA builds the segment table in shared memory; num_segments is
// the cast's segment count G either way (ColwiseSegments; 0 otherwise).
// kPacked (ColwiseSegments, unpadded, table in the kernel): packed tiles (build_packed_tiles). Otherwise the
// segments cast runs block tiles, in row-major order by a kernel of its own (SegmentTiles::kRowMajorBlocks)
// whenever the order is known to be row-major before the launch (row_major_segments).
template <QuantMode kMode, typename T, bool kPacked = false>
void launch_colwise_sm90(const char* op, const QuantizeParams& p, int64_t row_blocks,
                         const quant::SegmentTableArgs& segments, int64_t num_segments, int num_sms,
                         cudaStream_t stream) {
  constexpr quant::SegmentTiles kTiles = kPacked ? quant::SegmentTiles::kPacked : quant::SegmentTiles::kBlocks;
  using Cfg = quant::ColwiseSm90Config<T, kMode, kTiles>;
  quant::ColwiseSm90Params params{};
  params.q = p;
  params.num_row_blocks = row_blocks;
  params.segments = segments;
  const SegmentOrderKnob order =
      kMode == QuantMode::ColwiseSegments ? segment_order_knob() : SegmentOrderKnob{1, false};
  params.segment_order = order.order;
  params.segment_shared = order.shared;
  params.num_col_tiles = ceil_div(p.cols, kScaleBlockK);
#ifdef WGRAD_DIAG_VARIANTS
  // Measurement build only: WGRAD_QUANT_PROBE=1 makes two CTAs print their start-up clock marks, 2 every
  // consumer group its timeline.
  if (const char* v = std::getenv("WGRAD_QUANT_PROBE")) {
    long probe = 0;
    TORCH_CHECK(parse_knob_int(v, &probe) && probe >= 0 && probe <= 2, "WGRAD_QUANT_PROBE must be 0, 1 or 2, got '", v,
                "'");
    params.probe = static_cast<int>(probe);
  }
  // WGRAD_QUANT_DIAG=BITS drops part of the q_t stores (kQuantDiag* of colwise_sm90.cuh): timing only.
  if (const char* v = std::getenv("WGRAD_QUANT_DIAG")) {
    long diag = 0;
    TORCH_CHECK(parse_knob_int(v, &diag) && diag >= 0 && diag <= 255, "WGRAD_QUANT_DIAG must be 0 to 255, got '", v, "'");
    params.diag = static_cast<int>(diag);
  }
#endif
  int64_t x_rows = p.rows, x_pitch = p.cols;
#ifdef WGRAD_DIAG_VARIANTS
  if (params.diag & wgrad::quant::kQuantDiagPaddedPitch) {  // timing only: rows of C + 64 elements, as many as fit in x
    x_pitch = p.cols + 64;
    x_rows = p.rows * p.cols / (p.cols + 64);
  }
#endif
  encode_x_descriptor<T>(&params.tma_x, p.x, x_rows, p.cols, x_pitch, Cfg::kTileCols, Cfg::kBoxRows, op);

  // The kernel and its shared storage (the row-major segments kernel's is smaller: no handoff barriers).
  auto kernel = &quant::quantize_fp8_1x128_colwise_sm90_kernel<T, kMode, kTiles>;
  int smem_bytes = static_cast<int>(sizeof(typename Cfg::SharedStorage));
  static_assert(sizeof(typename Cfg::SharedStorage) <= kSmemBudgetBytes,
                "shared storage exceeds the budget of tile_config.h");
  const int64_t tiles = row_blocks * params.num_col_tiles;
  // The kernel counts tiles in 32 bits (TileOrder). (x would need 2^45 elements to exceed it.)
  TORCH_CHECK(tiles < (int64_t{1} << 31), op, ": x has ", tiles, " tiles of 128 x 128, more than 2^31 - 1");
  const int64_t grid = colwise_grid(tiles, Cfg::kGroups, num_sms);
  if constexpr (kMode == QuantMode::ColwiseSegments && !kPacked) {
    // (The row-major kernel has no order to choose: the host's table of the automatic order is for the other.)
    const bool row_major = row_major_segments(params, p.rows, num_segments, grid, Cfg::kGroups);
    if (!row_major && params.segment_order < 0 && segments.sizes != nullptr &&
        segments.num_segments <= quant::kMaxWarpSegments) {
      tabulate_auto_strips(params, grid, Cfg::kGroups);
    }
    if (row_major) {
      using RowMajorCfg = quant::ColwiseSm90Config<T, kMode, quant::SegmentTiles::kRowMajorBlocks>;
      static_assert(sizeof(typename RowMajorCfg::SharedStorage) <= sizeof(typename Cfg::SharedStorage),
                    "the row-major kernel's storage fits wherever the other's does");
      kernel = &quant::quantize_fp8_1x128_colwise_sm90_kernel<T, kMode, quant::SegmentTiles::kRowMajorBlocks>;
      smem_bytes = static_cast<int>(sizeof(typename RowMajorCfg::SharedStorage));
    }
  }
#ifdef WGRAD_DIAG_VARIANTS
  // Measurement build only: WGRAD_QUANT_SMEM_PAD=BYTES launches with that much more (unused) shared memory,
  // to see what the L1 / shared-memory carve-out costs (docs/perf-notes.md, session 17).
  if (const char* v = std::getenv("WGRAD_QUANT_SMEM_PAD")) {
    long pad = 0;
    TORCH_CHECK(parse_knob_int(v, &pad) && pad >= 0 && pad <= 65536, "WGRAD_QUANT_SMEM_PAD must be 0 to 65536, got '",
                v, "'");
    smem_bytes += static_cast<int>(pad);
  }
#endif
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, smem_bytes, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The segments cast with carried sectors: SegmentsCarryConfig<...>::kCtasPerSm CTAs per SM, each one contiguous
// range of the tiles (segments_carry.cuh); kPadded: the padded cast (p.seg_pad > 0).
template <typename T, int kTileCols, int kRowsPerThread, bool kPadded = false>
void launch_segments_carry(const at::Tensor& x, const QuantizeParams& p, const quant::SegmentTableArgs& segments,
                           int num_sms, cudaStream_t stream) {
  // (launch's vector path: the kernel's 16-byte loads and the prefetches' rows and boxes need aligned rows.)
  TORCH_INTERNAL_ASSERT(p.cols % kVecElems == 0 && reinterpret_cast<uintptr_t>(p.x) % kTmaAlignBytes == 0 &&
                        p.rows > 0);
  using Cfg = quant::SegmentsCarryConfig<kTileCols, kRowsPerThread>;
  auto kernel = &quant::quantize_fp8_1x128_segments_carry_kernel<T, kTileCols, kRowsPerThread, kPadded>;
  const int smem_bytes = Cfg::smem_bytes(segments.num_row_blocks);
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  // Every CTA of the grid is resident at once (none waits for another to finish), without asking the driver:
  // the launch bounds keep the registers within 65536 / (kThreads * kCtasPerSm), and kCtasPerSm CTAs of the
  // largest table's shared memory, plus the 1 KB the SM reserves per CTA, fit in an SM90 SM's 228 KB.
  static_assert(Cfg::kCtasPerSm * (Cfg::smem_bytes(Cfg::kMaxTableEntries) + 1024) <= 228 * 1024,
                "kCtasPerSm CTAs of the largest table fit in one SM's shared memory");
  const unsigned grid = static_cast<unsigned>(num_sms * Cfg::kCtasPerSm);
  // (Both knobs read, and x's box encoded, before anything is queued: a bad value leaves no memset node in a
  // graph being captured.)
  quant::CarryPrefetch pf = carry_prefetch_knob();
  if (pf.boxes) {
    encode_x_descriptor<T>(&pf.tma_x, p.x, p.rows, p.cols, p.cols, kTileCols, quant::kCarryBlockRows,
                           "WGRAD_CARRY_PREFETCH");
  }
  const std::optional<quant::CarryDynamic> tail = carry_dynamic_knob(grid);
  quant::CarryDynamic dyn;
  at::Tensor keep;  // (a counter of the call's own, in graph capture)
  if (tail) {
    dyn = *tail;
    dyn.counter = carry_counter(x, stream, keep);
  }
  kernel<<<grid, Cfg::kThreads, smem_bytes, stream>>>(p, segments, dyn, pf);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The generic tile kernel: one CTA per (row block, 128-column tile), element-wise accesses.
template <QuantMode kMode, typename T>
void launch_generic(const QuantizeParams& p, int64_t row_blocks, int64_t col_tiles, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(col_tiles));
  quant::quantize_fp8_1x128_kernel<T, kMode><<<grid, quant::kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The segment table in global memory (one-CTA kernel), for the kernels that cannot build it themselves.
// Returns the workspace that holds it (alive until the launches that read it are enqueued).
at::Tensor build_segment_table_global(const at::Tensor& x, const quant::SegmentTableArgs& a, QuantizeParams& p,
                                      cudaStream_t stream) {
  constexpr int64_t kInts = sizeof(quant::RowBlock) / sizeof(int32_t);
  static_assert(sizeof(quant::RowBlock) == kInts * sizeof(int32_t) && sizeof(quant::SegmentStart) == sizeof(quant::RowBlock));
  at::Tensor workspace = at::empty({kInts * (a.num_row_blocks + a.num_segments)}, x.options().dtype(at::kInt));
  auto* table = reinterpret_cast<quant::RowBlock*>(workspace.data_ptr<int32_t>());
  auto* seg = reinterpret_cast<quant::SegmentStart*>(table + a.num_row_blocks);
  quant::build_segment_table_kernel<<<1, quant::kTableThreads, 0, stream>>>(a, seg, table);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  p.row_blocks = table;
  return workspace;
}

// Row blocks: 128-row blocks, or the scale columns of the segment table (ColwiseSegments, whose segments
// are given). Vector paths when every row of x is 16-byte aligned (C % 8 == 0 and an aligned base);
// otherwise element-wise accesses.
template <QuantMode kMode>
void launch(const char* op, const at::Tensor& x, const QuantizeParams& p_in, int64_t row_blocks,
            const quant::SegmentTableArgs& segments = {}) {
  const int64_t col_tiles = ceil_div(p_in.cols, kScaleBlockK);
  if (row_blocks == 0 || col_tiles == 0) return;
  QuantizeParams p = p_in;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int num_sms = num_sms_of(x);
  const bool vec = p.cols % kVecElems == 0 && reinterpret_cast<uintptr_t>(p.x) % kTmaAlignBytes == 0;
  at::Tensor workspace;
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kMode == QuantMode::Rowwise) {
      vec ? launch_rowwise<T, true>(p, num_sms, stream) : launch_rowwise<T, false>(p, num_sms, stream);
    } else {
      // R == 0 (segments: only unused scale columns to zero) has no TMA view of x: the generic kernel.
      const bool column_kernel = vec && p.rows > 0;
      quant::SegmentTableArgs in_kernel{};  // sizes == nullptr: no table to build in the kernel
      if constexpr (kMode == QuantMode::ColwiseSegments) {
        constexpr int64_t kEntries = quant::ColwiseSm90Config<T, kMode>::kTableEntries;
        constexpr int64_t kPackedEntries =
            quant::ColwiseSm90Config<T, kMode, quant::SegmentTiles::kPacked>::kTableEntries;
        static_assert(kPackedEntries <= kEntries, "a table that packed tiles take is built in the kernel");
        if constexpr (sizeof(T) == 2) {
          using Carry128 = quant::SegmentsCarryConfig<128, 8>;
          using Carry64x8 = quant::SegmentsCarryConfig<64, 8>;
          using Carry64x4 = quant::SegmentsCarryConfig<64, 4>;
          if (column_kernel && segments.num_segments <= quant::kMaxWarpSegments &&
              segments.num_row_blocks <= Carry128::kMaxTableEntries && p.cols <= Carry128::kMaxCols &&
              want_segments_carry(p.rows, p.cols, segments.num_segments, p.seg_pad)) {
            const CarryTile tile = carry_tile();
            if (p.seg_pad > 0) {  // (padded: the 128 x 8 tile only, whatever WGRAD_CARRY_TILE says)
              launch_segments_carry<T, 128, 8, true>(x, p, segments, num_sms, stream);
            } else if (tile == CarryTile::k64x8 && segments.num_row_blocks <= Carry64x8::kMaxTableEntries) {
              launch_segments_carry<T, 64, 8>(x, p, segments, num_sms, stream);
            } else if (tile == CarryTile::k64x4 && segments.num_row_blocks <= Carry64x4::kMaxTableEntries) {
              launch_segments_carry<T, 64, 4>(x, p, segments, num_sms, stream);
            } else {
              launch_segments_carry<T, 128, 8>(x, p, segments, num_sms, stream);
            }
            return;
          }
        }
        const int64_t entries = segments.num_row_blocks + segments.num_segments;
        if (column_kernel && entries <= kEntries) {
          in_kernel = segments;
        } else {
          workspace = build_segment_table_global(x, segments, p, stream);
        }
        if (column_kernel && p.seg_pad == 0 && entries <= kPackedEntries &&
            want_packed_tiles(p.rows, segments.num_segments)) {
          launch_colwise_sm90<kMode, T, true>(op, p, row_blocks, in_kernel, segments.num_segments, num_sms, stream);
          return;
        }
      }
      column_kernel ? launch_colwise_sm90<kMode, T>(op, p, row_blocks, in_kernel, segments.num_segments, num_sms,
                                                    stream)
                    : launch_generic<kMode, T>(p, row_blocks, col_tiles, stream);
    }
  };
  AT_DISPATCH_SWITCH(x.scalar_type(), "quantize_fp8_1x128",
                     AT_DISPATCH_CASE(at::kFloat, [&] { typed(float{}); })
                     AT_DISPATCH_CASE(at::kHalf, [&] { typed(__half{}); })
                     AT_DISPATCH_CASE(at::kBFloat16, [&] { typed(__nv_bfloat16{}); }));
}

QuantizeParams base_params(const at::Tensor& x, bool ue8m0) {
  QuantizeParams p{};
  p.x = x.const_data_ptr();
  p.rows = x.size(0);
  p.cols = x.size(1);
  p.ue8m0 = ue8m0;
  return p;
}

void set_rowwise(QuantizeParams& p, const at::Tensor& q, const at::Tensor& scales) {
  p.q = reinterpret_cast<uint8_t*>(q.data_ptr());
  p.scales = scales.data_ptr<float>();
  p.scales_ld = scale_ld(p.rows);
}

void set_colwise(QuantizeParams& p, const at::Tensor& q_t, const at::Tensor& scales_t) {
  p.q_t = reinterpret_cast<uint8_t*>(q_t.data_ptr());
  p.q_t_ld = q_t.stride(0);
  p.scales_t = scales_t.data_ptr<float>();
  p.scales_t_ld = scale_ld(p.cols);
}

}  // namespace

void check_quantize_fp8_1x128(const at::Tensor& x) { check_x("quantize_fp8_1x128", x); }

void check_quantize_fp8_1x128_segments(const at::Tensor& x, const at::Tensor& sizes) {
  constexpr const char* op = "quantize_fp8_1x128_colwise_segments";
  check_x(op, x);
  check_sizes(op, x, sizes);
}

void check_quantize_fp8_1x128_segments_padded(const at::Tensor& x, const at::Tensor& sizes, int64_t pad) {
  constexpr const char* op = "quantize_fp8_1x128_colwise_segments_padded";
  check_x(op, x);
  check_sizes(op, x, sizes);
  check_pad(op, pad);
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_rowwise_cuda(const at::Tensor& x, bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_rowwise";
  check_x(op, x);
  check_sm90(op, x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor q = empty_q(x);
  at::Tensor scales = empty_mn_major_scales(x, x.size(0), ceil_div(x.size(1), kScaleBlockK));
  QuantizeParams p = base_params(x, ue8m0);
  set_rowwise(p, q, scales);
  launch<QuantMode::Rowwise>(op, x, p, ceil_div(p.rows, quant::kTileRows));
  return {q, scales};
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_cuda(const at::Tensor& x, bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_colwise";
  check_x(op, x);
  check_sm90(op, x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor q_t = empty_q_t(x);
  at::Tensor scales_t = empty_mn_major_scales(x, x.size(1), ceil_div(x.size(0), kScaleBlockK));
  QuantizeParams p = base_params(x, ue8m0);
  set_colwise(p, q_t, scales_t);
  launch<QuantMode::Colwise>(op, x, p, ceil_div(p.rows, quant::kTileRows));
  return {q_t, scales_t};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_both_cuda(const at::Tensor& x,
                                                                                        bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_both";
  check_x(op, x);
  check_sm90(op, x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor q = empty_q(x);
  at::Tensor scales = empty_mn_major_scales(x, x.size(0), ceil_div(x.size(1), kScaleBlockK));
  at::Tensor q_t = empty_q_t(x);
  at::Tensor scales_t = empty_mn_major_scales(x, x.size(1), ceil_div(x.size(0), kScaleBlockK));
  QuantizeParams p = base_params(x, ue8m0);
  set_rowwise(p, q, scales);
  set_colwise(p, q_t, scales_t);
  launch<QuantMode::Both>(op, x, p, ceil_div(p.rows, quant::kTileRows));
  return {q, scales, q_t, scales_t};
}

// Sizes stay on the device: the kernel validates them and works out the row range of every scale column
// (each CTA in its shared memory; for tables of more than 768 (fp32) or 3072 entries, and for the generic
// kernel, a one-CTA kernel in global memory first), then quantizes all k_block_capacity(R, G) columns
// (no host synchronisation, capturable in a CUDA graph). Invalid sizes (a negative one, or a sum != R):
// every scale is NaN and q_t is not written.
std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_segments_cuda(const at::Tensor& x,
                                                                            const at::Tensor& sizes, bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_colwise_segments";
  check_quantize_fp8_1x128_segments(x, sizes);
  check_sm90(op, x);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), cols = x.size(1), groups = sizes.size(0);
  const int64_t row_blocks = k_block_capacity(rows, groups);
  TORCH_CHECK(row_blocks <= kMaxRowBlocks, op, ": ceil(R/128) + G - 1 must be <= 2^31 - 1, got ", row_blocks);
  at::Tensor q_t = empty_q_t(x);
  at::Tensor scales_t = empty_mn_major_scales(x, cols, row_blocks);
  if (row_blocks == 0 || cols == 0) return {q_t, scales_t};

  quant::SegmentTableArgs segments;
  segments.sizes = sizes.const_data_ptr<int32_t>();
  segments.num_segments = groups;
  segments.rows = rows;
  segments.num_row_blocks = row_blocks;
  QuantizeParams p = base_params(x, ue8m0);
  set_colwise(p, q_t, scales_t);
  launch<QuantMode::ColwiseSegments>(op, x, p, row_blocks, segments);
  return {q_t, scales_t};
}

// The same cast with every segment's q_t columns padded to a multiple of `pad` with zero columns (and
// the columns after the last segment zero too): q_t [C, K] with K = padded_segment_columns(R, G, pad),
// scales [C, ceil(K/128) + G - 1], and the padded sizes (int32 [G] on the device: align_up(size_g, pad),
// the last one K minus the others) that the k-grouped contiguous-K GEMM takes with them. Zero columns add
// nothing to a GEMM, so any token counts work end to end; with pad >= 32 every block starts on a 32-byte
// sector of q_t (the fast store path). No host synchronisation.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_segments_padded_cuda(
    const at::Tensor& x, const at::Tensor& sizes, int64_t pad, bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_colwise_segments_padded";
  check_quantize_fp8_1x128_segments_padded(x, sizes, pad);
  check_sm90(op, x);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), cols = x.size(1), groups = sizes.size(0);
  const int64_t k = padded_segment_columns(rows, groups, pad);
  TORCH_CHECK(k <= std::numeric_limits<int32_t>::max(), op, ": R + G (pad - 1) must be < 2^31, got ", k);
  const int64_t row_blocks = k_block_capacity(k, groups);
  TORCH_CHECK(row_blocks <= kMaxRowBlocks, op, ": ceil(K/128) + G - 1 must be <= 2^31 - 1, got ", row_blocks);
  at::Tensor q_t_rows =
      at::empty({cols, align_up(k > 0 ? k : 1, kQtRowAlign)}, x.options().dtype(at::kFloat8_e4m3fn));
  if (rows == 0) q_t_rows.view(at::kByte).zero_();  // no block of x to write the zero columns (and padding)
  at::Tensor q_t = q_t_rows.narrow(1, 0, k);
  at::Tensor scales_t = empty_mn_major_scales(x, cols, row_blocks);
  at::Tensor padded = at::empty_like(sizes);
  if (row_blocks == 0 || cols == 0) {  // no launch: the padded sizes from tensor ops (a few launches more)
    padded = sizes.add(pad - 1).bitwise_and(-pad);
    padded.narrow(0, groups - 1, 1).copy_(padded.narrow(0, 0, groups - 1).sum().neg().add(k).view({1}));
    return {q_t, scales_t, padded};
  }

  quant::SegmentTableArgs segments;
  segments.sizes = sizes.const_data_ptr<int32_t>();
  segments.num_segments = groups;
  segments.rows = rows;
  segments.num_row_blocks = row_blocks;
  segments.pad = pad;
  segments.out_cols = k;
  segments.padded_sizes = padded.data_ptr<int32_t>();  // written by the segment table's builder
  QuantizeParams p = base_params(x, ue8m0);
  set_colwise(p, q_t, scales_t);
  p.seg_pad = pad;
  launch<QuantMode::ColwiseSegments>(op, x, p, row_blocks, segments);
  return {q_t, scales_t, padded};
}

}  // namespace wgrad
