// The fabric engine: one code path for verbs, efa, tcp, sockets and shm over libfabric RDM
// endpoints. It knows nothing of Ray: it registers memory, hands out remote descriptors, and moves
// bytes with fi_read / fi_write, chunked, several operations in flight, completions driven by its
// own progress thread (which also serves remote readers on manual-progress providers).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rayfabric/config.h"
#include "rayfabric/status.h"

namespace rayfabric::fabric {

// What the chosen provider demands and allows, read from fi_info in one place (provider.cc).
struct ProviderProfile {
  std::string provider;  // e.g. "verbs;ofi_rxm", "tcp;ofi_rxm", "efa", "sockets"
  std::string domain;    // e.g. "rxe0", "mlx5_0", "eth0"
  std::string fabric;
  bool rdma = false;         // hardware (or Soft-RoCE) RDMA, not a socket emulation
  bool local_desc = false;   // FI_MR_LOCAL: local buffers need their own descriptor
  bool virt_addr = false;    // FI_MR_VIRT_ADDR: remote addresses are virtual addresses
  bool prov_key = false;     // FI_MR_PROV_KEY: the provider picks the key
  bool endpoint_mr = false;  // FI_MR_ENDPOINT: regions are bound to the endpoint
  bool raw_key = false;      // FI_MR_RAW: keys larger than 64 bits, mapped by the reader
  bool allocated = false;    // FI_MR_ALLOCATED: only backed memory may be registered
  uint64_t mr_mode = 0;
  size_t key_size = 8;
  size_t max_msg_size = 0;
  size_t rma_iov_limit = 1;
  // The largest single registration (config max_registration; libfabric 1.17 exposes no such
  // limit in fi_info): larger ranges are registered in slices (Engine::RegisterRange).
  uint64_t max_registration_bytes = 0;
  bool manual_progress = true;  // the target must drive progress for one-sided ops to finish
  // Bytes of a posted operation can land without this process driving progress: hardware RDMA
  // (the NIC writes read responses into memory) or a provider with its own progress thread
  // (sockets). False for tcp and net: then an endpoint nobody polls moves nothing.
  bool bytes_move_without_progress = false;
  bool thread_safe = false;
  // FI_ADDR_STR (shm: a name holding the process id): addresses differ in length between peers;
  // every other format has one fixed length, checked against this endpoint's own.
  bool string_address = false;
  // The provider names a shared resource of each endpoint after the endpoint's source address,
  // by default the process id (shm: its region /dev/shm/<pid>:<uid>:<n>, which a SIGKILLed
  // process leaves behind; a later process given the same pid then fails fi_enable with EBUSY).
  // The engine gives each such endpoint a source address of its own that no process repeats.
  bool names_endpoint_by_pid = false;

  // Key lifetime, decided once from the provider's name and the user's FI_* variables (read,
  // never set; see ProfileFromInfo). The lease design relies on these: a descriptor handed out for
  // a region must stop working when the region is deregistered, or the lease is only advisory.
  //
  // checks_remote_keys: the TARGET provider refuses RMA with a key it never handed out. False for
  //   shm: libfabric's shm provider reads and writes the peer with process_vm_readv/writev (CMA)
  //   and never looks at the key; only the OS (same uid / ptrace rights) protects the memory.
  // mr_cache: registrations go through libfabric's util MR cache (prov/util/src/util_mr_cache.c):
  //   fi_close(mr) only drops a reference and the ibv MR stays registered (LRU, up to
  //   FI_MR_CACHE_MAX_COUNT=1024 entries) until the cache is full or the memory monitor sees the
  //   pages unmapped. verbs (every domain, hence verbs;ofi_rxm and verbs;ofi_rxd) uses it unless
  //   FI_MR_CACHE_MAX_COUNT=0 or FI_MR_CACHE_MONITOR=disabled; efa uses its own instance of it
  //   unless the domain runs with FI_MR_LOCAL (rayfabric asks for it) or FI_EFA_MR_CACHE_ENABLE=0.
  // deregistration_revokes_keys: a peer holding the key of a region that was deregistered here
  //   can no longer read or write it. True only where that is known: the provider checks keys and
  //   does not cache registrations. False where the key stays usable (MR cache, shm) or where we
  //   do not know (unranked providers): never rely on revocation then; leases still bound what is
  //   handed out, but only unmapping the memory really ends access.
  bool checks_remote_keys = true;
  bool mr_cache = false;
  bool deregistration_revokes_keys = true;
  std::string key_lifetime;  // one line: why deregistration_revokes_keys has its value
  // enforces_access: a registration grants peers no more than the access it asked for (above
  //   all, no remote WRITE on a region registered for remote read). False where libfabric 1.17
  //   widens it: its verbs MR cache registers EVERY region with remote read, write and atomic
  //   access (verbs_mr.c, vrb_mr_cache_add_region; seen in the Soft-RoCE suite: a write through
  //   a read-only descriptor changed the target's bytes), and shm checks nothing. The agent
  //   refuses to serve on such a provider unless allow_unprotected_memory is set.
  bool enforces_access = true;
  std::string access_note;  // one line: why enforces_access has its value

