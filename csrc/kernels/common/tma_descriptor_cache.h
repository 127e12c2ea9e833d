// \brief Encoded TMA descriptors kept by their arguments, so that a call whose tensors repeat (a training step's
// buffers, reused by torch's caching allocator) copies its descriptors instead of encoding them again.
// Torch-free, and free of the driver: the encode is passed in (tma_descriptor.h passes the driver's).
//
// cuTensorMapEncodeTiled is a pure function of its arguments: the same base address, dimensions, strides, box,
// data type and swizzle give the same 128 bytes. A cached descriptor is therefore exactly what the encode would
// return, whatever was freed or allocated in between; nothing needs invalidating. Each thread has its own
// cache: no lock on the host path, and autograd's backward threads keep theirs.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

namespace wgrad {

// Every argument a tiled encode of this project varies; the element strides (1), interleave (none), L2
// promotion (256 B) and out-of-bounds fill (none) are the same for all of them (tma_descriptor.h). Entries
// past `rank` stay zero, so that equal arguments compare equal.
struct TmaDescriptorKey {
  uint64_t base = 0;
  uint64_t dims[5] = {};
  uint64_t strides_bytes[4] = {};
  uint32_t box[5] = {};
  int32_t dtype = 0;
  int32_t rank = 0;
  int32_t swizzle = 0;

  bool operator==(const TmaDescriptorKey&) const = default;
};

// A set-associative cache of descriptors: kSets sets of kWays entries, the oldest entry of a set replaced
// first. A packed k-grouped call at its 96-group launch limit needs 195 descriptors: in 32 sets of 16 (~120 KB
// per thread) a set would have to draw 17 of them to lose one (a set overflowing loses all of its own to
// the next call's lookups, which come in the same order).
template <int kSets = 32, int kWays = 16>
class TmaDescriptorCache {
 public:
  // Writes the descriptor of `key` into `desc`: a copy of the kept one, or `encode(desc)`'s (which returns
  // an empty string on success, else the reason), kept when the encode succeeded. Returns the encode's
  // result (empty on a hit).
  template <class Encode>
  std::string get(const TmaDescriptorKey& key, CUtensorMap* desc, Encode&& encode) {
    Set& set = sets_[hash(key) % kSets];
    for (int w = 0; w < set.used; ++w) {
      if (set.keys[w] == key) {
        *desc = set.maps[w];
        ++hits_;
        return {};
      }
    }
    std::string err = encode(desc);
    ++misses_;
    if (!err.empty()) return err;
    int w = set.oldest;
    if (set.used < kWays) {
      w = set.used++;
    } else {
      set.oldest = (set.oldest + 1) % kWays;
    }
    set.keys[w] = key;
    set.maps[w] = *desc;
    return {};
  }

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

  static uint64_t hash(const TmaDescriptorKey& key) {
    // Base addresses differ in their high bits (groups megabytes apart): every word goes through a full
    // 64-bit mix before it meets the next.
    uint64_t h = mix(key.base ^ (static_cast<uint64_t>(key.rank) << 56) ^ (static_cast<uint64_t>(key.dtype) << 48) ^
                     (static_cast<uint64_t>(key.swizzle) << 40));
    for (int i = 0; i < key.rank; ++i) h = mix(h ^ key.dims[i]);
    for (int i = 0; i + 1 < key.rank; ++i) h = mix(h ^ key.strides_bytes[i]);
    for (int i = 0; i < key.rank; ++i) h = mix(h ^ key.box[i]);
    return h;
  }

 private:
  // splitmix64's finaliser.
  static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  struct Set {
    CUtensorMap maps[kWays];
    TmaDescriptorKey keys[kWays];
    int used = 0;    // entries filled, [0, used)
    int oldest = 0;  // the next one replaced once all are filled
  };
  Set sets_[kSets];
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace wgrad
