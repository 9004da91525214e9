// Memory registration: access bits, keys nobody can guess, the registration cache, descriptors.
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <sys/random.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>

#include "fabric/engine_core.h"
#include "fabric/fabric_error.h"
#include "rayfabric/log.h"

namespace rayfabric::fabric {
namespace {

std::string MemlockHint() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "";
  return "; the locked-memory limit (ulimit -l) is " + HumanBytes(rl.rlim_cur) +
         ": raise it (ulimit -l unlimited, or LimitMEMLOCK=infinity for a systemd service)";
}

// A key drawn from the whole key space the provider offers (key_size bytes; 8 on tcp, sockets,
// shm): a peer that was never handed a descriptor cannot guess one.
Result<uint64_t> RandomKey(size_t key_size) {
  uint64_t key = 0;
  if (getrandom(&key, sizeof(key), 0) != static_cast<ssize_t>(sizeof(key))) {
    return Internal(std::string("getrandom failed: ") + std::strerror(errno));
  }
  if (key_size > 0 && key_size < sizeof(key)) key &= (1ULL << (8 * key_size)) - 1;
  return key;
}

std::string AccessName(uint32_t access) {
  std::string s;
  if (access & kLocalRead) s += "|local-read";
  if (access & kLocalWrite) s += "|local-write";
  if (access & kRemoteRead) s += "|remote-read";
  if (access & kRemoteWrite) s += "|remote-write";
  return s.empty() ? "none" : s.substr(1);
}

// One registration call: fi_mr_reg for host memory (as every provider takes it), fi_mr_regattr
// with the device's iface for device memory (FI_HMEM).
int RegisterCall(struct fid_domain* domain, MemoryRegion& region, const MemoryLocation& location,
                 uint64_t fi_access, uint64_t requested_key, struct fid_mr** mr) {
  if (location.host()) {
    return fi_mr_reg(domain, region.base(), region.length(), fi_access, 0, requested_key, 0, mr,
                     nullptr);
  }
  struct iovec iov {};
  iov.iov_base = region.base();
  iov.iov_len = region.length();
  struct fi_mr_attr attr {};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = fi_access;
  attr.requested_key = requested_key;
  attr.iface = FI_HMEM_CUDA;
  attr.device.cuda = location.device;
  return fi_mr_regattr(domain, &attr, 0, mr);
}

}  // namespace

std::string MemoryLocation::ToString() const {
  return host() ? "host memory" : "CUDA device " + std::to_string(device) + " memory";
}

Status EngineCore::RegisterWithKey(MemoryRegion& region, uint64_t fi_access) {
  // With FI_MR_PROV_KEY the provider picks the key (verbs: the HCA's rkey; efa likewise).
  // Otherwise we do, at random; a collision with a key in use (FI_ENOKEY) draws again.
  for (int attempt = 0;; ++attempt) {
    uint64_t requested_key = 0;
    if (!profile_.prov_key) {
      RF_ASSIGN_OR_RETURN(requested_key, RandomKey(profile_.key_size));
    }
    int ret = RegisterCall(domain_.get(), region, region.location_, fi_access, requested_key,
                           &region.mr_);
    if (ret == -FI_ENOKEY && !profile_.prov_key && attempt < 8) continue;
    if (ret) {
      region.mr_ = nullptr;
      const bool host = region.location_.host();
      Status s =
          FabricStatus(ret, std::string(host ? "fi_mr_reg" : "fi_mr_regattr") + " of " +
                                HumanBytes(region.length_) + " of " + region.location_.ToString() +
                                " (" + AccessName(region.access_) + ") on " + profile_.provider);
      if (s.code() == StatusCode::kResourceExhausted) {
        return ResourceExhausted(s.message() + MemlockHint());
      }
      if (!host) {
        // The provider offered FI_HMEM, yet this libfabric may be built without CUDA or find no
        // driver: only the registration tells.
        return Status(s.code(), s.message() +
                                    "; does this libfabric support CUDA memory? `rayfabric "
                                    "doctor` says (finding hmem-cuda); otherwise stage device "
                                    "buffers through host memory");
      }
      return s;
    }
    return Status::OK();
  }
}

