#include "rayfabric/hex.h"

namespace rayfabric {

std::string BytesToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

namespace {
int Nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

Result<std::string> HexToBytes(std::string_view hex) {
  if (hex.size() % 2 != 0) {
    return InvalidArgument("hex text of odd length " + std::to_string(hex.size()));
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = Nibble(hex[2 * i]), lo = Nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgument("not a hex digit at position " +
                             std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
    }
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace rayfabric
