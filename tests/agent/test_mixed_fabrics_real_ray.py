"""A mixed cluster on a REAL Ray: four nodes of one ray.cluster_utils.Cluster whose agents speak
different provider sets, as GPU nodes on EFA/InfiniBand next to CPU nodes on Ethernet do.

  n0, n1: tcp;ofi_rxm and sockets (RAYFABRIC_PROVIDER="tcp;ofi_rxm,sockets")
  n2:     sockets only
  n3:     libfabric restricted to udp (FI_PROVIDER=udp): no provider that reaches other hosts with
          RMA, so no agent can start there

Every cross-node get must return the right bytes; each pair must use the best provider both have
(n0<->n1 tcp, n2<->anyone sockets, as the agents' per-peer status says); n3 goes Ray's path at once
with the reason; no get waits on a transfer that cannot happen."""
import hashlib
import time

import numpy as np
import pytest
import ray

import rayfabric
from rayfabric import _agents
from rayfabric import agent_pb2 as pb
from rayfabric._client import AgentClient, error_name

from ray_test_cluster import agents_cluster, on, produce

MiB = 1 << 20
NODES = ("n0", "n1", "n2", "n3")
NODE_ENV = {
    "n0": {"RAYFABRIC_PROVIDER": "tcp;ofi_rxm,sockets"},
    "n1": {"RAYFABRIC_PROVIDER": "tcp;ofi_rxm,sockets"},
    "n2": {"RAYFABRIC_PROVIDER": "sockets"},
    "n3": {"FI_PROVIDER": "udp"},
}
# A get that cannot use the fabric must not wait for a transfer that cannot happen: far below the
# agents' op timeout it would otherwise sit out (a hang detector, not a speed threshold).
AGENT_ENV = {"RAYFABRIC_OP_TIMEOUT_MS": "60000"}
NO_WAIT_S = 30


@pytest.fixture(scope="module")
def cluster():
    with agents_cluster(NODES, store_bytes=400 * MiB, env=AGENT_ENV, node_env=NODE_ENV) as c:
        yield {"nodes": c["nodes"], "records": c["records"]}


@ray.remote(num_cpus=0)
def fetch(refs):
    import rayfabric as rf
    before = rf.stats()
    t0 = time.monotonic()
    values = rf.get(refs, timeout=120)
    after = rf.stats()
    return {"digests": [hashlib.sha256(v.tobytes()).hexdigest() for v in values],
            "pulled": after["objects_pulled"] - before["objects_pulled"],
            "fallbacks": after["fallbacks"] - before["fallbacks"],
            "reasons": after["fallback_reasons"], "seconds": time.monotonic() - t0}


def expected(nbytes, seed):
    return hashlib.sha256(np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)
                          .tobytes()).hexdigest()


def status_of(cluster, name):
    return rayfabric.status()["agents"][cluster["nodes"][name]]


def test_agents_advertise_every_fabric_they_speak(cluster):
    nodes, records = cluster["nodes"], cluster["records"]
    for name in ("n0", "n1"):
        info = AgentClient(records[nodes[name]]["address"]).info()
        assert [f.provider for f in info.fabrics] == ["tcp;ofi_rxm", "sockets"], info
        assert info.provider == "tcp;ofi_rxm" and all(f.address and f.reason for f in info.fabrics)
        assert [f["provider"] for f in records[nodes[name]]["fabrics"]] == ["tcp;ofi_rxm", "sockets"]
    info = AgentClient(records[nodes["n2"]]["address"]).info()
    assert [f.provider for f in info.fabrics] == ["sockets"], info
    # n3 has no agent, and the reason is recorded where gets look for it.
    assert nodes["n3"] not in records
    why = _agents.unavailable()[nodes["n3"]]
    assert "no provider that reaches other hosts" in why, why


