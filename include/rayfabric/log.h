// Minimal leveled logging to stderr; the level comes from the config table (log_level).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>

namespace rayfabric {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void SetLogLevel(LogLevel level);
void SetLogLevel(const std::string& name);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& line);

// Bounds how often one kind of line is written, for lines a remote peer can cause at will (refused
// requests): at most `burst` lines per `window`; the first line allowed after some were held back
// says how many (RF_LOG_LIMITED). Thread-safe.
class LogLimiter {
 public:
  LogLimiter(int burst, std::chrono::steady_clock::duration window)
      : burst_(burst), window_(window) {}
  // True if a line may be written now; *suppressed: lines held back since the last one written.
  bool Allow(uint64_t* suppressed);

 private:
  const int burst_;
  const std::chrono::steady_clock::duration window_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_start_{};
  int written_in_window_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace rayfabric

#define RF_LOG(level, expr)                                                 \
  do {                                                                      \
    if (::rayfabric::LogEnabled(::rayfabric::LogLevel::level)) {            \
      std::ostringstream rf_log_os_;                                        \
      rf_log_os_ << expr;                                                   \
      ::rayfabric::LogLine(::rayfabric::LogLevel::level, rf_log_os_.str()); \
    }                                                                       \
  } while (0)

#define RF_LOG_LIMITED(limiter, level, expr)                                     \
  do {                                                                           \
    uint64_t rf_log_suppressed_ = 0;                                             \
    if (::rayfabric::LogEnabled(::rayfabric::LogLevel::level) &&                 \
        (limiter).Allow(&rf_log_suppressed_)) {                                  \
      std::ostringstream rf_log_os_;                                             \
      rf_log_os_ << expr;                                                        \
      if (rf_log_suppressed_ > 0) {                                              \
        rf_log_os_ << " (" << rf_log_suppressed_ << " more like it not logged)"; \
      }                                                                          \
      ::rayfabric::LogLine(::rayfabric::LogLevel::level, rf_log_os_.str());      \
    }                                                                            \
  } while (0)
