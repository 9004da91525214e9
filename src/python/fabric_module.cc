// rayfabric._fabric: the fabric engine inside a Python process (a Ray worker or actor), for memory
// the node agent cannot register (tensors in an actor's own heap). The same Engine as the agent's:
// provider selection, registration slices, chunked reads, op and drain timeouts. Python glue
// (python/rayfabric/rdt.py) decides what to register and when; nothing here knows of Ray.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rayfabric/config.h"
#include "rayfabric/fabric.h"
#include "rayfabric/status.h"

namespace py = pybind11;

namespace rayfabric::python {
namespace {

// A failed Status crossing into Python: rayfabric._fabric.FabricError with .code ("TIMED_OUT"...).
struct StatusError : std::runtime_error {
  StatusError(const Status& status, std::string code_name)
      : std::runtime_error(status.ToString()), code(std::move(code_name)) {}
  std::string code;
};

// StatusCodeName ("InvalidArgument") in Python's constant style ("INVALID_ARGUMENT").
std::string CodeName(StatusCode code) {
  std::string out;
  for (const char* c = StatusCodeName(code); *c != '\0'; ++c) {
    const bool upper = std::isupper(static_cast<unsigned char>(*c)) != 0;
    if (upper && !out.empty() && std::islower(static_cast<unsigned char>(c[-1])) != 0) out += '_';
    out += static_cast<char>(std::toupper(static_cast<unsigned char>(*c)));
  }
  return out;
}

void Check(const Status& status) {
  if (!status.ok()) throw StatusError(status, CodeName(status.code()));
}

template <typename T>
T Take(Result<T> result) {
  Check(result.status());
  return std::move(result).value();
}

// Seconds from Python (None: no limit) as a bound the engine's deadline arithmetic cannot overflow:
// at most a year.
std::chrono::milliseconds ToMillis(const py::object& timeout_s) {
  constexpr double kYearS = 365.0 * 24 * 3600;
  if (timeout_s.is_none()) return std::chrono::milliseconds(static_cast<int64_t>(kYearS * 1000));
  const double s = timeout_s.cast<double>();
  if (std::isnan(s)) Check(InvalidArgument("timeout_s is NaN"));
  return std::chrono::milliseconds(static_cast<int64_t>(std::clamp(s, 0.0, kYearS) * 1000.0));
}

// A registered buffer: all of [address, address+length), in slices as the provider allows.
class Region {
 public:
  Region(fabric::RegisteredRange range, uintptr_t address, size_t length, const void* engine)
      : range_(std::move(range)), address_(address), length_(length), engine_(engine) {}
  // The engine it is registered with: only that engine may read into it.
  const void* engine() const { return engine_; }
  uintptr_t address() const { return address_; }
  size_t length() const { return length_; }
  bool registered() const { return !range_.slices.empty(); }
  // What a peer needs to read it (serialized slices); hand it out over a trusted channel only.
  py::bytes Describe() const {
    if (!registered()) throw std::runtime_error("region is released");
    return py::bytes(fabric::SerializeRemoteRange(fabric::DescribeRange(range_)));
  }
  // Drops this handle's registration; transfers still using it keep it until they finish.
  void Release() { range_.slices.clear(); }
  const fabric::RegisteredRange& range() const { return range_; }

 private:
  fabric::RegisteredRange range_;
  uintptr_t address_;
  size_t length_;
  const void* engine_;
};

class Transfer {
 public:
  explicit Transfer(fabric::Transfer transfer) : transfer_(std::move(transfer)) {}
  // Raises FabricError when the transfer failed, TimeoutError when `timeout_s` passed first.
  void Wait(const py::object& timeout_s) const {
    const auto timeout = ToMillis(timeout_s);
    Status status;
    {
      py::gil_scoped_release release;
      status = transfer_.Wait(timeout);
    }
    if (status.code() == StatusCode::kTimedOut && !transfer_.Done()) {
      PyErr_SetString(PyExc_TimeoutError, status.ToString().c_str());  // still running
      throw py::error_already_set();
    }
    Check(status);
  }
  bool Done() const { return transfer_.Done(); }
  bool Quiesced() const { return transfer_.Quiesced(); }
  bool WaitQuiesced(const py::object& timeout_s) const {
    const auto timeout = ToMillis(timeout_s);
    py::gil_scoped_release release;
    return transfer_.WaitQuiesced(timeout);
  }
  void Cancel(const std::string& why) const { transfer_.Cancel(why); }
  uint64_t Bytes() const { return transfer_.bytes(); }

 private:
  fabric::Transfer transfer_;
};

class Engine {
 public:
  Engine(std::unique_ptr<fabric::Engine> engine, bool allow_unprotected)
      : engine_(std::move(engine)), allow_unprotected_(allow_unprotected) {}

  const fabric::ProviderProfile& profile() const { return engine_->profile(); }
  std::string Report() const { return engine_->report().ToString(); }
  py::bytes Address() const { return py::bytes(engine_->Address().Serialize()); }

