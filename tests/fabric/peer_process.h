// A peer in another process: the test binary re-executes itself with --peer. The peer opens its own
// engine, registers a region filled with a known pattern, prints its fabric address and the
// region's descriptor, and answers commands on stdin. Data moves between the two processes only
// through the fabric; the pipe carries control lines.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "rayfabric/fabric.h"
#include "rayfabric/hex.h"
#include "rayfabric/pattern.h"

namespace rayfabric::testing {

using ::rayfabric::FillPattern;
using ::rayfabric::FirstMismatch;

// Anonymous memory, pre-faulted (first touch runs at a fraction of memcpy speed here).
class Buffer {
 public:
  explicit Buffer(size_t length);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() const { return data_; }
  size_t size() const { return length_; }

 private:
  char* data_ = nullptr;
  size_t length_ = 0;
};

class PeerProcess {
 public:
  // Starts `self --peer --size N --seed S`; extra_env is "NAME=value" pairs (e.g. a domain).
  // read_only: the peer exposes its region as the agent exposes plasma memory (remote read only,
  // an endpoint without FI_REMOTE_WRITE); else peers may write it too.
  PeerProcess(const std::string& self, uint64_t size, uint64_t seed,
              const std::string& extra_env = "", bool read_only = false);
  ~PeerProcess();

  bool ready() const { return ready_; }
  const std::string& error() const { return error_; }
  const fabric::FabricAddress& address() const { return address_; }
  const fabric::RemoteRegion& region() const { return region_; }
  pid_t pid() const { return pid_; }

  // Sends one command line and returns the reply line ("" if the peer is gone).
  std::string Command(const std::string& line);
  void Kill();
  void Signal(int sig);  // e.g. SIGSTOP / SIGCONT: a peer frozen mid-transfer

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  bool ready_ = false;
  std::string error_;
  fabric::FabricAddress address_;
  fabric::RemoteRegion region_;
};

// The --peer side; returns the process exit code.
int PeerMain(int argc, char** argv);

}  // namespace rayfabric::testing
