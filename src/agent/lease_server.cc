#include "agent/lease_server.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "agent/wire.h"
#include "rayfabric/log.h"
#include "rayfabric/object_id.h"

// The serve side: leases on this node's objects for a peer's reads (pinned in the store,
// registered or described on this node's fabric), and their release.
namespace rayfabric::agent {
namespace {

using Clock = std::chrono::steady_clock;

// Objects pinned by one plasma Get when leasing.
constexpr size_t kLeaseBatch = 4096;

}  // namespace

LeaseServer::LeaseServer(Options options, NodeFabrics& fabrics, StoreConnections& stores,
                         Counters& counters)
    : options_(options),
      fabrics_(fabrics),
      stores_(stores),
      counters_(counters),
      leases_(options.max_leases, options.max_lease_bytes_per_peer) {}

void LeaseServer::ExpireLeases() {
  for (const LeasedObject& o : leases_.TakeExpired()) {
    counters_.Add(Count::kLeasesExpired);
    RF_LOG(kWarn, "lease on object " << o.object.Hex() << " expired unreleased: unpinned");
    Unpin(o);
  }
}

void LeaseServer::UnpinAll() {
  for (const LeasedObject& o : leases_.TakeAll()) Unpin(o);
}

void LeaseServer::DropLeaseRegion(uint64_t lease_id) {
  std::vector<fabric::RegisteredRange> ranges;  // one per rail
  {
    std::lock_guard<std::mutex> lock(lease_regions_mu_);
    auto it = lease_regions_.find(lease_id);
    if (it == lease_regions_.end()) return;
    ranges = std::move(it->second);
    lease_regions_.erase(it);
  }
  ranges.clear();  // deregistered here, outside the lock: their keys stop working
}

void LeaseServer::Unpin(const LeasedObject& object) {
  // The lease's own key first (object exposure), then the pin: never a live key on memory the
  // store may reuse.
  DropLeaseRegion(object.lease_id);
  uint64_t generation = 0;
  StorePtr store = stores_.Serve(&generation);
  // A lease of a retired (broken) connection: its pin goes when that connection is closed, once
  // none of its leases is left (StoreConnections::SweepRetired).
  if (object.store_generation == generation) (void)store->Release(object.object);
}

void LeaseServer::RefuseLease(v1::Lease& lease, const Status& why) {
  counters_.Add(Count::kLeasesRefused);
  lease.set_error_code(ToErrorCode(why.code()));
  lease.set_error(why.message());
}

namespace {
// Where [data, data + bytes) lies in `range`: one slice per registration it crosses, in order.
void DescribeSlices(const fabric::RegisteredRange& range, const uint8_t* data, uint64_t bytes,
                    google::protobuf::RepeatedPtrField<v1::LeaseSlice>* out) {
  const uint8_t* const end = data + bytes;
  for (const auto& slice : range.slices) {
    const auto* base = static_cast<const uint8_t*>(slice->base());
    const uint8_t* from = std::max<const uint8_t*>(data, base);
    const uint8_t* to = std::min<const uint8_t*>(end, base + slice->length());
    if (from >= to) continue;
    v1::LeaseSlice* described = out->Add();
    described->set_region(slice->Describe().Serialize());
    described->set_offset(static_cast<uint64_t>(from - base));
    described->set_length(static_cast<uint64_t>(to - from));
  }
}
}  // namespace

void LeaseServer::GrantLease(Fabric& fab, size_t rails, v1::Lease& lease, const ObjectId& id,
                             const plasma::ObjectBuffer& obj, std::chrono::milliseconds ttl,
                             const std::string& requester, LocalStore& store, uint64_t generation) {
  // `obj` is pinned by our Get: every refusal below unpins it.
  const uint64_t bytes = obj.data_size + obj.metadata_size;
  // Described on as many rails as the reader will stripe it across (one for a small object).
  const size_t described =
      fabric::RailsFor(bytes, std::min(rails, fab.rails.size()), fabrics_.stripe_min());
  std::vector<fabric::RegisteredRange> regions;
  for (size_t rail = 0; rail < described; ++rail) {
    // Object exposure: a registration of this object's bytes alone (in slices if it is larger
    // than one may be), with keys of its own, dropped when the lease ends: the holder can read
    // this object and nothing else, and only while leased. Arena: the segment's registration.
    Result<fabric::RegisteredRange> region =
        fab.exposure == Exposure::kObject
            ? fab.rails[rail]->RegisterRange(obj.data, bytes, fabric::kRemoteRead,
                                             fabric::Sharing::kPrivate)
            : fabrics_.RegionFor(fab, rail, obj.segment_base, obj.segment_size);
    if (region.ok()) {
      regions.push_back(std::move(*region));
      continue;
    }
    if (rail > 0) {  // a further rail that cannot register it: the object moves on fewer
      RF_LOG(kWarn, "object " << id.Hex() << " not striped onto "
                              << fab.rails[rail]->profile().domain << ": " << region.status());
      break;
    }
    (void)store.Release(id);
    return RefuseLease(lease, region.status().WithContext(
                                  fab.exposure == Exposure::kObject
                                      ? "registering object " + id.Hex()
                                      : "registering the store memory of object " + id.Hex()));
  }
  // The lease and its regions appear together: an expiry or revocation racing with this grant
  // (DropLeaseRegion takes the same lock) always finds the regions to drop.
  std::unique_lock<std::mutex> regions_lock(lease_regions_mu_);
  auto grant = leases_.Grant(LeasedObject{id, bytes, requester, generation}, ttl);
  if (!grant.ok()) {
    regions_lock.unlock();
    regions.clear();
    (void)store.Release(id);
    return RefuseLease(lease, grant.status());
  }
  if (fab.exposure == Exposure::kObject) lease_regions_[grant->id] = regions;
  regions_lock.unlock();
  counters_.Add(Count::kLeasesGranted);
  counters_.Add(Count::kBytesLeased, bytes);
  lease.set_lease_id(grant->id);
  lease.set_token(grant->token);
  // Where the object's bytes lie: one slice per registration they cross, in order; on each
  // further rail, the same.
  DescribeSlices(regions.front(), obj.data, bytes, lease.mutable_slices());
  for (size_t rail = 1; rail < regions.size(); ++rail) {
    DescribeSlices(regions[rail], obj.data, bytes, lease.add_rails()->mutable_slices());
  }
  // The first slice also in the single-region fields, for readers that predate slices (an
  // object that crosses slices is then refused by their engine's range check).
  if (lease.slices_size() > 0) {
    lease.set_region(lease.slices(0).region());
    lease.set_offset(lease.slices(0).offset());
  }
  lease.set_data_size(obj.data_size);
  lease.set_metadata_size(obj.metadata_size);
  lease.set_expires_in_ms(static_cast<uint64_t>(ttl.count()));
}

void LeaseServer::LeaseBatch(Fabric& fab, size_t rails, v1::LeaseReply& reply,
                             const std::vector<int>& indices, const std::vector<ObjectId>& ids,
                             std::chrono::milliseconds ttl, const std::string& requester) {
  if (indices.empty()) return;
  uint64_t generation = 0;
  StorePtr store = stores_.Serve(&generation);
  // One store round trip for the whole batch. If the store refuses the batch (it validates
  // every id), each object is asked alone so that only the bad one is refused.
  std::optional<std::vector<plasma::ObjectBuffer>> pinned;
  if (indices.size() > 1) {
    auto got = store->Get(ids, 0);
    if (got.ok()) pinned = std::move(*got);
  }
  for (size_t k = 0; k < indices.size(); ++k) {
    v1::Lease& lease = *reply.mutable_leases(indices[k]);
    if (pinned) {
      if ((*pinned)[k].found) {
        GrantLease(fab, rails, lease, ids[k], (*pinned)[k], ttl, requester, *store, generation);
      } else {
        RefuseLease(lease, store->NotSealed(ids[k], 0));
      }
      continue;
    }
    auto one = store->GetOne(ids[k], 0);
    if (one.ok()) {
      GrantLease(fab, rails, lease, ids[k], *one, ttl, requester, *store, generation);
    } else {
      RefuseLease(lease, one.status());
    }
  }
}

v1::LeaseReply LeaseServer::Lease(const v1::LeaseRequest& request, const std::string& requester) {
  const Clock::time_point started = Clock::now();
  v1::LeaseReply reply = LeaseAll(request, requester);
  reply.set_served_s(std::chrono::duration<double>(Clock::now() - started).count());
  return reply;
}

v1::LeaseReply LeaseServer::LeaseAll(const v1::LeaseRequest& request,
                                     const std::string& requester) {
  v1::LeaseReply reply;
  // The best of this node's fabrics that the reader speaks too (an older reader lists none: the
  // best one).
  std::vector<std::string> mine;
  for (const Fabric& candidate : fabrics_.all()) mine.push_back(candidate.provider());
  const std::vector<std::string> theirs(request.reader_providers().begin(),
                                        request.reader_providers().end());
  Fabric* fab = nullptr;
  size_t reader_rails = 1;
  if (theirs.empty()) {
    fab = &fabrics_.all().front();
  } else if (const int chosen = fabric::ChooseShared(mine, theirs); chosen >= 0) {
    fab = &fabrics_.all()[static_cast<size_t>(chosen)];
    for (int i = 0; i < request.reader_providers_size(); ++i) {
      if (request.reader_providers(i) == fab->provider() && i < request.reader_rails_size() &&
          request.reader_rails(i) > 1) {
        reader_rails = request.reader_rails(i);
      }
    }
  }
  if (fab == nullptr) {
    std::string theirs;
    for (const std::string& provider : request.reader_providers()) {
      theirs += (theirs.empty() ? "" : ", ") + provider;
    }
    const Status none =
        Unavailable("no fabric in common: this node speaks " + fabrics_.List() + ", the reader (" +
                    requester + ") " + theirs + "; this pair of nodes uses Ray's own transfer");
    for (int i = 0; i < request.object_ids_size(); ++i) {
      v1::Lease* lease = reply.add_leases();
      lease->set_object_id(request.object_ids(i));
      RefuseLease(*lease, none);
    }
    return reply;
  }
  const fabric::FabricAddress address = fab->engine().Address();
  reply.set_fabric_address(address.bytes);
  reply.set_provider(address.provider);
  reply.set_domain(address.domain);
  reply.set_fabric(address.fabric);
  // As many rails as both nodes have; rail i of one pairs with rail i of the other.
  const size_t rails = std::min(reader_rails, fab->rails.size());
  for (size_t k = 1; k < rails; ++k) {
    const fabric::FabricAddress rail = fab->rails[k]->Address();
    v1::RailAddress* out = reply.add_rails();
    out->set_domain(rail.domain);
    out->set_fabric(rail.fabric);
    out->set_address(rail.bytes);
  }
  // A reader asks for as long as its pull may take; no longer than max_lease_ttl_ms.
  auto ttl =
      request.ttl_ms() > 0 ? std::chrono::milliseconds(request.ttl_ms()) : options_.default_ttl;
  ttl = std::min(ttl, options_.max_ttl);
  // Distinct ids in batches (the store pins an object once per Get; a request may list one id
  // twice and get two leases).
  std::vector<int> batch;
  std::vector<ObjectId> batch_ids;
  std::set<ObjectId> in_batch;
  auto flush = [&] {
    LeaseBatch(*fab, rails, reply, batch, batch_ids, ttl, requester);
    batch.clear();
    batch_ids.clear();
    in_batch.clear();
  };
  for (int i = 0; i < request.object_ids_size(); ++i) {
    v1::Lease* lease = reply.add_leases();
    lease->set_object_id(request.object_ids(i));
    auto id = ObjectId::FromBinary(request.object_ids(i));
    if (!id.ok()) {
      RefuseLease(*lease, id.status());
      continue;
    }
    if (in_batch.count(*id) > 0 || batch.size() == kLeaseBatch) flush();
    batch.push_back(i);
    batch_ids.push_back(*id);
    in_batch.insert(*id);
  }
  flush();
  return reply;
}

v1::ReleaseReply LeaseServer::Release(const v1::ReleaseRequest& request) {
  v1::ReleaseReply reply;
  for (const v1::LeaseRef& ref : request.leases()) {
    auto released = leases_.Release(ref.lease_id(), ref.token());
    Status s = released.status();
    if (released.ok()) {
      Unpin(*released);
      counters_.Add(Count::kLeasesReleased);
    }
    reply.add_error_codes(ToErrorCode(s.code()));
    reply.add_errors(s.ok() ? "" : s.message());
  }
  return reply;
}

}  // namespace rayfabric::agent
