// One declarative table of every setting: name, environment variable, default, doc.
// Values come from the table's defaults, then the environment, then explicit overrides
// (command-line flags). libfabric's own FI_* variables are never read or written here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rayfabric/status.h"

namespace rayfabric {

struct ConfigEntry {
  const char* name;
  const char* env;
  const char* default_value;
  const char* doc;
};

// All settings, in the order they are documented (README, `rayfabric doctor`).
const std::vector<ConfigEntry>& ConfigTable();

class Config {
 public:
  // Defaults overlaid with any RAYFABRIC_* variables that are set.
  static Config FromEnvironment();

  // Overrides one setting; unknown names are an error, so typos do not pass silently.
  Status Set(const std::string& name, const std::string& value);

  std::string GetString(const std::string& name) const;
  Result<int64_t> GetInt(const std::string& name) const;
  // Accepts plain numbers and K/M/G suffixes (binary units): "4M" == 4194304.
  Result<uint64_t> GetBytes(const std::string& name) const;
  Result<bool> GetBool(const std::string& name) const;

  // "name = value (source)" per line.
  std::string Describe() const;

 private:
  struct Value {
    std::string value;
    std::string source;  // "default", "env RAYFABRIC_X", "override"
  };
  std::map<std::string, Value> values_;
};

Result<uint64_t> ParseBytes(const std::string& text);

}  // namespace rayfabric
