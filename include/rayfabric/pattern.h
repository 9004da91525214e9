// A deterministic byte pattern both ends of a transfer can regenerate, to verify every byte.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rayfabric {

// Writes bytes [start_index, start_index + length) of pattern stream `seed` to dst.
void FillPattern(void* dst, size_t length, uint64_t seed, uint64_t start_index = 0);
// Index of the first byte that differs from the pattern, or -1 when all match.
int64_t FirstMismatch(const void* data, size_t length, uint64_t seed, uint64_t start_index = 0);

}  // namespace rayfabric
