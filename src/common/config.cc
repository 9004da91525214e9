#include "rayfabric/config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "rayfabric/json.h"

namespace rayfabric {

// The rows are python/rayfabric/settings.json's "agent" ones, compiled in at build time
// (scripts/gen_config_table.py writes config_table.inc, src/common/meson.build).
const std::vector<ConfigEntry>& ConfigTable() {
  static const std::vector<ConfigEntry> table = {
#include "config_table.inc"
  };
  return table;
}

const char* SettingTypeName(SettingType type) {
  switch (type) {
    case SettingType::kText:
      return "text";
    case SettingType::kList:
      return "list";
    case SettingType::kBool:
      return "bool";
    case SettingType::kInt:
      return "int";
    case SettingType::kBytes:
      return "bytes";
    case SettingType::kBytesOrShare:
      return "bytes or share";
    case SettingType::kChoice:
      return "choice";
  }
  return "text";
}

namespace {

std::vector<std::string> SplitChoices(const std::string& choices) {
  std::vector<std::string> each;
  size_t from = 0;
  for (size_t bar = choices.find('|'); bar != std::string::npos; bar = choices.find('|', from)) {
    each.push_back(choices.substr(from, bar - from));
    from = bar + 1;
  }
  each.push_back(choices.substr(from));
  return each;
}

// "object|arena|auto" as "object, arena or auto".
std::string ChoicesInWords(const std::string& choices) {
  const std::vector<std::string> each = SplitChoices(choices);
  std::string out;
  for (size_t i = 0; i < each.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == each.size() ? " or " : ", ") + each[i];
  }
  return out;
}

bool IsChoice(const std::string& value, const std::string& choices) {
  const std::vector<std::string> each = SplitChoices(choices);
  return std::find(each.begin(), each.end(), value) != each.end();
}

std::string SizeInWords(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

// The bound of `spec` in words ("at least 1", "in [1, 64]"); "" when unbounded.
std::string BoundInWords(const SettingSpec& spec, bool sizes) {
  const bool low = spec.min != std::numeric_limits<int64_t>::min();
  const bool high = spec.max != std::numeric_limits<int64_t>::max();
  auto word = [sizes](int64_t v) { return sizes ? SizeInWords(v) : std::to_string(v); };
  if (low && high) return "in [" + word(spec.min) + ", " + word(spec.max) + "]";
  if (low) return "at least " + word(spec.min);
  if (high) return "at most " + word(spec.max);
  return "";
}

// The share in "50%" as a fraction in (0, 1].
Result<double> ParseShare(const std::string& text) {
  char* end = nullptr;
  const double pct = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() - 1 || !(pct > 0) || pct > 100) {
    return InvalidArgument("a share must be in (0%, 100%]");
  }
  return pct / 100.0;
}

}  // namespace

Config Config::FromEnvironment() {
  Config config;
  for (const ConfigEntry& e : ConfigTable()) {
    const char* env = std::getenv(e.env);
    if (env != nullptr) {
      config.values_[e.name] = {env, std::string("env ") + e.env};
    } else {
      config.values_[e.name] = {e.default_value, "default"};
    }
  }
  return config;
}

Status Config::Set(const std::string& name, const std::string& value) {
  auto it = values_.find(name);
  if (it == values_.end()) {
    std::string known;
    for (const auto& [setting, value] : values_) known += (known.empty() ? "" : ", ") + setting;
    return InvalidArgument("unknown setting '" + name + "'; the settings are " + known +
                           " (README.md, Configuration)");
  }
  it->second = {value, "override"};
  return Status::OK();
}

std::string Config::SourceOf(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second.source;
}

Status Config::Check(const ConfigEntry& entry) const {
  const std::string& value = GetString(entry.name);
  const SettingSpec& spec = entry.spec;
  Status bad;
  int64_t number = 0;
  bool bounded = false;  // a number to check against the spec's bounds
  switch (spec.type) {
    case SettingType::kText:
    case SettingType::kList:
      return Status::OK();
    case SettingType::kBool:
      bad = GetBool(entry.name).status();
      break;
    case SettingType::kChoice:
      if (!IsChoice(value, spec.choices)) {
        bad = InvalidArgument(std::string(entry.name) + "='" + value + "': use " +
                              ChoicesInWords(spec.choices));
      }
      break;
    case SettingType::kInt: {
      auto v = GetInt(entry.name);
      bad = v.status();
      if (v.ok()) number = *v, bounded = true;
      break;
    }
    case SettingType::kBytesOrShare:
      if (!value.empty() && value.back() == '%') {
        auto share = ParseShare(value);
        if (!share.ok()) {
          bad = InvalidArgument(std::string(entry.name) + "='" + value +
                                "': " + share.status().message());
        }
        break;
      }
      [[fallthrough]];
    case SettingType::kBytes: {
      auto v = GetBytes(entry.name);
      bad = v.status();
      if (v.ok()) {
        if (*v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          bad = InvalidArgument("setting " + std::string(entry.name) + "='" + value +
                                "' is too large");
        } else {
          number = static_cast<int64_t>(*v), bounded = true;
        }
      }
      break;
    }
  }
  if (bad.ok() && bounded && (number < spec.min || number > spec.max)) {
    const bool sizes = spec.type != SettingType::kInt;
    bad = InvalidArgument(std::string(entry.name) + "='" + value + "' must be " +
                          BoundInWords(spec, sizes));
  }
  if (bad.ok()) return bad;
  const std::string source = SourceOf(entry.name);
  return InvalidArgument(bad.message() + " (" +
                         (source == "override"  ? std::string("given as --") + entry.name
                          : source == "default" ? std::string("the default")
                                                : "from " + source) +
                         ")");
}

