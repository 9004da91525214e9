// rayfabric-plasma-tool: talks to a live raylet's plasma store through rayfabric's client.
// Used by tests/plasma/test_plasma_real_ray.py; prints `key=value` lines, and on failure
// `status=<Code>` plus `message=...` with exit code 2 (1 for usage errors).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "rayfabric/object_id.h"
#include "rayfabric/plasma_client.h"
#include "rayfabric/status.h"

namespace rf = rayfabric;
namespace plasma = rayfabric::plasma;

namespace {

constexpr const char* kUsage =
    "usage:\n"
    "  rayfabric-plasma-tool info <socket>\n"
    "  rayfabric-plasma-tool get <socket> <hex-id> [--timeout-ms N] [--dump FILE] [--twice]\n"
    "  rayfabric-plasma-tool contains <socket> <hex-id>\n"
    "  rayfabric-plasma-tool create <socket> <hex-id> <data-size> <metadata-size> <owner...>\n"
    "        [--allow-disk-fallback] [--timeout-ms N] [--seal [--remap]] [--abort]\n"
    "        --remap: after the seal, a second connection holds the object while this one\n"
    "        releases it (a fallback object is unmapped) and gets it again (mapped again)\n"
    "  rayfabric-plasma-tool copy <src-socket> <dst-socket> <hex-id> <owner...>\n"
    "        [--allow-disk-fallback] [--timeout-ms N]\n"
    "  rayfabric-plasma-tool misuse <socket> <hex-id>\n"
    "  <owner...> = <owner-node-id-hex> <owner-ip> <owner-port> <owner-worker-id-hex>\n"
    "  --ray-version V (any command): refuse unless V is a supported Ray version\n";

// FNV-1a 64: a cheap, dependency-free fingerprint for comparing bytes across stores.
uint64_t Fnv1a(const uint8_t* p, uint64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int Fail(const rf::Status& s) {
  std::printf("status=%s\nmessage=%s\n", rf::StatusCodeName(s.code()), s.message().c_str());
  std::fflush(stdout);
  return 2;
}

struct Args {
  std::vector<std::string> positional;
  int64_t timeout_ms = -1;
  bool allow_disk_fallback = false;
  bool seal = false;
  bool abort = false;
  bool remap = false;
  bool twice = false;
  std::string dump;
  std::string ray_version;
};

rf::Result<Args> Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> rf::Result<std::string> {
      if (i + 1 >= argc) return rf::InvalidArgument(s + " needs a value");
      return std::string(argv[++i]);
    };
    if (s == "--timeout-ms") {
      RF_ASSIGN_OR_RETURN(std::string v, value());
      a.timeout_ms = std::strtoll(v.c_str(), nullptr, 10);
    } else if (s == "--dump") {
      RF_ASSIGN_OR_RETURN(a.dump, value());
    } else if (s == "--ray-version") {
      RF_ASSIGN_OR_RETURN(a.ray_version, value());
    } else if (s == "--allow-disk-fallback") {
      a.allow_disk_fallback = true;
    } else if (s == "--seal") {
      a.seal = true;
    } else if (s == "--abort") {
      a.abort = true;
    } else if (s == "--remap") {
      a.remap = true;
    } else if (s == "--twice") {
      a.twice = true;
    } else {
      a.positional.push_back(s);
    }
  }
  if (a.positional.empty()) return rf::InvalidArgument("no command");
  return a;
}

// --timeout-ms for a Get, 1 s unless given.
int64_t GetTimeoutMs(const Args& a) { return a.timeout_ms < 0 ? 1000 : a.timeout_ms; }

rf::Result<plasma::OwnerAddress> ParseOwner(const std::vector<std::string>& p, size_t at) {
  if (p.size() < at + 4) return rf::InvalidArgument("owner needs 4 fields");
  plasma::OwnerAddress o;
  RF_ASSIGN_OR_RETURN(o.node_id, rf::HexToBytes(p[at]));
  o.ip_address = p[at + 1];
  o.port = static_cast<int32_t>(std::strtol(p[at + 2].c_str(), nullptr, 10));
  RF_ASSIGN_OR_RETURN(o.worker_id, rf::HexToBytes(p[at + 3]));
  return o;
}

rf::Result<std::unique_ptr<plasma::PlasmaClient>> Open(const Args& a, const std::string& path) {
  plasma::ConnectOptions options;
  options.ray_version = a.ray_version;
  return plasma::PlasmaClient::Connect(path, options);
}

