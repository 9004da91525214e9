// fabric_probe: a hostile (or plain) fabric peer for the agent tests. It opens its own engine on
// the provider of RAYFABRIC_PROVIDER and, against a descriptor it is given (hex of a
// RemoteRegion, as a lease carries it, or forged), tries one RMA:
//
//   fabric_probe read  ADDRESS_HEX REGION_HEX OFFSET LENGTH   -> "OK <sha256-free fnv64 hex>"
//   fabric_probe write ADDRESS_HEX REGION_HEX OFFSET LENGTH   -> "OK" (writes 0x5A bytes)
//   fabric_probe guess ADDRESS_HEX REGION_HEX OFFSET LENGTH N -> tries keys 0..N-1 and the real
//        key +-1..4 at base 0 and at the real base, each after a good read with the real one;
//        prints "GUESSED <k> <base>" for each that read anything, then "DONE <refused>"
// Any failure prints "FAIL <status>". Exit status 0 whatever the outcome (the caller decides).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "rayfabric/fabric.h"
#include "rayfabric/hex.h"

using namespace rayfabric;

namespace {

uint64_t Fnv64(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ULL;
  return h;
}

int Fail(const Status& s) {
  std::cout << "FAIL " << s.ToString() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::cerr << "usage: fabric_probe read|write|guess ADDRESS_HEX REGION_HEX OFFSET LENGTH [N]\n";
    return 2;
  }
  const std::string op = argv[1];
  auto address = HexToBytes(argv[2]);
  auto region_bytes = HexToBytes(argv[3]);
  if (!address.ok()) return Fail(address.status());
  if (!region_bytes.ok()) return Fail(region_bytes.status());
  auto region = fabric::RemoteRegion::Parse(*region_bytes);
  if (!region.ok()) return Fail(region.status());
  const uint64_t offset = std::stoull(argv[4]);
  const size_t length = std::stoull(argv[5]);
  Config config = Config::FromEnvironment();
  (void)config.Set("op_timeout_ms", "5000");
  (void)config.Set("drain_timeout_ms", "1000");
  auto engine = fabric::Engine::Open(config);
  if (!engine.ok()) return Fail(engine.status());
  fabric::Engine& e = **engine;
  // The agent's raw address (its Info); the probe claims its own provider for it, as a hostile
  // peer of the same fabric would.
  fabric::FabricAddress target = e.Address();
  target.bytes = *address;
  auto peer = e.AddPeer(target);
  if (!peer.ok()) return Fail(peer.status());
  std::vector<char> buffer(length, 0);
  auto mr = e.Register(buffer.data(), buffer.size());
  if (!mr.ok()) return Fail(mr.status());
  if (op == "read") {
    Status s = e.Read(*peer, *region, offset, *mr, buffer.data(), length);
    if (!s.ok()) return Fail(s);
    std::printf("OK %016llx\n", static_cast<unsigned long long>(Fnv64(buffer.data(), length)));
  } else if (op == "write") {
    std::memset(buffer.data(), 0x5A, length);
    Status s = e.Write(*peer, *region, offset, *mr, buffer.data(), length);
    if (!s.ok()) return Fail(s);
    std::printf("OK\n");
  } else if (op == "guess") {
    const uint64_t n = argc > 6 ? std::stoull(argv[6]) : 16;
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < n; ++k) keys.push_back(k);
    for (uint64_t d = 1; d <= 4; ++d) keys.insert(keys.end(), {region->key + d, region->key - d});
    int refused = 0;
    // A refused RMA drops tcp;ofi_rxm's connection and the next operation may find it closing:
    // before each guess the real descriptor must read again, so each refusal is the key's.
    auto reconnected = [&] {
      for (int attempt = 0; attempt < 50; ++attempt) {
        if (e.Read(*peer, *region, offset, *mr, buffer.data(), length).ok()) return true;
        usleep(20000);
      }
      return false;
    };
    for (uint64_t base : {uint64_t{0}, region->address}) {
      for (uint64_t key : keys) {
        if (key == region->key) continue;
        if (!reconnected()) {
          std::printf("FAIL the real descriptor no longer reads\n");
          return 0;
        }
        fabric::RemoteRegion guess = *region;
        guess.address = base;
        guess.key = key;
        Status s = e.Read(*peer, guess, offset, *mr, buffer.data(), length);
        if (s.ok()) {
          std::printf("GUESSED %llu %llu\n", static_cast<unsigned long long>(key),
                      static_cast<unsigned long long>(base));
        } else {
          ++refused;
        }
      }
    }
    std::printf("DONE %d\n", refused);
  } else {
    std::cerr << "unknown op " << op << "\n";
    return 2;
  }
  std::fflush(stdout);
  return 0;
}