  // device_memory: the endpoint was opened with FI_HMEM (asked for by EngineOptions::device_memory
  //   and offered by the provider: verbs and efa built with CUDA, shm): device buffers (CUDA) are
  //   registered as they are (fi_mr_regattr with their iface) and read into or out of directly,
  //   without a host copy. Whether this libfabric can really register CUDA memory (built with
  //   CUDA, driver present) shows only at the first such registration.
  bool device_memory = false;
  std::string device_memory_note;  // one line: why device_memory has its value
};

// One provider/domain libfabric offered, and what we made of it.
struct ProviderCandidate {
  std::string provider;
  std::string domain;
  std::string ip;  // the domain's own IP address (tcp, sockets, verbs on IP), if it has one
  int rank = 0;
  bool rdma = false;
  std::string verdict;  // "chosen: ..." or why it was passed over
};

// A fabric a node opens: its provider and domain (one line each, for reports and peers).
struct FabricSummary {
  std::string provider;
  std::string domain;
  std::string fabric;
  bool rdma = false;
  int rail = 0;  // 0: the provider's domain; 1..: further domains large transfers stripe across
};

struct ProviderReport {
  ProviderProfile chosen;
  std::vector<ProviderCandidate> candidates;
  std::string reason;  // one line: why this provider (and this domain)
  // Every fabric the same selection opens, best first (chosen is one of them): an agent opens
  // them all, so that each peer is reached on the best provider both sides have.
  std::vector<FabricSummary> fabrics;
  std::string ToString() const;
  std::string ToJson() const;
};

// What an engine's endpoint offers peers. The agent never lets a peer write: its endpoint does
// not ask for FI_REMOTE_WRITE and its registrations never grant it. Only the benchmark (and tests)
// open engines whose own buffers peers may write.
struct EngineOptions {
  bool remote_write = false;
  // The IP address this node is known by (the agent's --listen host, i.e. the node's Ray IP).
  // Among domains of one provider, the one holding it is chosen (then any non-loopback one): on a
  // host with several interfaces, the fabric then runs where Ray's own traffic does.
  std::string preferred_ip;
  // Ask each selected provider and domain for FI_HMEM as well; where it offers it, the engine
  // registers device (CUDA) memory directly (ProviderProfile::device_memory). Providers without
  // it (tcp in libfabric up to 2.x, sockets) open as without this option. Off for the agent:
  // plasma objects are host memory.
  bool device_memory = false;
};

// The engine's settings, typed. FromConfig reads them from the configuration table (provider,
// domain, require_rdma, max_rails, chunk_size, max_inflight, op_timeout_ms, drain_timeout_ms,
// max_registration, progress_spin_us) after validating the whole table once; the engine and the
// provider selection read nothing else of the table (FI_PROVIDER, libfabric's own, still limits
// what fi_info offers). Settings made by hand are checked for what the engine needs (Check).
struct EngineSettings {
  std::vector<std::string> providers;  // empty: rank what fi_info offers
  std::vector<std::string> domains;    // empty: the domain holding the node's IP, and so on
  bool require_rdma = false;
  int max_rails = 1;
  uint64_t chunk_size = 0;  // largest single operation (capped by the provider's max_msg_size)
  size_t max_inflight = 0;  // operations in flight per transfer
  std::chrono::milliseconds op_timeout{0};     // no operation completed this long: TimedOut
  std::chrono::milliseconds drain_timeout{0};  // a failed transfer's operations still out: reset
  uint64_t max_registration = 0;               // larger ranges are registered in slices
  std::chrono::microseconds progress_spin{0};  // the progress thread polls this long, then blocks
  // Whether a failed transfer whose operations do not drain has its endpoint reset. Never where
  // registrations are bound to the endpoint (FI_MR_ENDPOINT): there the transfer is reported with
  // its operations outstanding (Transfer::Quiesced false) whatever this says. Not a setting of
  // the table: false only for tests of that path on providers that could reset.
  bool reset_undrained_endpoints = true;

