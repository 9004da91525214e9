// One declarative table of every setting: name, environment variable, type (with what it
// allows), default, doc. Values come from the table's defaults, then the environment, then
// explicit overrides (command-line flags), and are checked against the table once, at start
// (Config::Validate). libfabric's own FI_* variables are never read or written here. The rows are
// defined in python/rayfabric/settings.json, the one table that the Python package reads too: its
// "agent" rows are compiled into ConfigTable() at build time (scripts/gen_config_table.py,
// src/common/meson.build), its "python" rows are the package's own (python/rayfabric/settings.py);
// `rayfabric doctor --settings` prints both.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "rayfabric/status.h"

namespace rayfabric {

enum class SettingType {
  kText,
  kList,          // a comma list
  kBool,          // true/false (also 1/0, yes/no, on/off)
  kInt,           // a decimal integer
  kBytes,         // a size: 4096, 64K, 4M, 1G
  kBytesOrShare,  // a size, or a share of a whole (e.g. of the store's memory): 50%
  kChoice,        // one of SettingSpec::choices
};
const char* SettingTypeName(SettingType type);

// What a setting's value may be.
struct SettingSpec {
  SettingType type = SettingType::kText;
  int64_t min = std::numeric_limits<int64_t>::min();  // kInt, kBytes, kBytesOrShare (as a size)
  int64_t max = std::numeric_limits<int64_t>::max();
  const char* choices = nullptr;  // kChoice: "a|b|c"
};
constexpr SettingSpec Spec(SettingType type) { return {type}; }
constexpr SettingSpec IntAtLeast(int64_t min) { return {SettingType::kInt, min}; }
constexpr SettingSpec IntIn(int64_t min, int64_t max) { return {SettingType::kInt, min, max}; }
constexpr SettingSpec BytesAtLeast(int64_t min) { return {SettingType::kBytes, min}; }
constexpr SettingSpec BytesOrShareAtLeast(int64_t min) { return {SettingType::kBytesOrShare, min}; }
constexpr SettingSpec Choice(const char* choices) {
  return {SettingType::kChoice, std::numeric_limits<int64_t>::min(),
          std::numeric_limits<int64_t>::max(), choices};
}

struct ConfigEntry {
  const char* name;
  const char* env;
  SettingSpec spec;
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

  // Every value against its row of the table: OK, or one error naming each bad setting, its
  // value, where that value came from and what the setting allows. Called once at start by
  // whatever opens an engine or an agent; the getters below then cannot fail on these values.
  Status Validate() const;

  std::string GetString(const std::string& name) const;
  Result<int64_t> GetInt(const std::string& name) const;
  // Accepts plain numbers and K/M/G suffixes (binary units): "4M" == 4194304.
  Result<uint64_t> GetBytes(const std::string& name) const;
  Result<bool> GetBool(const std::string& name) const;
  // A size, or a share of `whole` ("50%": half of it, rounded down).
  Result<uint64_t> GetBytesOrShare(const std::string& name, uint64_t whole) const;

  // Where the value of `name` came from: "default", "env RAYFABRIC_X" or "override".
  std::string SourceOf(const std::string& name) const;

  // "name = value (source)" per line.
  std::string Describe() const;
  // Every setting as `ucx_info -c` lists its own: its doc, type, what it allows and default as
  // comments, then ENV=value. Json: one array, an object per setting with the same fields.
  std::string Listing() const;
  std::string ListingJson() const;

 private:
  // The value of `entry` checked against its spec.
  Status Check(const ConfigEntry& entry) const;
  struct Value {
    std::string value;
    std::string source;  // "default", "env RAYFABRIC_X", "override"
  };
  std::map<std::string, Value> values_;
};

Result<uint64_t> ParseBytes(const std::string& text);

}  // namespace rayfabric