def test_each_pair_uses_the_best_provider_both_have(cluster):
    nodes, records = cluster["nodes"], cluster["records"]
    best = {frozenset(("n0", "n1")): "tcp;ofi_rxm", frozenset(("n0", "n2")): "sockets",
            frozenset(("n1", "n2")): "sockets"}
    # A fresh object per ordered pair (one holder: the reader cannot pick a replica elsewhere).
    pairs = [(reader, source) for reader in ("n0", "n1", "n2") for source in ("n0", "n1", "n2")
             if reader != source]
    for k, (reader, source) in enumerate(pairs):
        nbytes, seed = (4 + 2 * k) * MiB, 70 + k
        ref = on(source, produce).remote(nbytes, seed)
        ray.wait([ref], fetch_local=False, timeout=120)
        out = ray.get(on(reader, fetch).remote([ref]), timeout=180)
        assert out["digests"] == [expected(nbytes, seed)], (reader, source)
        assert out["pulled"] == 1 and out["fallbacks"] == 0, (reader, source, out["reasons"])
    # Each reader's agent says, per source, which provider the pair used.
    for reader, source in pairs:
        links = {link["peer"]: link for link in status_of(cluster, reader)["peer_links"]}
        link = links[records[nodes[source]]["address"]]
        assert link["provider"] == best[frozenset((reader, source))], (reader, source, link)
        assert link["objects_pulled"] >= 1 and link["pulls_failed"] == 0, link
        assert link["domain"] and link["peer_domain"], link


def test_a_node_without_an_agent_goes_rays_path_at_once(cluster):
    ref_on_n3 = on("n3", produce).remote(8 * MiB, 81)
    ref_on_n0 = on("n0", produce).remote(8 * MiB, 82)
    ray.wait([ref_on_n3, ref_on_n0], num_returns=2, fetch_local=False, timeout=120)
    # Read from n3 on n0: the holder has no agent.
    out = ray.get(on("n0", fetch).remote([ref_on_n3]), timeout=180)
    assert out["digests"] == [expected(8 * MiB, 81)]
    assert out["pulled"] == 0 and out["fallbacks"] == 1
    assert any("no rayfabric agent on the node(s) holding the object" in r
               and "no provider that reaches other hosts" in r for r in out["reasons"]), out["reasons"]
    assert out["seconds"] < NO_WAIT_S, out
    # Read on n3: this node has no agent, and says why.
    out = ray.get(on("n3", fetch).remote([ref_on_n0]), timeout=180)
    assert out["digests"] == [expected(8 * MiB, 82)]
    assert out["pulled"] == 0 and out["fallbacks"] == 1
    assert any("no rayfabric agent on this node" in r and "it could not start" in r
               for r in out["reasons"]), out["reasons"]
    assert out["seconds"] < NO_WAIT_S, out


def test_a_source_refuses_a_reader_with_no_provider_in_common(cluster):
    """The source picks the fabric from the reader's list; with none in common it refuses at once,
    naming both sides (the puller then leaves the object to Ray's path)."""
    nodes, records = cluster["nodes"], cluster["records"]
    ref = on("n2", produce).remote(2 * MiB, 91)
    ray.wait([ref], fetch_local=False, timeout=120)
    n2 = AgentClient(records[nodes["n2"]]["address"])
    t0 = time.monotonic()
    reply = n2.lease([ref.binary()], reader_providers=["tcp;ofi_rxm", "verbs;ofi_rxm"])
    assert time.monotonic() - t0 < NO_WAIT_S
    assert [error_name(lease.error_code) for lease in reply.leases] == ["Unavailable"]
    msg = reply.leases[0].error
    assert "no fabric in common" in msg and "sockets/" in msg and "tcp;ofi_rxm, verbs;ofi_rxm" in msg, msg
    # A reader that lists sockets gets it, with the address of n2's sockets endpoint.
    reply = n2.lease([ref.binary()], reader_providers=["tcp;ofi_rxm", "sockets"])
    assert reply.leases[0].error_code == pb.ERROR_CODE_NONE and reply.provider == "sockets"
    assert reply.domain and reply.fabric_address
    n2.release([(reply.leases[0].lease_id, reply.leases[0].token)])
    # n0 answers each reader on the best fabric it shares with it; an older reader (no list) gets
    # its best one.
    ref0 = on("n0", produce).remote(2 * MiB, 92)
    ray.wait([ref0], fetch_local=False, timeout=120)
    n0 = AgentClient(records[nodes["n0"]]["address"])
    for listed, want in (([], "tcp;ofi_rxm"), (["sockets"], "sockets"),
                         (["sockets", "tcp;ofi_rxm"], "tcp;ofi_rxm")):
        reply = n0.lease([ref0.binary()], reader_providers=listed)
        assert reply.leases[0].error_code == pb.ERROR_CODE_NONE and reply.provider == want, (listed, reply)
        info = {f.provider: f for f in n0.info().fabrics}
        assert reply.fabric_address == info[want].address
        n0.release([(reply.leases[0].lease_id, reply.leases[0].token)])


