// A Ray ObjectID as the plasma store sees it: exactly 28 opaque bytes (Python: ref.binary()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "rayfabric/hex.h"
#include "rayfabric/status.h"

namespace rayfabric {

class ObjectId {
 public:
  static constexpr size_t kSize = 28;  // Ray's ObjectID::Size() (24-byte TaskID + 4-byte index)

  // Ray's nil id (all 0xff bytes); the plasma client refuses it.
  ObjectId() { bytes_.fill(0xff); }

  // Fails unless `binary` is exactly kSize bytes: the store crashes on any other length.
  static Result<ObjectId> FromBinary(std::string_view binary);
  // Fails unless `hex` is exactly 2 * kSize hex digits.
  static Result<ObjectId> FromHex(std::string_view hex);

  std::string Binary() const { return std::string(bytes_.begin(), bytes_.end()); }
  std::string Hex() const;
  bool IsNil() const;  // Ray's ID::Nil(): every byte 0xff
  const std::array<uint8_t, kSize>& bytes() const { return bytes_; }

  bool operator==(const ObjectId& other) const { return bytes_ == other.bytes_; }
  bool operator!=(const ObjectId& other) const { return !(*this == other); }
  bool operator<(const ObjectId& other) const { return bytes_ < other.bytes_; }

 private:
  std::array<uint8_t, kSize> bytes_;
};

}  // namespace rayfabric

template <>
struct std::hash<rayfabric::ObjectId> {
  size_t operator()(const rayfabric::ObjectId& id) const noexcept {
    // Object ids are random or hash-derived: the first 8 bytes are spread enough.
    uint64_t h = 0;
    for (size_t i = 0; i < rayfabric::ObjectId::kSize; ++i) h = h * 131 + id.bytes()[i];
    return static_cast<size_t>(h);
  }
};
