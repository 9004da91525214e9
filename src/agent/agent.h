// The node agent (rayfabricd): composes this node's plasma store (src/plasma) and the fabric
// engine (src/fabric), one component per job: the store connections, the fabrics and their
// registered segments, the lease server (serves leases on local objects to remote readers), the
// puller (pulls remote objects into the local store by fi_read), the release queue (gives this
// node's leases back), the counters. The gRPC faces (peer_service.cc, local_service.cc) and the
// pull socket are thin adapters over Agent. It meets the world at two seams: the node's store
// (LocalStore) and other nodes' agents (PeerCalls).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agent.pb.h"
#include "agent/auth.h"
#include "agent/counters.h"
#include "agent/fallback_counts.h"
#include "agent/lease_server.h"
#include "agent/local_store.h"
#include "agent/node_fabrics.h"
#include "agent/peer_calls.h"
#include "agent/puller.h"
#include "agent/release_queue.h"
#include "agent/store_connections.h"
#include "agent/store_warmer.h"
#include "agent/wire.h"
#include "rayfabric/config.h"
#include "rayfabric/status.h"

namespace rayfabric::agent {

namespace v1 = ::rayfabric::v1;

struct AgentOptions {
  std::string plasma_socket;
  std::string ray_version;  // ray.__version__ of the cluster: the plasma client checks it
  std::string node_id;      // 28 raw bytes: the Ray node this agent serves
  std::string listen_host;  // the node's IP (the --listen host): fabrics run on its interface
  Config config = Config::FromEnvironment();
  Credentials credentials = Credentials::Insecure();  // for calls to other agents
};

// Where the agent meets the world; each left empty is the real one. A unit test replaces them to
// run agents without Ray, and to inject what a real store or peer cannot be made to do.
struct AgentSeams {
  StoreConnector connect_store;      // empty: the plasma store at AgentOptions::plasma_socket
  std::unique_ptr<PeerCalls> peers;  // null: gRPC, with AgentOptions::credentials
  // false: the engines never reset an endpoint to cut off a failed read's operations, as on a
  // provider whose registrations are bound to the endpoint (FI_MR_ENDPOINT in its mr_mode; none
  // of those here has it); the replica such a read targets is then quarantined until the read
  // drains. For tests of that path.
  bool reset_undrained_endpoints = true;
};

class Agent {
 public:
  // Connects to the store (twice: one connection serves leases, one creates replicas, so that
  // a pull waiting for room in a full store never blocks serving) and opens one engine per
  // fabric this node speaks.
  static Result<std::unique_ptr<Agent>> Open(AgentOptions options, AgentSeams seams = {});
  ~Agent();  // unpins everything still leased
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  v1::InfoReply Info() const;
  // `requester`: who asks (the peer's host, from the connection), for the per-requester bound.
  v1::LeaseReply Lease(const v1::LeaseRequest& request, const std::string& requester) {
    return lease_server_->Lease(request, requester);
  }
  v1::ReleaseReply Release(const v1::ReleaseRequest& request) {
    return lease_server_->Release(request);
  }
  // `deadline`: the caller's own (gRPC) deadline, if earlier than the request's timeout_ms;
  // `cancelled`: true once the caller went away (the pull then stops at its next step and cuts
  // its reads off).
  v1::PullReply Pull(
      const v1::PullRequest& request,
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
      std::function<bool()> cancelled = nullptr) {
    return puller_->Pull(request, deadline, std::move(cancelled));
  }
  // The version and item count of a Pull, as every face that serves Pull checks them (gRPC's
  // local socket, the pull socket); counted when refused.
  Status CheckPullRequest(const v1::PullRequest& request) {
    return puller_->CheckPullRequest(request);
  }
  v1::StatusReply GetStatus() const;
  // What the processes of this node left to Ray's own transfer (GetStatus reports it).
  void ReportFallbacks(const v1::ReportFallbacksRequest& request);

  // What the service faces count (refusals decided before the agent is called).
  void CountRefusal(Count why) { counters_.Add(why); }

 private:
  Agent(AgentOptions options, AgentSeams seams, StorePtr serve_store, StorePtr pull_store,
        std::unique_ptr<NodeFabrics> fabrics, uint64_t max_lease_bytes_per_peer);

  // The constructor's work once the warmer runs: the store connections, the release queue, the
  // lease server, the puller, the sweeper.
  void MakeComponents(StoreConnector connect_store, StorePtr serve_store, StorePtr pull_store,
                      uint64_t max_lease_bytes_per_peer);
  void OnSegmentMapped(const plasma::SegmentInfo& segment);  // kept warm (warmer_)
  void OnSegmentUnmapped(const plasma::SegmentInfo& segment);
  void SweepLoop();

  const AgentOptions options_;
  Counters counters_;
  FallbackCounts fallbacks_;
  // When this agent started serving: `rayfabric status` reports rates since then.
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  // The components, made by the constructor in this order (each is given those it uses; the
  // warmer asks about two made after it, through ready_). ~Agent takes them apart in the order a
  // shutdown needs: background pulls stopped, releases drained, sweeper joined, leases unpinned,
  // engines closed (no read can land any more), quarantine cleared, store connections closed,
  // segments forgotten, warmer stopped (its thread; the object outlives the Puller, which uses it).
  std::unique_ptr<PeerCalls> peers_;
  std::unique_ptr<NodeFabrics> fabrics_;  // fixed after Open
  // This process's mapping of the store, kept warm (config warm_store); its thread stopped in
  // ~Agent once the store connections (whose unmaps it hears of) are gone. It asks whether the
  // lease server or the puller is busy only once every component is made (ready_); should the
  // constructor throw, its thread is stopped before the members go. Declared before every
  // component: it is destroyed after them, so the Puller's reference to it never dangles.
  std::unique_ptr<StoreWarmer> warmer_;
  std::atomic<bool> ready_{false};
  std::unique_ptr<StoreConnections> stores_;
  // This node's leases given back to their sources (off the Pulls' critical path); stopped by
  // ~Agent before what the releases' calls use goes.
  std::unique_ptr<ReleaseQueue> releases_;
  std::unique_ptr<LeaseServer> lease_server_;
  std::unique_ptr<Puller> puller_;

  // Every 100 ms: expired leases unpinned, drained quarantined replicas and fulfilled abandoned
  // creates aborted, retired store connections closed.
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool stopping_ = false;
  std::thread sweeper_;
};

}  // namespace rayfabric::agent