def test_the_python_side_picks_a_holder_it_shares_the_best_provider_with():
    """rayfabric.get's source choice, on agent records as the KV holds them."""
    from rayfabric._pulls import _pick_source
    local = {"fabrics": [{"provider": "verbs;ofi_rxm"}, {"provider": "tcp;ofi_rxm"}]}
    agents = {"a" * 56: {"address": "h1:1", "fabrics": [{"provider": "tcp;ofi_rxm"}]},
              "b" * 56: {"address": "h2:1", "fabrics": [{"provider": "verbs;ofi_rxm"}, {"provider": "tcp;ofi_rxm"}]},
              "c" * 56: {"address": "h3:1", "fabrics": [{"provider": "sockets"}]},
              "d" * 56: {"address": "h4:1", "provider": "tcp;ofi_rxm"}}  # an older agent's record
    assert _pick_source(local, ["a" * 56, "b" * 56], agents) == ("h2:1", None)
    assert _pick_source(local, ["a" * 56], agents) == ("h1:1", None)
    assert _pick_source(local, ["d" * 56], agents) == ("h4:1", None)
    source, why = _pick_source(local, ["c" * 56], agents)
    assert source is None and "no fabric shared" in why and "verbs;ofi_rxm, tcp;ofi_rxm" in why \
        and "sockets" in why, why
    source, why = _pick_source(local, ["e" * 56], agents)
    assert source is None and "no rayfabric agent" in why


def test_readers_spread_over_the_holders_that_share_the_best_provider():
    """Broadcast-shaped reads: where several nodes hold an object over the same best provider, each
    (reader, object) picks its holder by rendezvous hash: readers spread across replicas (not all on
    the first node Ray lists), one reader keeps its pick for an object, and a holder on a better
    provider still wins over spreading."""
    from rayfabric import _pulls
    local = {"fabrics": [{"provider": "verbs;ofi_rxm"}, {"provider": "tcp;ofi_rxm"}]}
    tcp = [{"provider": "tcp;ofi_rxm"}]
    holders = {f"{i:x}" * 56: {"address": f"h{i}:1", "fabrics": tcp} for i in range(1, 5)}
    nodes = list(holders)
    objects = [bytes([i]) * 28 for i in range(64)]
    picks = [_pulls._pick_source(local, nodes, holders, obj, "r" * 56)[0] for obj in objects]
    assert set(picks) == {f"h{i}:1" for i in range(1, 5)}, picks      # one reader, many objects
    assert all(n > 4 for n in map(picks.count, set(picks))), picks    # roughly even (16 each expected)
    assert picks == [_pulls._pick_source(local, nodes[::-1], holders, obj, "r" * 56)[0] for obj in objects]
    readers = [_pulls._pick_source(local, nodes, holders, objects[0], f"{r:056x}")[0] for r in range(64)]
    assert len(set(readers)) == 4, readers                              # many readers, one object
    better = dict(holders, **{"f" * 56: {"address": "best:1", "fabrics": [{"provider": "verbs;ofi_rxm"}]}})
    assert {_pulls._pick_source(local, nodes + ["f" * 56], better, obj, "r" * 56)[0] for obj in objects} == {"best:1"}
    counted = _pulls.stats()["pulls_by_source"]
    assert sum(counted.get(n, 0) for n in nodes) >= 64 + 64 and counted.get("f" * 56, 0) >= 64
