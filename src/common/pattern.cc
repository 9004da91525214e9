#include "rayfabric/pattern.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace rayfabric {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint8_t PatternByte(uint64_t seed, uint64_t i) {
  return static_cast<uint8_t>(SplitMix(seed * 0x100000001b3ULL + (i >> 3)) >> ((i & 7) * 8));
}

}  // namespace

void FillPattern(void* dst, size_t length, uint64_t seed, uint64_t start_index) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t i = 0;
  // Head up to a word boundary of the pattern index, then whole words, then the tail.
  while (i < length && ((start_index + i) & 7) != 0) {
    out[i] = PatternByte(seed, start_index + i);
    ++i;
  }
  for (; i + 8 <= length; i += 8) {
    uint64_t w = SplitMix(seed * 0x100000001b3ULL + ((start_index + i) >> 3));
    std::memcpy(out + i, &w, 8);
  }
  for (; i < length; ++i) out[i] = PatternByte(seed, start_index + i);
}

int64_t FirstMismatch(const void* data, size_t length, uint64_t seed, uint64_t start_index) {
  const auto* in = static_cast<const uint8_t*>(data);
  constexpr size_t kBlock = 1 << 20;
  std::vector<uint8_t> expect(std::min(length, kBlock));
  for (size_t off = 0; off < length; off += kBlock) {
    size_t n = std::min(kBlock, length - off);
    FillPattern(expect.data(), n, seed, start_index + off);
    if (std::memcmp(in + off, expect.data(), n) != 0) {
      for (size_t j = 0; j < n; ++j) {
        if (in[off + j] != expect[j]) return static_cast<int64_t>(off + j);
      }
    }
  }
  return -1;
}

}  // namespace rayfabric
