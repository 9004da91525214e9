#include "rayfabric/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace rayfabric {
namespace {

LogLevel InitialLevel() {
  const char* env = std::getenv("RAYFABRIC_LOG_LEVEL");
  std::string name = env ? env : "info";
  if (name == "error") return LogLevel::kError;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "debug") return LogLevel::kDebug;
  return LogLevel::kInfo;
}

std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(InitialLevel())};
  return level;
}

}  // namespace

void SetLogLevel(LogLevel level) { Level() = static_cast<int>(level); }

void SetLogLevel(const std::string& name) {
  if (name == "error") SetLogLevel(LogLevel::kError);
  if (name == "warn") SetLogLevel(LogLevel::kWarn);
  if (name == "info") SetLogLevel(LogLevel::kInfo);
  if (name == "debug") SetLogLevel(LogLevel::kDebug);
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= Level().load(); }

void LogLine(LogLevel level, const std::string& line) {
  static const char* names[] = {"E", "W", "I", "D"};
  std::fprintf(stderr, "[rayfabric %s %d] %s\n", names[static_cast<int>(level)], getpid(),
               line.c_str());
}

bool LogLimiter::Allow(uint64_t* suppressed) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (written_in_window_ == 0 || now - window_start_ >= window_) {
    window_start_ = now;
    written_in_window_ = 0;
  }
  if (written_in_window_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++written_in_window_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace rayfabric
