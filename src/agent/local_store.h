// The node's object store as the agent uses it: the seam between the agent and plasma.
// PlasmaStore is the real one (a connection to the raylet's plasma store); the unit tests
// (tests/agent/agent_seams_test.cc) give the agent a store in this process's memory instead.
// Each call means what the same call of plasma::PlasmaClient means (include/rayfabric/
// plasma_client.h): one connection, whose pins and unsealed creates end when it is destroyed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rayfabric/object_id.h"
#include "rayfabric/plasma_client.h"
#include "rayfabric/status.h"

namespace rayfabric::agent {

class LocalStore {
 public:
  using SegmentCallback = plasma::PlasmaClient::SegmentCallback;
  virtual ~LocalStore() = default;

  virtual Result<std::vector<plasma::ObjectBuffer>> Get(const std::vector<ObjectId>& ids,
                                                        int64_t timeout_ms) = 0;
  virtual Result<plasma::ObjectBuffer> GetOne(const ObjectId& id, int64_t timeout_ms) = 0;
  virtual Status NotSealed(const ObjectId& id, int64_t timeout_ms) const = 0;
  virtual std::vector<Result<plasma::ObjectBuffer>> CreateMany(
      const std::vector<ObjectId>& ids, const std::vector<plasma::CreateOptions>& options) = 0;
  virtual Result<size_t> ReapAbandonedCreates() = 0;
  virtual size_t abandoned_creates() const = 0;
  virtual std::vector<Status> SealAndRelease(const std::vector<ObjectId>& ids) = 0;
  virtual Status Abort(const ObjectId& id) = 0;
  virtual Status Release(const ObjectId& id) = 0;
  virtual Result<bool> Contains(const ObjectId& id) = 0;
  virtual int64_t memory_capacity() const = 0;
  virtual bool healthy() const = 0;
  virtual std::vector<plasma::SegmentInfo> Segments() const = 0;
  virtual void SetSegmentCallbacks(SegmentCallback on_mapped, SegmentCallback on_unmapped) = 0;
};

// A new connection to the node's store.
using StoreConnector = std::function<Result<std::shared_ptr<LocalStore>>()>;

// The raylet's plasma store at `socket_path`, each connection as plasma::PlasmaClient::Connect
// makes it.
StoreConnector PlasmaStoreConnector(std::string socket_path, plasma::ConnectOptions options);

}  // namespace rayfabric::agent
