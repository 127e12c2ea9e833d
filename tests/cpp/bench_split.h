// The benchmark's uneven segment sizes (python/wgrad/bench/quant.py, segment_sizes), for the C++ tests: R / G
// each, moved by fixed offsets of 12-95 rows (clipped to half of R / G), the last taking the rest; align > 1
// rounds each but the last down to a multiple of align.
#pragma once

#include <vector>

namespace wgrad::bench {

template <typename Int>
std::vector<Int> segment_sizes(Int rows, int groups = 8, int align = 1) {
  constexpr int kOffsets[7] = {37, -58, 83, -21, 66, -95, 12};
  const Int limit = rows / groups / 2;
  std::vector<Int> s;
  Int sum = 0;
  for (int g = 0; g + 1 < groups; ++g) {
    const Int o = kOffsets[g % 7];
    Int v = rows / groups + (o < -limit ? -limit : o > limit ? limit : o);
    if (align > 1) v = v / align * align;
    s.push_back(v);
    sum += v;
  }
  s.push_back(rows - sum);
  return s;
}

}  // namespace wgrad::bench