Result<std::shared_ptr<MemoryRegion>> EngineCore::Register(void* base, size_t length,
                                                           uint32_t access, Sharing sharing,
                                                           const MemoryLocation& location) {
  if (base == nullptr || length == 0) return InvalidArgument("Register: empty region");
  if (access == 0) return InvalidArgument("Register: no access asked for");
  if (!location.host() && !profile_.device_memory) {
    return InvalidArgument("Register: " + location.ToString() + " on " + profile_.provider + "/" +
                           profile_.domain + ", which was not opened for device memory (" +
                           profile_.device_memory_note + "): stage the buffer through host memory");
  }
  if ((access & kRemoteWrite) && !remote_write_) {
    return InvalidArgument(
        "Register: remote write asked for on an engine opened without "
        "EngineOptions::remote_write (its endpoint does not accept writes from peers)");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(base);
  // Regions looked at during the cache scan; released only after the lock, since dropping the
  // last reference deregisters (and edits regions_).
  std::vector<std::shared_ptr<MemoryRegion>> seen;
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (sharing == Sharing::kShared) {
    // Cache: a shared region with the same access that covers the whole range serves it. Never a
    // region with more access (that would widen what the caller meant to expose), nor a private
    // one.
    for (auto it = regions_.upper_bound(start); it != regions_.begin();) {
      --it;
      if (auto region = it->second.weak.lock()) {
        if (region->sharing_ == Sharing::kShared && region->access_ == access &&
            region->location_ == location && region->Contains(base, length)) {
          return region;
        }
        seen.push_back(std::move(region));
      }
    }
  }
  std::shared_ptr<MemoryRegion> region(new MemoryRegion());
  region->base_ = base;
  region->length_ = length;
  region->access_ = access;
  region->sharing_ = sharing;
  region->location_ = location;
  RF_RETURN_IF_ERROR(RegisterWithKey(*region, FabricAccess(access)));
  if (profile_.endpoint_mr) {
    int ret = fi_mr_bind(region->mr_, &eps_.ep.get()->fid, 0);
    if (!ret) ret = fi_mr_enable(region->mr_);
    if (ret) {
      fi_close(&region->mr_->fid);
      region->mr_ = nullptr;
      return FabricStatus(ret, "binding a memory region to the endpoint (FI_MR_ENDPOINT)");
    }
  }
  region->key_ = fi_mr_key(region->mr_);
  if (profile_.raw_key) {
    uint64_t raw_base = 0;
    size_t key_size = profile_.key_size ? profile_.key_size : 64;
    std::string raw(key_size, '\0');
    int ret = fi_mr_raw_attr(region->mr_, &raw_base, reinterpret_cast<uint8_t*>(raw.data()),
                             &key_size, 0);
    if (ret) {
      fi_close(&region->mr_->fid);
      region->mr_ = nullptr;
      return FabricStatus(ret, "fi_mr_raw_attr");
    }
    raw.resize(key_size);
    region->raw_key_ = raw;
  }
  region->core_ = shared_from_this();
  regions_.emplace(start, CachedRegion{region.get(), region});
  ++regions_registered_;
  return region;
}

Result<RegisteredRange> EngineCore::RegisterRange(void* base, size_t length, uint32_t access,
                                                  Sharing sharing, const MemoryLocation& location) {
  if (base == nullptr || length == 0) return InvalidArgument("RegisterRange: empty range");
  const uint64_t slice = profile_.max_registration_bytes;
  RegisteredRange range;
  for (size_t at = 0; at < length; at += slice) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(slice, length - at));
    auto region = Register(static_cast<char*>(base) + at, n, access, sharing, location);
    if (!region.ok()) {
      return region.status().WithContext(
          "registering slice " + std::to_string(range.slices.size() + 1) + " of " +
          std::to_string((length + slice - 1) / slice) + " (" + HumanBytes(slice) + " each)");
    }
    range.slices.push_back(std::move(*region));
  }
  return range;
}

void EngineCore::Deregister(MemoryRegion* region) {
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto range = regions_.equal_range(reinterpret_cast<uintptr_t>(region->base_));
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second.raw == region) {
        regions_.erase(it);
        break;
      }
    }
  }
  if (region->mr_ != nullptr) fi_close(&region->mr_->fid);
  --regions_registered_;
}

Result<uint64_t> EngineCore::RemoteKey(const RemoteRegion& remote) {
  if (remote.raw_key.empty()) return remote.key;
  // FI_MR_RAW: the reader maps the owner's raw key to a local one, once per key.
  auto it = mapped_raw_keys_.find(remote.raw_key);
  if (it != mapped_raw_keys_.end()) return it->second;
  uint64_t key = 0;
  std::string raw = remote.raw_key;
  int ret = fi_mr_map_raw(domain_.get(), remote.address, reinterpret_cast<uint8_t*>(raw.data()),
                          raw.size(), &key, 0);
  if (ret) return FabricStatus(ret, "fi_mr_map_raw of a remote key");
  mapped_raw_keys_[remote.raw_key] = key;
  return key;
}

// ------------------------------------------------------------------------------ MemoryRegion

MemoryRegion::~MemoryRegion() {
  if (core_) core_->Deregister(this);
}