  static Result<EngineSettings> FromConfig(const Config& config);
  // InvalidArgument naming the first field the engine cannot work with (a zero chunk size,
  // operation count or timeout, a registration under a page, no rail); run by every selection.
  Status Check() const;
};

// Ranks what fi_info offers for RDM endpoints with RMA and picks the fabrics to open (config:
// provider, domain, require_rdma), best first; does not open anything.
//   provider empty: the best RDMA provider (if any) and the best socket provider (tcp, net,
//     sockets: what every node has) unless require_rdma; provider "a,b": exactly those.
//   domain: applies to every chosen provider that offers it (an error if none does); otherwise
//     each provider's domain holding options.preferred_ip, else its first non-loopback one.
// SelectProvider reports the first (best); its `fabrics` lists them all.
Result<ProviderReport> SelectProvider(const EngineSettings& settings,
                                      const EngineOptions& options = {});
// The same, with the settings read from `config` (EngineSettings::FromConfig).
Result<ProviderReport> SelectProvider(const Config& config, const EngineOptions& options = {});

// What a registration allows. The exposure of a region is exactly its remote bits: a source needs
// kRemoteRead only, a destination kLocalRead only (it is written by this process's fi_read).
enum Access : uint32_t {
  kLocalRead = 1u << 0,    // destination of this process's fi_read
  kLocalWrite = 1u << 1,   // source of this process's fi_write
  kRemoteRead = 1u << 2,   // peers may fi_read it
  kRemoteWrite = 1u << 3,  // peers may fi_write it (needs EngineOptions::remote_write)
};
constexpr uint32_t kLocalAccess = kLocalRead | kLocalWrite;

// Where registered memory lives: host memory, or a CUDA device's (an engine with
// ProviderProfile::device_memory only).
struct MemoryLocation {
  enum class Kind { kHost, kCuda };
  Kind kind = Kind::kHost;
  int device = 0;  // CUDA device ordinal
  bool host() const { return kind == Kind::kHost; }
  bool operator==(const MemoryLocation& o) const {
    return kind == o.kind && (kind == Kind::kHost || device == o.device);
  }
  std::string ToString() const;  // "host memory", "CUDA device 0 memory"
};

enum class Sharing {
  kShared,   // a registered region with the same access that covers the range serves it (cache)
  kPrivate,  // a registration (and key) of its own: revoked when the last reference goes, whatever
             // else is registered (per-lease exposure)
};

// Everything a remote peer needs to read or write a registered region. Serializable; hand it out
// over an authenticated channel only: anyone holding it can access the region.
struct RemoteRegion {
  uint64_t address = 0;  // base for RMA addressing: a virtual address or 0 (offset addressing)
  uint64_t length = 0;
  uint64_t key = 0;
  std::string raw_key;  // non-empty for FI_MR_RAW providers (the reader maps it)

  std::string Serialize() const;
  static Result<RemoteRegion> Parse(const std::string& bytes);
};

// Where a peer's engine listens: its provider, fabric and domain, and the provider's opaque
// address bytes. An engine adds only peers of its own provider: addresses of two providers may
// have the same length and format (sockets and tcp;ofi_rxm: both a sockaddr_in) but never work
// with each other.
struct FabricAddress {
  std::string provider;
  std::string fabric;
  std::string domain;
  std::string bytes;

  std::string Describe() const;  // "tcp;ofi_rxm/eth0"
  // For tests and the benchmark; the agent carries the fields in its protobuf messages.
  std::string Serialize() const;
  static Result<FabricAddress> Parse(const std::string& serialized);
};

class EngineCore;

// A registered memory region; deregistered when the last reference goes.
class MemoryRegion {
 public:
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* base() const { return base_; }
  size_t length() const { return length_; }
  bool Contains(const void* p, size_t len) const;
  RemoteRegion Describe() const;
  void* local_desc() const;
  uint32_t access() const { return access_; }
  const MemoryLocation& location() const { return location_; }

