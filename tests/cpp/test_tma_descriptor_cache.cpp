// Host-side checks of the per-thread TMA descriptor cache (kernels/common/tma_descriptor_cache.h), with an
// encoder that stands in for the driver's: every descriptor the cache hands out must be the one the encoder
// writes for the same arguments, whatever was encoded or evicted before.
#include "harness.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/tma_descriptor_cache.h"

namespace {

using wgrad::TmaDescriptorCache;
using wgrad::TmaDescriptorKey;

// What the stand-in encoder writes for `key`: its words, each mixed with its position, so that keys
// differing in any field give different descriptors.
CUtensorMap expected_map(const TmaDescriptorKey& key) {
  uint64_t words[16] = {};
  std::memcpy(words, &key, sizeof(key) < sizeof(words) ? sizeof(key) : sizeof(words));
  CUtensorMap map;
  static_assert(sizeof(map) == sizeof(words));
  for (int i = 0; i < 16; ++i) words[i] = words[i] * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(i);
  std::memcpy(&map, words, sizeof(map));
  return map;
}

bool same(const CUtensorMap& a, const CUtensorMap& b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

// The stand-in for the driver's encode: counts its calls, fails for a base address of 0.
struct Encoder {
  int calls = 0;
  std::string encode(const TmaDescriptorKey& key, CUtensorMap* desc) {
    ++calls;
    if (key.base == 0) return "null base";
    *desc = expected_map(key);
    return {};
  }
};

TmaDescriptorKey operand_key(uint64_t base, uint64_t k, uint64_t rows) {
  TmaDescriptorKey key;
  key.base = base;
  key.rank = 2;
  key.dims[0] = k;
  key.dims[1] = rows;
  key.strides_bytes[0] = k;
  key.box[0] = 128;
  key.box[1] = 64;
  key.dtype = 0;
  key.swizzle = 3;
  return key;
}

// Looks `key` up; checks the result is the encoder's descriptor for it.
template <class Cache>
void lookup(Cache& cache, Encoder& enc, const TmaDescriptorKey& key) {
  CUtensorMap desc;
  std::memset(&desc, 0xab, sizeof(desc));
  const std::string err = cache.get(key, &desc, [&](CUtensorMap* d) { return enc.encode(key, d); });
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_TRUE(same(desc, expected_map(key))) << "base " << key.base << " k " << key.dims[0];
}

TEST(TmaDescriptorCache, ARepeatIsCopiedNotEncoded) {
  auto cache = std::make_unique<TmaDescriptorCache<>>();
  Encoder enc;
  const TmaDescriptorKey key = operand_key(0x7f0000000000, 4096, 4096);
  for (int i = 0; i < 3; ++i) lookup(*cache, enc, key);
  EXPECT_EQ(enc.calls, 1);
  EXPECT_EQ(cache->hits(), 2u);
  EXPECT_EQ(cache->misses(), 1u);
}

TEST(TmaDescriptorCache, EveryFieldTellsKeysApart) {
  auto cache = std::make_unique<TmaDescriptorCache<>>();
  Encoder enc;
  const TmaDescriptorKey base = operand_key(0x7f0000000000, 4096, 4096);
  std::vector<TmaDescriptorKey> keys(12, base);
  keys[1].base += 16;
  keys[2].dims[0] += 16;
  keys[3].dims[1] += 1;
  keys[4].strides_bytes[0] += 16;
  keys[5].box[0] = 64;
  keys[6].box[1] = 128;
  keys[7].dtype = 7;
  keys[8].swizzle = 0;
  keys[9].rank = 3;  // the same leading dims with a third of extent 1
  keys[9].dims[2] = 1;
  keys[9].strides_bytes[1] = 4096 * 4096;
  keys[9].box[2] = 1;
  keys[10] = keys[9];
  keys[10].dims[2] = 2;
  keys[11] = keys[9];
  keys[11].strides_bytes[1] += 4096;
  for (const auto& key : keys) lookup(*cache, enc, key);
  EXPECT_EQ(enc.calls, 12);
  for (const auto& key : keys) lookup(*cache, enc, key);
  EXPECT_EQ(enc.calls, 12);
  EXPECT_EQ(cache->hits(), 12u);
}

TEST(TmaDescriptorCache, AFailedEncodeIsReturnedAndNotKept) {
  auto cache = std::make_unique<TmaDescriptorCache<>>();
  Encoder enc;
  const TmaDescriptorKey key = operand_key(0, 256, 128);
  for (int i = 0; i < 2; ++i) {
    CUtensorMap desc;
    const std::string err = cache->get(key, &desc, [&](CUtensorMap* d) { return enc.encode(key, d); });
    EXPECT_EQ(err, std::string("null base"));
  }
  EXPECT_EQ(enc.calls, 2);
  EXPECT_EQ(cache->hits(), 0u);
}

TEST(TmaDescriptorCache, APackedCallAtItsGroupLimitRepeatsFromTheCache) {
  // 96 groups of A and B blocks packed one after another (K_g = 256, 4096 and 7168 rows), plus the scales' and
  // out's descriptors: 195 keys, looked up twice as two calls on the same buffers would.
  auto cache = std::make_unique<TmaDescriptorCache<>>();
  Encoder enc;
  std::vector<TmaDescriptorKey> keys;
  const uint64_t a = 0x7f1000000000, b = 0x7f2000000000;
  for (uint64_t g = 0; g < 96; ++g) {
    keys.push_back(operand_key(a + g * 4096 * 256, 256, 4096));
    keys.push_back(operand_key(b + g * 7168 * 256, 256, 7168));
  }
  for (uint64_t i = 0; i < 3; ++i) keys.push_back(operand_key(0x7f3000000000 + (i << 24), 4096, 192));
  for (const auto& key : keys) lookup(*cache, enc, key);
  ASSERT_EQ(enc.calls, 195);
  for (const auto& key : keys) lookup(*cache, enc, key);
  EXPECT_EQ(cache->hits(), 195u);
  EXPECT_EQ(enc.calls, 195);
}

TEST(TmaDescriptorCache, EvictionNeverServesAnotherKeysDescriptor) {
  // A small cache (4 sets of 2) under random lookups of 40 keys: most miss, every result must still be the
  // descriptor of the key asked for.
  TmaDescriptorCache<4, 2> cache;
  Encoder enc;
  std::vector<TmaDescriptorKey> keys;
  for (uint64_t i = 0; i < 40; ++i) keys.push_back(operand_key(0x7f0000000000 + i * 4096, 128 + 16 * (i % 3), 64));
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    lookup(cache, enc, keys[rng() % keys.size()]);
    if (::wgrad::test::has_fatal_failure()) return;
  }
  EXPECT_EQ(cache.hits() + cache.misses(), 2000u);
  EXPECT_EQ(static_cast<uint64_t>(enc.calls), cache.misses());
  EXPECT_GT(cache.hits(), 0u);
}

TEST(TmaDescriptorCache, ASetKeepsItsNewestEntries) {
  // One set of 4: after keys 0..5 go in, 2..5 are kept (the oldest replaced first) and 0, 1 are not.
  TmaDescriptorCache<1, 4> cache;
  Encoder enc;
  std::vector<TmaDescriptorKey> keys;
  for (uint64_t i = 0; i < 6; ++i) keys.push_back(operand_key(0x7f0000000000 + i * 4096, 256, 64));
  for (const auto& key : keys) lookup(cache, enc, key);
  ASSERT_EQ(enc.calls, 6);
  for (int i = 2; i < 6; ++i) lookup(cache, enc, keys[i]);
  EXPECT_EQ(enc.calls, 6);
  lookup(cache, enc, keys[0]);
  EXPECT_EQ(enc.calls, 7);
}

}  // namespace
