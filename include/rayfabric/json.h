// The little JSON the tools print (one line, for `rayfabric doctor` and scripts to parse).
#pragma once

#include <string>

namespace rayfabric {

// `s` as the inside of a JSON string: quotes and backslashes escaped, control characters as spaces.
std::string JsonEscape(const std::string& s);

}  // namespace rayfabric