Status Config::Validate() const {
  std::string errors;
  for (const ConfigEntry& entry : ConfigTable()) {
    Status s = Check(entry);
    if (!s.ok()) errors += (errors.empty() ? "" : "; ") + s.message();
  }
  if (errors.empty()) return Status::OK();
  return InvalidArgument(
      errors + " (README.md, Configuration; `rayfabric doctor --settings` lists them all)");
}

Result<uint64_t> Config::GetBytesOrShare(const std::string& name, uint64_t whole) const {
  const std::string value = GetString(name);
  if (value.empty() || value.back() != '%') return GetBytes(name);
  auto share = ParseShare(value);
  if (!share.ok()) {
    return InvalidArgument("setting " + name + "='" + value + "': " + share.status().message());
  }
  return static_cast<uint64_t>(*share * static_cast<double>(whole));
}

std::string Config::GetString(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second.value;
}

Result<int64_t> Config::GetInt(const std::string& name) const {
  std::string text = GetString(name);
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == nullptr || *end != '\0') {
    return InvalidArgument("setting " + name + "='" + text + "' is not an integer");
  }
  return static_cast<int64_t>(v);
}

Result<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    return InvalidArgument("'" + text + "' is not a size (examples: 4096, 64K, 4M, 1G)");
  }
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  std::string suffix(end);
  uint64_t mult = 1;
  if (suffix.empty() || suffix == "B") {
    mult = 1;
  } else if (suffix == "K" || suffix == "k" || suffix == "KiB") {
    mult = 1ULL << 10;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB") {
    mult = 1ULL << 20;
  } else if (suffix == "G" || suffix == "g" || suffix == "GiB") {
    mult = 1ULL << 30;
  } else {
    return InvalidArgument("'" + text + "' has an unknown size suffix (use K, M or G)");
  }
  return static_cast<uint64_t>(v) * mult;
}

Result<uint64_t> Config::GetBytes(const std::string& name) const {
  auto r = ParseBytes(GetString(name));
  if (!r.ok()) return r.status().WithContext("setting " + name);
  return r;
}

Result<bool> Config::GetBool(const std::string& name) const {
  std::string t = GetString(name);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off" || t.empty()) return false;
  return InvalidArgument("setting " + name + "='" + t + "' is not a boolean (true/false)");
}

namespace {
// What `spec` allows, in words ("an integer in [1, 64]", "object, arena or auto").
std::string AllowsInWords(const SettingSpec& spec) {
  switch (spec.type) {
    case SettingType::kText:
      return "text";
    case SettingType::kList:
      return "a comma list";
    case SettingType::kBool:
      return "true or false";
    case SettingType::kChoice:
      return ChoicesInWords(spec.choices);
    case SettingType::kInt: {
      const std::string bound = BoundInWords(spec, false);
      return "an integer" + (bound.empty() ? "" : " " + bound);
    }
    case SettingType::kBytes:
    case SettingType::kBytesOrShare: {
      const std::string bound = BoundInWords(spec, true);
      return std::string("a size (4096, 64K, 4M, 1G)") +
             (spec.type == SettingType::kBytesOrShare ? " or a share (50%)" : "") +
             (bound.empty() ? "" : ", " + bound);
    }
  }
  return "text";
}
}  // namespace

namespace {
// `text` as comment lines ("# ...") of at most ~100 characters, broken between words.
std::string AsComment(const std::string& text) {
  std::string out;
  std::string line;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    if (!line.empty() && line.size() + 1 + word.size() > 98) {
      out += "# " + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + "# " + line + "\n";
}
}  // namespace

std::string Config::Listing() const {
  std::ostringstream os;
  for (const ConfigEntry& e : ConfigTable()) {
    const Value& v = values_.at(e.name);
    os << AsComment(e.doc) << "# " << AllowsInWords(e.spec) << "; default '" << e.default_value
       << "'" << (v.source == "default" ? "" : "; set by " + v.source) << "\n"
       << e.env << "=" << v.value << "\n\n";
  }
  return os.str();
}

std::string Config::ListingJson() const {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const ConfigEntry& e : ConfigTable()) {
    const Value& v = values_.at(e.name);
    os << (first ? "" : ",") << "{\"name\":\"" << e.name << "\",\"env\":\"" << e.env
       << "\",\"type\":\"" << SettingTypeName(e.spec.type) << "\",\"allows\":\""
       << JsonEscape(AllowsInWords(e.spec)) << "\",\"default\":\"" << JsonEscape(e.default_value)
       << "\",\"value\":\"" << JsonEscape(v.value) << "\",\"source\":\"" << JsonEscape(v.source)
       << "\",\"doc\":\"" << JsonEscape(e.doc) << "\"}";
    first = false;
  }
  os << "]";
  return os.str();
}

std::string Config::Describe() const {
  std::ostringstream os;
  for (const ConfigEntry& e : ConfigTable()) {
    const Value& v = values_.at(e.name);
    os << e.name << " = '" << v.value << "' (" << v.source << ")\n";
  }
  return os.str();
}

}  // namespace rayfabric