void PrintObject(const char* prefix, const plasma::ObjectBuffer& b) {
  std::printf("%sdata_size=%llu\n%smetadata_size=%llu\n%sfnv1a64=%016llx\n%sfallback=%d\n", prefix,
              static_cast<unsigned long long>(b.data_size), prefix,
              static_cast<unsigned long long>(b.metadata_size), prefix,
              static_cast<unsigned long long>(Fnv1a(b.data, b.data_size + b.metadata_size)), prefix,
              b.fallback_allocated ? 1 : 0);
}

int CmdInfo(const Args& a) {
  auto c = Open(a, a.positional.at(1));
  if (!c.ok()) return Fail(c.status());
  std::printf("status=OK\nmemory_capacity=%lld\n", static_cast<long long>((*c)->memory_capacity()));
  return 0;
}

int CmdGet(const Args& a) {
  auto id = rf::ObjectId::FromHex(a.positional.at(2));
  if (!id.ok()) return Fail(id.status());
  auto c = Open(a, a.positional.at(1));
  if (!c.ok()) return Fail(c.status());
  int rounds = a.twice ? 2 : 1;  // --twice: Get/Release twice on one connection (fd bookkeeping)
  for (int r = 0; r < rounds; ++r) {
    auto b = (*c)->GetOne(*id, GetTimeoutMs(a));
    if (!b.ok()) return Fail(b.status());
    if (r == 0) {
      std::printf("status=OK\n");
      PrintObject("", *b);
      if (!a.dump.empty()) {
        std::ofstream out(a.dump, std::ios::binary);
        out.write(reinterpret_cast<const char*>(b->data),
                  static_cast<std::streamsize>(b->data_size + b->metadata_size));
      }
    }
    rf::Status s = (*c)->Release(*id);
    if (!s.ok()) return Fail(s);
  }
  std::printf("segments=%zu\n", (*c)->Segments().size());
  return 0;
}

int CmdContains(const Args& a) {
  auto id = rf::ObjectId::FromHex(a.positional.at(2));
  if (!id.ok()) return Fail(id.status());
  auto c = Open(a, a.positional.at(1));
  if (!c.ok()) return Fail(c.status());
  auto has = (*c)->Contains(*id);
  if (!has.ok()) return Fail(has.status());
  std::printf("status=OK\ncontains=%d\n", *has ? 1 : 0);
  return 0;
}

// The creator's connection releases its sealed object and gets it again, while a second
// connection holds it: nothing else can evict it in between (an unreferenced object may go).
int Remap(const Args& a, const rf::ObjectId& id, plasma::PlasmaClient& creator) {
  auto holder = Open(a, a.positional.at(1));
  if (!holder.ok()) return Fail(holder.status());
  auto held = (*holder)->GetOne(id, GetTimeoutMs(a));
  if (!held.ok()) return Fail(held.status());
  std::printf("segments_sealed=%zu\n", creator.Segments().size());
  rf::Status s = creator.Release(id);
  if (!s.ok()) return Fail(s);
  std::printf("segments_released=%zu\n", creator.Segments().size());
  auto again = creator.GetOne(id, GetTimeoutMs(a));
  if (!again.ok()) return Fail(again.status());
  std::printf("segments_remapped=%zu\n", creator.Segments().size());
  PrintObject("remapped_", *again);
  s = creator.Release(id);
  if (s.ok()) s = (*holder)->Release(id);
  if (!s.ok()) return Fail(s);
  std::printf("finished=OK\n");
  return 0;
}

int CmdCreate(const Args& a) {
  auto id = rf::ObjectId::FromHex(a.positional.at(2));
  if (!id.ok()) return Fail(id.status());
  auto owner = ParseOwner(a.positional, 5);
  if (!owner.ok()) return Fail(owner.status());
  plasma::CreateOptions o;
  o.owner = *owner;
  o.data_size = std::strtoull(a.positional.at(3).c_str(), nullptr, 10);
  o.metadata_size = std::strtoull(a.positional.at(4).c_str(), nullptr, 10);
  o.allow_disk_fallback = a.allow_disk_fallback;
  if (a.timeout_ms >= 0) o.timeout_ms = a.timeout_ms;
  auto c = Open(a, a.positional.at(1));
  if (!c.ok()) return Fail(c.status());
  auto b = (*c)->Create(*id, o);
  if (!b.ok()) return Fail(b.status());
  std::memset(b->data, 0x5a, b->data_size + b->metadata_size);
  std::printf("status=OK\n");
  PrintObject("", *b);  // now: Release may unmap a fallback object's memory
  rf::Status s = rf::Status::OK();
  if (a.abort) {
    s = (*c)->Abort(*id);
  } else if (a.seal) {
    s = (*c)->Seal(*id);
    if (s.ok() && a.remap) return Remap(a, *id, **c);
    if (s.ok()) s = (*c)->Release(*id);
  }
  if (!s.ok()) return Fail(s);
  std::printf("finished=OK\n");
  return 0;  // an object neither sealed nor aborted is aborted by the store when we disconnect
}