  fabric::PeerId AddPeer(const std::string& serialized) {
    fabric::FabricAddress address = Take(fabric::FabricAddress::Parse(serialized));
    return Take(engine_->AddPeer(address));
  }

  // remote_read: peers holding the descriptor may fi_read it, until release (a registration of
  // its own, never shared, so that releasing it ends the exposure). Otherwise: a destination of
  // this engine's reads (shared with any registration that already covers it). cuda_device >= 0:
  // the buffer is that CUDA device's memory (an engine with device_memory only).
  std::shared_ptr<Region> Register(uintptr_t address, size_t length, bool remote_read,
                                   int cuda_device) {
    if (address == 0 || length == 0) {
      Check(InvalidArgument("register: empty buffer (address " + std::to_string(address) + ", " +
                            std::to_string(length) + " bytes)"));
    }
    const fabric::ProviderProfile& profile = engine_->profile();
    if (remote_read && !profile.enforces_access && !allow_unprotected_) {
      // The agent's rule: a "read-only" registration that peers could write is refused.
      Check(PermissionDenied(
          "provider " + profile.provider + " does not enforce registration access (" +
          profile.access_note +
          "): peers holding or guessing a key could write this buffer. Set "
          "FI_MR_CACHE_MONITOR=disabled for this process (verbs/efa), choose another provider "
          "(RAYFABRIC_PROVIDER), or accept the risk with RAYFABRIC_ALLOW_UNPROTECTED_MEMORY=true"));
    }
    const uint32_t access = remote_read ? fabric::kRemoteRead : fabric::kLocalRead;
    const auto sharing = remote_read ? fabric::Sharing::kPrivate : fabric::Sharing::kShared;
    fabric::MemoryLocation location;
    if (cuda_device >= 0) {
      location.kind = fabric::MemoryLocation::Kind::kCuda;
      location.device = cuda_device;
    }
    fabric::RegisteredRange range;
    {
      py::gil_scoped_release release;
      range = Take(engine_->RegisterRange(reinterpret_cast<void*>(address), length, access, sharing,
                                          location));
    }
    return std::make_shared<Region>(std::move(range), address, length, engine_.get());
  }

  // One read per item (local region, offset in it, remote range descriptor, offset in it, length),
  // all posted before any is waited for; one joined transfer.
  Transfer Read(fabric::PeerId peer, const std::vector<py::tuple>& items) {
    struct Item {
      std::shared_ptr<Region> local;
      fabric::RegisteredRange range;  // copied while the GIL is held: release() may run meanwhile
      uint64_t local_offset;
      std::vector<fabric::RemoteSlice> remote;
      uint64_t length;
    };
    std::vector<Item> parsed;
    for (size_t i = 0; i < items.size(); ++i) {
      const py::tuple& t = items[i];
      if (t.size() != 5) {
        Check(InvalidArgument("read item " + std::to_string(i) +
                              ": expected (region, local_offset, remote, remote_offset, length)"));
      }
      Item item;
      item.local = t[0].cast<std::shared_ptr<Region>>();
      item.local_offset = t[1].cast<uint64_t>();
      const auto all = Take(fabric::ParseRemoteRange(t[2].cast<std::string>()));
      const uint64_t remote_offset = t[3].cast<uint64_t>();
      item.length = t[4].cast<uint64_t>();
      if (!item.local || !item.local->registered()) {
        Check(InvalidArgument("read item " + std::to_string(i) + ": local region is released"));
      }
      if (item.local->engine() != engine_.get()) {
        Check(InvalidArgument("read item " + std::to_string(i) +
                              ": local region is registered with another engine"));
      }
      item.range = item.local->range();
      if (item.local_offset > item.local->length() ||
          item.length > item.local->length() - item.local_offset) {
        Check(OutOfRange("read item " + std::to_string(i) + ": " + std::to_string(item.length) +
                         " bytes at offset " + std::to_string(item.local_offset) +
                         " do not fit the local region of " + std::to_string(item.local->length()) +
                         " bytes"));
      }
      auto sub = fabric::SubSlices(all, remote_offset, item.length);
      if (!sub.ok()) Check(sub.status().WithContext("read item " + std::to_string(i)));
      item.remote = std::move(*sub);
      parsed.push_back(std::move(item));
    }
    std::vector<fabric::Transfer> started;
    py::gil_scoped_release release;
    for (size_t i = 0; i < parsed.size(); ++i) {
      const Item& item = parsed[i];
      if (item.length == 0) continue;
      void* local = reinterpret_cast<char*>(item.local->address()) + item.local_offset;
      auto transfer = engine_->StartRange(fabric::RmaOp::kRead, peer, item.remote, item.range,
                                          local, item.length);
      if (!transfer.ok()) {
        const std::string what = "read item " + std::to_string(i);
        if (started.empty()) Check(transfer.status().WithContext(what));
        return Transfer(
            fabric::Transfer::PartlyStarted(std::move(started), what, transfer.status()));
      }
      started.push_back(std::move(*transfer));
    }
    if (started.empty()) Check(InvalidArgument("read: every item is empty, nothing to read"));
    return Transfer(fabric::Transfer::Join(started));
  }

