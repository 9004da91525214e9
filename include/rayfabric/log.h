// Minimal leveled logging to stderr; the level comes from the config table (log_level).
#pragma once

#include <sstream>
#include <string>

namespace rayfabric {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void SetLogLevel(LogLevel level);
void SetLogLevel(const std::string& name);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& line);

}  // namespace rayfabric

#define RF_LOG(level, expr)                                                  \
  do {                                                                       \
    if (::rayfabric::LogEnabled(::rayfabric::LogLevel::level)) {             \
      std::ostringstream rf_log_os_;                                         \
      rf_log_os_ << expr;                                                    \
      ::rayfabric::LogLine(::rayfabric::LogLevel::level, rf_log_os_.str()); \
    }                                                                        \
  } while (0)