 private:
  friend class EngineCore;
  MemoryRegion() = default;
  std::shared_ptr<EngineCore> core_;
  void* base_ = nullptr;
  size_t length_ = 0;
  struct fid_mr* mr_ = nullptr;
  uint64_t key_ = 0;
  std::string raw_key_;
  uint32_t access_ = 0;
  Sharing sharing_ = Sharing::kShared;
  MemoryLocation location_;
};

// A range registered in slices no larger than one registration may be (the profile's
// max_registration_bytes: EFA caps one registration with remote access at 1M pages, 4 GiB with
// 4 KiB pages), contiguous and in address order.
struct RegisteredRange {
  std::vector<std::shared_ptr<MemoryRegion>> slices;
  // The slice holding byte `p`, or null.
  const MemoryRegion* SliceFor(const void* p) const;
  bool Contains(const void* p, size_t len) const;
};

// One part of a remote range: `length` bytes at `offset` in `region`. A remote object is the
// concatenation of its slices, in order.
struct RemoteSlice {
  RemoteRegion region;
  uint64_t offset = 0;
  uint64_t length = 0;
};

using PeerId = uint64_t;

// The part of `slices` (a remote range, the concatenation of its slices) from byte `offset` for
// `length` bytes; OutOfRange if the slices hold fewer.
Result<std::vector<RemoteSlice>> SubSlices(const std::vector<RemoteSlice>& slices, uint64_t offset,
                                           uint64_t length);

// The slices that describe all of `range` to a peer, in order.
std::vector<RemoteSlice> DescribeRange(const RegisteredRange& range);
// A remote range as bytes, for carriers without a message of their own for it (the Python
// binding): a 32-bit count, then per slice its offset and length (64-bit) and its region
// descriptor (32-bit length-prefixed). ParseRemoteRange is strict: truncated or trailing bytes, an
// empty slice or a slice longer than its region are InvalidArgument.
std::string SerializeRemoteRange(const std::vector<RemoteSlice>& slices);
Result<std::vector<RemoteSlice>> ParseRemoteRange(const std::string& bytes);

// One local <-> remote span of a transfer. `local` must lie inside `local_region`.
struct RmaSpan {
  void* local = nullptr;
  size_t length = 0;
  uint64_t remote_offset = 0;  // from the start of the remote region
};

enum class RmaOp { kRead, kWrite };

class TransferState;

// A transfer in flight. Wait() may be called from any thread; dropping the handle does not cancel.
//
// A transfer that fails (an error, or no completion for op_timeout_ms) is not reported done while
// any of its operations may still move bytes: the engine tears down the connection to that peer
// (which makes the provider flush what it had posted) and reports the failure once every posted
// operation has come back. Only if the provider does not return them within the drain bound
// (drain_timeout_ms) is the failure reported with operations still outstanding: then Quiesced()
// is false and the local buffer must not be reused until it turns true (WaitQuiesced).
class Transfer {
 public:
  Transfer() = default;
  explicit Transfer(std::shared_ptr<TransferState> state) { parts_.push_back(std::move(state)); }
  // One transfer made of several (e.g. one per registration slice): done when all are, its status
  // the first failure among them; Cancel cancels them all.
  static Transfer Join(const std::vector<Transfer>& transfers);
  // A transfer that already failed with `why` (nothing posted).
  static Transfer Failed(const std::string& what, Status why);
  // `started` (posted parts of one range) when a later part (`what`) could not start: cancelled
  // (and drained by the usual rules), and failing with `why` even if every posted part already
  // finished, since their bytes are not the whole range.
  static Transfer PartlyStarted(std::vector<Transfer> started, const std::string& what,
                                const Status& why);
  // Returns the transfer's final status, or TimedOut if `timeout` passes first (the transfer
  // fails by itself once no operation has completed for op_timeout_ms).
  Status Wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max()) const;
  bool Done() const;
  uint64_t bytes() const;
  // True when no operation of this transfer is outstanding: nothing can write its local buffer
  // (or read it) any more. Always true for a transfer that succeeded.
  bool Quiesced() const;
  // Waits until Quiesced(); false if `timeout` passed first.
  bool WaitQuiesced(std::chrono::milliseconds timeout) const;
  // Fails the transfer (Aborted, with `why`) unless it already finished; Wait() then returns once
  // it is drained as above. For callers whose own deadline passed.
  void Cancel(const std::string& why) const;

 private:
  std::vector<std::shared_ptr<TransferState>> parts_;
};

struct EngineStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t ops_posted = 0;
  uint64_t ops_failed = 0;
  uint64_t transfers_ok = 0;
  uint64_t transfers_failed = 0;
  uint64_t regions_registered = 0;  // currently registered
  uint64_t peers = 0;
  uint64_t endpoint_resets = 0;      // to cut off operations a failed transfer could not drain
  uint64_t transfers_undrained = 0;  // failed with operations outstanding and no reset possible
};

