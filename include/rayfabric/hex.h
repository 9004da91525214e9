// Hex text <-> raw bytes, for ids and addresses on command lines, logs and JSON.
#pragma once

#include <string>
#include <string_view>

#include "rayfabric/status.h"

namespace rayfabric {

std::string BytesToHex(std::string_view bytes);
// InvalidArgument on odd length or a non-hex digit.
Result<std::string> HexToBytes(std::string_view hex);

}  // namespace rayfabric