int CmdCopy(const Args& a) {
  auto id = rf::ObjectId::FromHex(a.positional.at(3));
  if (!id.ok()) return Fail(id.status());
  auto owner = ParseOwner(a.positional, 4);
  if (!owner.ok()) return Fail(owner.status());
  auto src = Open(a, a.positional.at(1));
  if (!src.ok()) return Fail(src.status());
  auto dst = Open(a, a.positional.at(2));
  if (!dst.ok()) return Fail(dst.status());
  auto from = (*src)->GetOne(*id, GetTimeoutMs(a));
  if (!from.ok()) return Fail(from.status());
  plasma::CreateOptions o;
  o.owner = *owner;
  o.data_size = from->data_size;
  o.metadata_size = from->metadata_size;
  o.allow_disk_fallback = a.allow_disk_fallback;
  auto to = (*dst)->Create(*id, o);
  if (!to.ok()) {
    rf::Status ignored = (*src)->Release(*id);
    (void)ignored;
    return Fail(to.status());
  }
  std::memcpy(to->data, from->data, from->data_size + from->metadata_size);
  uint64_t sum = Fnv1a(to->data, to->data_size + to->metadata_size);
  plasma::ObjectBuffer source = *from;
  const uint64_t source_sum = Fnv1a(from->data, from->data_size + from->metadata_size);
  rf::Status s = (*dst)->Seal(*id);
  if (s.ok()) s = (*dst)->Release(*id);
  rf::Status r = (*src)->Release(*id);
  if (!s.ok()) return Fail(s);
  if (!r.ok()) return Fail(r);
  std::printf("status=OK\ndata_size=%llu\nmetadata_size=%llu\nfnv1a64=%016llx\n",
              static_cast<unsigned long long>(source.data_size),
              static_cast<unsigned long long>(source.metadata_size),
              static_cast<unsigned long long>(source_sum));
  std::printf("copied_fnv1a64=%016llx\n", static_cast<unsigned long long>(sum));
  return 0;
}

// Each call below would CHECK-fail the raylet if it reached the socket; all must be refused.
int CmdMisuse(const Args& a) {
  auto id = rf::ObjectId::FromHex(a.positional.at(2));
  if (!id.ok()) return Fail(id.status());
  auto c = Open(a, a.positional.at(1));
  if (!c.ok()) return Fail(c.status());
  plasma::PlasmaClient& client = **c;
  struct Case {
    const char* name;
    rf::Status status;
  };
  std::vector<Case> cases;
  cases.push_back({"seal_not_created", client.Seal(*id)});
  cases.push_back({"abort_not_created", client.Abort(*id)});
  cases.push_back({"release_not_held", client.Release(*id)});
  cases.push_back({"get_wait_forever", client.Get({*id}, -1).status()});
  cases.push_back({"get_duplicate_ids", client.Get({*id, *id}, 0).status()});
  cases.push_back({"seal_nil_id", client.Seal(rf::ObjectId())});
  plasma::CreateOptions bad;
  bad.data_size = 1;
  cases.push_back({"create_without_owner", client.Create(*id, bad).status()});
  int failures = 0;
  for (const Case& c : cases) {
    bool refused = c.status.code() == rf::StatusCode::kInvalidArgument;
    failures += refused ? 0 : 1;
    std::printf("%s=%s\n", c.name, rf::StatusCodeName(c.status.code()));
  }
  std::printf("healthy=%d\n", client.healthy() ? 1 : 0);
  std::printf("status=%s\n", failures == 0 ? "OK" : "Internal");
  return failures == 0 ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  auto args = Parse(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "%s\n%s", args.status().ToString().c_str(), kUsage);
    return 1;
  }
  const Args& a = *args;
  const std::string& cmd = a.positional[0];
  const size_t n = a.positional.size();
  if (cmd == "info" && n == 2) return CmdInfo(a);
  if (cmd == "get" && n == 3) return CmdGet(a);
  if (cmd == "contains" && n == 3) return CmdContains(a);
  if (cmd == "create" && n == 9) return CmdCreate(a);
  if (cmd == "copy" && n == 8) return CmdCopy(a);
  if (cmd == "misuse" && n == 3) return CmdMisuse(a);
  std::fprintf(stderr, "%s", kUsage);
  return 1;
}