  py::dict Stats() const {
    const fabric::EngineStats s = engine_->stats();
    py::dict d;
    d["bytes_read"] = s.bytes_read;
    d["bytes_written"] = s.bytes_written;
    d["ops_posted"] = s.ops_posted;
    d["ops_failed"] = s.ops_failed;
    d["transfers_ok"] = s.transfers_ok;
    d["transfers_failed"] = s.transfers_failed;
    d["regions_registered"] = s.regions_registered;
    d["peers"] = s.peers;
    d["endpoint_resets"] = s.endpoint_resets;
    d["transfers_undrained"] = s.transfers_undrained;
    return d;
  }

 private:
  std::unique_ptr<fabric::Engine> engine_;
  bool allow_unprotected_;
};

// Every fabric the configuration selects, best first (as the agent opens them).
// device_memory: ask each provider for FI_HMEM too (Engine.device_memory says who offered it).
std::vector<std::shared_ptr<Engine>> OpenAll(const std::map<std::string, std::string>& overrides,
                                             const std::string& preferred_ip, bool device_memory) {
  Config config = Config::FromEnvironment();
  for (const auto& [name, value] : overrides) Check(config.Set(name, value));
  const bool allow_unprotected = Take(config.GetBool("allow_unprotected_memory"));
  fabric::EngineOptions options;
  options.preferred_ip = preferred_ip;
  options.device_memory = device_memory;
  std::vector<std::unique_ptr<fabric::Engine>> engines;
  {
    py::gil_scoped_release release;
    engines = Take(fabric::Engine::OpenAll(config, options));
  }
  std::vector<std::shared_ptr<Engine>> out;
  for (auto& e : engines) out.push_back(std::make_shared<Engine>(std::move(e), allow_unprotected));
  return out;
}

}  // namespace
}  // namespace rayfabric::python

PYBIND11_MODULE(_fabric, m) {
  using namespace rayfabric::python;  // NOLINT(google-build-using-namespace)
  m.doc() = "rayfabric's fabric engine in this process (see python/rayfabric/rdt.py)";

  static py::exception<StatusError> fabric_error(m, "FabricError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object error = py::handle(fabric_error.ptr())(e.what());
      error.attr("code") = e.code;
      PyErr_SetObject(fabric_error.ptr(), error.ptr());
    }
  });

  py::class_<Region, std::shared_ptr<Region>>(m, "Region")
      .def_property_readonly("address", &Region::address)
      .def_property_readonly("length", &Region::length)
      .def_property_readonly("registered", &Region::registered)
      .def("describe", &Region::Describe)
      .def("release", &Region::Release);

  py::class_<Transfer>(m, "Transfer")
      .def("wait", &Transfer::Wait, py::arg("timeout_s") = py::none())
      .def("done", &Transfer::Done)
      .def("quiesced", &Transfer::Quiesced)
      .def("wait_quiesced", &Transfer::WaitQuiesced, py::arg("timeout_s") = py::none())
      .def("cancel", &Transfer::Cancel, py::arg("why"))
      .def_property_readonly("bytes", &Transfer::Bytes);

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine")
      .def_property_readonly("provider", [](const Engine& e) { return e.profile().provider; })
      .def_property_readonly("domain", [](const Engine& e) { return e.profile().domain; })
      .def_property_readonly("fabric", [](const Engine& e) { return e.profile().fabric; })
      .def_property_readonly("rdma", [](const Engine& e) { return e.profile().rdma; })
      .def_property_readonly("enforces_access",
                             [](const Engine& e) { return e.profile().enforces_access; })
      .def_property_readonly("access_note", [](const Engine& e) { return e.profile().access_note; })
      .def_property_readonly("device_memory",
                             [](const Engine& e) { return e.profile().device_memory; })
      .def_property_readonly("device_memory_note",
                             [](const Engine& e) { return e.profile().device_memory_note; })
      .def("report", &Engine::Report)
      .def("address", &Engine::Address)
      .def("add_peer", &Engine::AddPeer, py::arg("address"))
      .def("register", &Engine::Register, py::arg("address"), py::arg("length"),
           py::arg("remote_read"), py::arg("cuda_device") = -1, py::keep_alive<0, 1>())
      .def("read", &Engine::Read, py::arg("peer"), py::arg("items"), py::keep_alive<0, 1>())
      .def("stats", &Engine::Stats);

  m.def("open_all", &OpenAll, py::arg("overrides") = std::map<std::string, std::string>{},
        py::arg("preferred_ip") = "", py::arg("device_memory") = false);
}