bool MemoryRegion::Contains(const void* p, size_t len) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  auto b = reinterpret_cast<uintptr_t>(base_);
  return a >= b && len <= length_ && a - b <= length_ - len;
}

RemoteRegion MemoryRegion::Describe() const {
  RemoteRegion r;
  r.address = core_->profile_.virt_addr ? reinterpret_cast<uint64_t>(base_) : 0;
  r.length = length_;
  r.key = key_;
  r.raw_key = raw_key_;
  return r;
}

void* MemoryRegion::local_desc() const { return mr_ ? fi_mr_desc(mr_) : nullptr; }

// --------------------------------------------------------------------------- RegisteredRange

const MemoryRegion* RegisteredRange::SliceFor(const void* p) const {
  for (const auto& slice : slices) {
    if (slice->Contains(p, 1)) return slice.get();
  }
  return nullptr;
}

bool RegisteredRange::Contains(const void* p, size_t len) const {
  if (slices.empty()) return false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto lo = reinterpret_cast<uintptr_t>(slices.front()->base());
  const auto hi = reinterpret_cast<uintptr_t>(slices.back()->base()) + slices.back()->length();
  return a >= lo && len <= hi - lo && a - lo <= hi - lo - len;
}

// ------------------------------------------------------------------------------ RemoteRegion

std::string RemoteRegion::Serialize() const {
  std::string out(24, '\0');
  std::memcpy(out.data(), &address, 8);
  std::memcpy(out.data() + 8, &length, 8);
  std::memcpy(out.data() + 16, &key, 8);
  return out + raw_key;
}

Result<RemoteRegion> RemoteRegion::Parse(const std::string& bytes) {
  if (bytes.size() < 24) {
    return InvalidArgument("remote region descriptor of " + std::to_string(bytes.size()) +
                           " bytes is too short (need at least 24)");
  }
  RemoteRegion r;
  std::memcpy(&r.address, bytes.data(), 8);
  std::memcpy(&r.length, bytes.data() + 8, 8);
  std::memcpy(&r.key, bytes.data() + 16, 8);
  r.raw_key = bytes.substr(24);
  return r;
}

}  // namespace rayfabric::fabric

namespace rayfabric::fabric {

// ------------------------------------------------------------------------- remote ranges

std::vector<RemoteSlice> DescribeRange(const RegisteredRange& range) {
  std::vector<RemoteSlice> out;
  for (const auto& slice : range.slices) out.push_back({slice->Describe(), 0, slice->length()});
  return out;
}

namespace {

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
bool Take(const std::string& in, size_t& at, T& value) {
  if (in.size() - at < sizeof(value)) return false;
  std::memcpy(&value, in.data() + at, sizeof(value));
  at += sizeof(value);
  return true;
}

}  // namespace

std::string SerializeRemoteRange(const std::vector<RemoteSlice>& slices) {
  std::string out;
  Append(out, static_cast<uint32_t>(slices.size()));
  for (const RemoteSlice& slice : slices) {
    Append(out, slice.offset);
    Append(out, slice.length);
    const std::string region = slice.region.Serialize();
    Append(out, static_cast<uint32_t>(region.size()));
    out += region;
  }
  return out;
}

Result<std::vector<RemoteSlice>> ParseRemoteRange(const std::string& bytes) {
  const auto truncated = [&] {
    return InvalidArgument("remote range descriptor of " + std::to_string(bytes.size()) +
                           " bytes is truncated");
  };
  size_t at = 0;
  uint32_t count = 0;
  if (!Take(bytes, at, count)) return truncated();
  std::vector<RemoteSlice> out;
  for (uint32_t i = 0; i < count; ++i) {
    RemoteSlice slice;
    uint32_t region_size = 0;
    if (!Take(bytes, at, slice.offset) || !Take(bytes, at, slice.length) ||
        !Take(bytes, at, region_size) || bytes.size() - at < region_size) {
      return truncated();
    }
    RF_ASSIGN_OR_RETURN(slice.region, RemoteRegion::Parse(bytes.substr(at, region_size)));
    at += region_size;
    if (slice.length == 0 || slice.offset > slice.region.length ||
        slice.length > slice.region.length - slice.offset) {
      return InvalidArgument("remote range slice " + std::to_string(i) + " (" +
                             std::to_string(slice.length) + " bytes at offset " +
                             std::to_string(slice.offset) + ") does not fit its region of " +
                             std::to_string(slice.region.length) + " bytes");
    }
    out.push_back(std::move(slice));
  }
  if (at != bytes.size()) return InvalidArgument("remote range descriptor has trailing bytes");
  return out;
}

}  // namespace rayfabric::fabric