class Engine {
 public:
  // Selects the provider, opens fabric/domain/endpoint/AV/CQ, starts the progress thread and
  // logs once which provider is used and why. Opens the best fabric SelectProvider chose.
  static Result<std::unique_ptr<Engine>> Open(const EngineSettings& settings,
                                              const EngineOptions& options = {});
  // One engine per fabric SelectProvider chose, best first (the agent: one per fabric class).
  static Result<std::vector<std::unique_ptr<Engine>>> OpenAll(const EngineSettings& settings,
                                                              const EngineOptions& options = {});
  // The same, with the settings read from `config` (EngineSettings::FromConfig).
  static Result<std::unique_ptr<Engine>> Open(const Config& config,
                                              const EngineOptions& options = {});
  static Result<std::vector<std::unique_ptr<Engine>>> OpenAll(const Config& config,
                                                              const EngineOptions& options = {});
  ~Engine();

  const ProviderReport& report() const;
  const ProviderProfile& profile() const;

  // This endpoint's fabric address, to send to peers once.
  FabricAddress Address() const;
  // Inserts a peer's address into the address vector once; later calls return the same id.
  // InvalidArgument (naming both) for an address of another provider or of the wrong size.
  Result<PeerId> AddPeer(const FabricAddress& address);

  // Registers [base, base+length) with exactly `access` (Access bits). With Sharing::kShared a
  // range inside an already registered region of the same access returns that region
  // (registration cache). Where the application picks keys (no FI_MR_PROV_KEY) every key is drawn
  // at random from the provider's whole key space, so that a key cannot be guessed. Device memory
  // (`location` not host) needs an engine with ProviderProfile::device_memory
  // (InvalidArgument otherwise: stage it through host memory).
  Result<std::shared_ptr<MemoryRegion>> Register(void* base, size_t length,
                                                 uint32_t access = kLocalAccess,
                                                 Sharing sharing = Sharing::kShared,
                                                 const MemoryLocation& location = {});

  // Registers [base, base+length) in slices of at most max_registration_bytes (see Register),
  // each one starting at a multiple of that size from `base`.
  Result<RegisteredRange> RegisterRange(void* base, size_t length, uint32_t access,
                                        Sharing sharing = Sharing::kShared,
                                        const MemoryLocation& location = {});

  // Moves `length` bytes between local memory at `local` (inside `local_range`) and the remote
  // slices (their lengths add up to `length`): one transfer per piece that lies in one local and
  // one remote registration, joined.
  Result<Transfer> StartRange(RmaOp op, PeerId peer, const std::vector<RemoteSlice>& remote,
                              const RegisteredRange& local_range, void* local, size_t length);

  // Moves the spans between local memory (inside `local_region`) and `remote`, split into chunks
  // of at most chunk_size with up to max_inflight in flight. Validates every span first.
  Result<Transfer> Start(RmaOp op, PeerId peer, const RemoteRegion& remote,
                         const std::shared_ptr<MemoryRegion>& local_region,
                         const std::vector<RmaSpan>& spans);
  // Convenience: one span, waited for.
  Status Read(PeerId peer, const RemoteRegion& remote, uint64_t remote_offset,
              const std::shared_ptr<MemoryRegion>& local_region, void* local, size_t length);
  Status Write(PeerId peer, const RemoteRegion& remote, uint64_t remote_offset,
               const std::shared_ptr<MemoryRegion>& local_region, const void* local, size_t length);

  EngineStats stats() const;

 private:
  explicit Engine(std::shared_ptr<EngineCore> core);
  std::shared_ptr<EngineCore> core_;
};

// Which fabric a pair of nodes uses: the index in `mine` (this node's providers, best first) of the
// first one `theirs` also lists, or -1 when they share none (then the pair cannot use the fabric).
int ChooseShared(const std::vector<std::string>& mine, const std::vector<std::string>& theirs);

// One rail of a striped transfer: an engine on one domain (NIC) of a provider, the peer's
// endpoint on its matching domain, the whole remote range as registered there, and the local
// range as registered with this engine. Rails of one transfer all describe the same bytes.
struct Rail {
  Engine* engine = nullptr;
  PeerId peer = 0;
  const std::vector<RemoteSlice>* remote = nullptr;
  const RegisteredRange* local = nullptr;
};

// How many of `rails` a transfer of `length` bytes uses: each moves at least `min_stripe` bytes
// (0: all of them), and at least one.
size_t RailsFor(uint64_t length, size_t rails, uint64_t min_stripe);

// Moves `length` bytes at `local` striped across the first RailsFor(length, rails.size(),
// min_stripe) rails: rail i moves the i-th of as many contiguous stripes (64 KiB-aligned), each
// through its own engine, completions joined. One rail: exactly Engine::StartRange.
Result<Transfer> StartStriped(RmaOp op, const std::vector<Rail>& rails, void* local, size_t length,
                              uint64_t min_stripe);

}  // namespace rayfabric::fabric
