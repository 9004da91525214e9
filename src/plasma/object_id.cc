#include "rayfabric/object_id.h"

#include <algorithm>
#include <cstring>

namespace rayfabric {
Result<ObjectId> ObjectId::FromBinary(std::string_view binary) {
  if (binary.size() != kSize) {
    return InvalidArgument("an object id must be exactly " + std::to_string(kSize) +
                           " bytes (Ray ObjectID), got " + std::to_string(binary.size()));
  }
  ObjectId id;
  std::memcpy(id.bytes_.data(), binary.data(), kSize);
  return id;
}

Result<ObjectId> ObjectId::FromHex(std::string_view hex) {
  if (hex.size() != 2 * kSize) {
    return InvalidArgument("an object id in hex must be exactly " + std::to_string(2 * kSize) +
                           " digits, got " + std::to_string(hex.size()));
  }
  RF_ASSIGN_OR_RETURN(std::string binary, HexToBytes(hex));
  return FromBinary(binary);
}

std::string ObjectId::Hex() const {
  return BytesToHex(std::string_view(reinterpret_cast<const char*>(bytes_.data()), kSize));
}

bool ObjectId::IsNil() const {
  return std::all_of(bytes_.begin(), bytes_.end(), [](uint8_t b) { return b == 0xff; });
}

}  // namespace rayfabric
