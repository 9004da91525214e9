#include "rayfabric/object_id.h"

#include <algorithm>
#include <cstring>

namespace rayfabric {
namespace {

int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string BytesToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

Result<std::string> HexToBytes(std::string_view hex) {
  if (hex.size() % 2 != 0) {
    return InvalidArgument("hex string has odd length " + std::to_string(hex.size()));
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = HexDigitValue(hex[2 * i]);
    int lo = HexDigitValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgument("not a hex digit at position " + std::to_string(2 * i) + " of '" +
                             std::string(hex) + "'");
    }
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

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
