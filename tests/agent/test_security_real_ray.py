"""Security of the agents, proven by attack against a REAL Ray cluster (2 nodes on this host, one
rayfabricd each, tcp;ofi_rxm): the test plays the hostile peer and audits the bytes.

RAYFABRIC_SECURITY_MODE picks the cluster (one per meson test, since Ray reads its credentials
once per process):
  none  - Ray without authentication: the attacks on the data path (a leased key used to write,
          forged and guessed descriptors, a source lying about sizes, a source frozen mid-transfer,
          a remote Pull);
  token - RAY_AUTH_MODE=token: calls without the token or with a wrong one are refused;
  tls   - RAY_USE_TLS with a CA, certificates and client certificates, as Ray's TLS doc sets it up.
"""
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

import rayfabric
from rayfabric import agent_pb2 as pb
from rayfabric._client import (AgentClient, PullSocketClient, PullSocketImpostor, PullSocketUnavailable, error_name,
                               make_channel)
from rayfabric.bench.objects import raylet_pid

from agent_front import AgentFront
from ray_test_cluster import node_ids, on, produce, use_this_checkout

MODE = os.environ.get("RAYFABRIC_SECURITY_MODE", "none")
MiB = 1 << 20
PROVIDER = "tcp;ofi_rxm"
# A frozen source is given up after 6 s without progress; its reads drained (or cut) within 1 s.
# A store that does not answer for 4 s breaks the agent's connection to it.
AGENT_ENV = {"RAYFABRIC_OP_TIMEOUT_MS": "6000", "RAYFABRIC_DRAIN_TIMEOUT_MS": "1000",
             "RAYFABRIC_CREATE_TIMEOUT_MS": "3000", "RAYFABRIC_STORE_TIMEOUT_MS": "4000"}
PROBE = os.path.join(rayfabric.bin_dir(), "tests", "agent", "fabric_probe")


def _make_tls_files(directory):
    """A CA, and a certificate it signs for this host's addresses (the node IP, 127.0.0.1 and
    localhost), with openssl, as Ray's TLS documentation does."""
    ip = ray.util.get_node_ip_address()
    ca_key, ca_crt = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.crt")
    key, csr, crt = (os.path.join(directory, n) for n in ("tls.key", "tls.csr", "tls.crt"))
    ext = os.path.join(directory, "ext.cnf")
    with open(ext, "w") as f:
        f.write(f"subjectAltName=DNS:localhost,IP:127.0.0.1,IP:{ip}\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rayfabric-test-ca",
        "-keyout", ca_key, "-out", ca_crt)
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=ray-internal", "-keyout", key, "-out", csr)
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
        "-extfile", ext, "-out", crt)
    return {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": crt, "RAY_TLS_SERVER_KEY": key, "RAY_TLS_CA_CERT": ca_crt}


@pytest.fixture(scope="module")
def cluster():
    use_this_checkout()
    tmp = tempfile.mkdtemp(prefix="rayfabric-sec-")
    # Set explicitly: `ray start --head` turns token mode on by itself when ~/.ray/auth_token exists.
    os.environ["RAY_AUTH_MODE"] = "token" if MODE == "token" else "disabled"
    token = None
    if MODE == "token":
        token = secrets.token_hex(32)
        os.environ["RAY_AUTH_TOKEN"] = token
    if MODE == "tls":
        os.environ.update(_make_tls_files(tmp))
    # This process imported Ray already: make it read its configuration again, as Ray's own
    # `_enable_token_auth` does.
    from ray._raylet import AuthenticationTokenLoader, Config
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"n0": 100}, "object_store_memory": 1536 * MiB, "include_dashboard": False})
    c.add_node(num_cpus=2, resources={"n1": 100}, object_store_memory=1536 * MiB)
    ray.init(address=c.address, logging_level="ERROR")
    c.wait_for_nodes()
    records = rayfabric.init(provider=PROVIDER, env=AGENT_ENV, watch_new_nodes=False)
    nodes = node_ids(("n0", "n1"))
    yield {"cluster": c, "nodes": nodes, "records": records, "token": token}
    rayfabric.shutdown()
    ray.shutdown()
    c.shutdown()


def record(cluster, name):
    return cluster["records"][cluster["nodes"][name]]


def client(cluster, name, local=False):
    r = record(cluster, name)
    return AgentClient("unix:" + r["local_socket"] if local else r["address"])


@ray.remote(num_cpus=0)
def digest(refs):
    return [hashlib.sha256(ray.get(r).tobytes()).hexdigest() for r in refs]


@ray.remote(num_cpus=0)
def fetch(refs, timeout=120):
    import rayfabric as rf
    before = rf.stats()
    values = rf.get(refs, timeout=timeout)
    after = rf.stats()
    # This call's fallback reasons only (the worker process may have served earlier calls).
    reasons = {r: n - before["fallback_reasons"].get(r, 0) for r, n in after["fallback_reasons"].items()
               if n > before["fallback_reasons"].get(r, 0)}
    return {"digests": [hashlib.sha256(v.tobytes()).hexdigest() for v in values],
            "pulled": after["objects_pulled"] - before["objects_pulled"],
            "over_pull_socket": after["pull_calls_socket"] - before["pull_calls_socket"],
            "fallbacks": after["fallbacks"] - before["fallbacks"], "reasons": reasons}


def expected_digest(nbytes, seed):
    return hashlib.sha256(np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8).tobytes()).hexdigest()


def probe(*args):
    env = dict(os.environ, RAYFABRIC_PROVIDER=PROVIDER)
    out = subprocess.run([PROBE, *[str(a) for a in args]], capture_output=True, text=True, env=env, timeout=300)
    return out.stdout.strip()


def object_on(node, nbytes, seed):
    ref = on(node, produce).remote(nbytes, seed)
    ray.wait([ref], fetch_local=False, timeout=120)
    return ref


# ------------------------------------------------------------------------------------ every mode


def test_a_protocol_v2_caller_is_told_what_it_met(cluster):
    """An agent or client of protocol V2 (one service, rayfabric.v1.Agent) meets this agent during
    a rolling upgrade: Info answers it (with protocol_version 3, so it names the mismatch itself);
    every other call is refused, FAILED_PRECONDITION, saying what this agent speaks; a remote Pull
    as V2 creates nothing."""
    ref = object_on("n1", 2 * MiB, 12)
    size = ray.experimental.get_object_locations([ref])[ref]["object_size"]
    owner = rayfabric._pulls._owner(ray._private.worker.global_worker.core_worker, ref)
    item = pb.PullItem(object_id=ref.binary(), owner=owner, source_agent=record(cluster, "n1")["address"],
                       object_size=size)
    calls = {
        "LeaseObjects": pb.LeaseRequest(protocol_version=pb.PROTOCOL_V2, object_ids=[ref.binary()]),
        "ReleaseLeases": pb.ReleaseRequest(protocol_version=pb.PROTOCOL_V2, leases=[pb.LeaseRef(lease_id=1)]),
        "GetStatus": pb.StatusRequest(protocol_version=pb.PROTOCOL_V2),
        "Pull": pb.PullRequest(protocol_version=pb.PROTOCOL_V2, items=[item], timeout_ms=5000),
        "ReportFallbacks": pb.ReportFallbacksRequest(protocol_version=pb.PROTOCOL_V2,
                                                     fallbacks=[pb.FallbackCount(reason="x", objects=1)]),
    }
    local_only = {"Pull": "pulls_refused_remote", "ReportFallbacks": "reports_refused_remote"}
    for name, local in (("n1", False), ("n0", False), ("n0", True)):
        c = client(cluster, name, local=local)
        before = client(cluster, name).counters()
        info = pb.InfoReply.FromString(c.raw_call("Info", pb.InfoRequest(protocol_version=pb.PROTOCOL_V2)
                                                  .SerializeToString(), service="Agent"))
        assert info.protocol_version == pb.PROTOCOL_V3 and info.node_id, info
        for method, request in calls.items():
            with pytest.raises(grpc.RpcError) as refused:
                c.raw_call(method, request.SerializeToString(), service="Agent")
            if method in local_only and not local:
                # Over the network, V2's Pull is a remote Pull first: refused and counted as one.
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, (method, refused.value)
                assert "only to processes of this node" in refused.value.details()
                continue
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, (method, refused.value)
            assert "no longer serves protocol V2" in refused.value.details(), refused.value.details()
            assert "speaks V3" in refused.value.details() and "same rayfabric version" in refused.value.details()
        after = client(cluster, name).counters()
        refused_remote = 0 if local else len(local_only)
        assert after["requests_rejected"] - before["requests_rejected"] == len(calls) - refused_remote
        for counter in local_only.values():
            assert after[counter] - before[counter] == (0 if local else 1), counter
    assert not ray.get(on("n0", is_local).remote([ref]))[0], "a V2 Pull created the object"
    leases = client(cluster, "n1").counters()
    assert leases["leases_active"] == 0 and leases["pinned_bytes"] == 0, leases


def test_the_local_service_is_not_on_the_network_port(cluster):
    """Local (Pull, ReportFallbacks) is registered on the Unix socket only: on the network port its
    methods are refused, whatever the request says (empty, another version, a well-formed one), and
    counted; bytes that are no request at all gRPC refuses before any handler. The status names
    every counter it reports, once."""
    remote = client(cluster, "n0")
    before = remote.counters()
    pulls = [b"", pb.PullRequest(protocol_version=pb.PROTOCOL_V2).SerializeToString(),
             pb.PullRequest(protocol_version=pb.PROTOCOL_V3, items=[pb.PullItem(object_id=b"\x01" * 28)],
                            timeout_ms=1000).SerializeToString()]
    reports = [b"", pb.ReportFallbacksRequest(protocol_version=pb.PROTOCOL_V3,
                                              fallbacks=[pb.FallbackCount(reason="forged", objects=99)])
               .SerializeToString()]
    for method, payloads in (("Pull", pulls), ("ReportFallbacks", reports)):
        for payload in payloads:
            with pytest.raises(grpc.RpcError) as refused:
                remote.raw_call(method, payload)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
            assert "only to processes of this node" in refused.value.details()
        with pytest.raises(grpc.RpcError):  # not parsed: no handler runs, nothing counted
            remote.raw_call(method, b"\xff" * 40)
    after = remote.counters()
    assert after["pulls_refused_remote"] - before["pulls_refused_remote"] == len(pulls)
    assert after["reports_refused_remote"] - before["reports_refused_remote"] == len(reports)
    assert after["fallbacks"] == before["fallbacks"], "a refused report was counted"
    gauges = {c.name for c in remote.status().counters if c.gauge}
    assert gauges == {"leases_active", "pinned_bytes", "registered_regions"}, gauges
    assert len(after) == len(remote.status().counters), "a counter's name repeats"

def test_agents_report_the_clusters_credentials(cluster):
    for name in ("n0", "n1"):
        info = client(cluster, name).info()
        assert info.token_auth == (MODE == "token"), info
        assert info.tls == (MODE == "tls"), info
        assert info.exposure == pb.EXPOSURE_OBJECT  # auto on tcp: registering costs nothing measurable
        assert record(cluster, name)["token_auth"] == (MODE == "token")


def test_get_works_end_to_end(cluster):
    ref = object_on("n1", 32 * MiB, 1)
    out = ray.get(on("n0", fetch).remote([ref]))
    assert out["digests"] == [expected_digest(32 * MiB, 1)]
    assert out["pulled"] == 1 and out["fallbacks"] == 0, out
    # Asked over the agent's pull socket, with the cluster's token where it has one.
    assert out["over_pull_socket"] == 1, out


def test_remote_pull_is_refused(cluster):
    """Pull creates and seals objects: only this node's processes may ask (its Unix socket)."""
    ref = object_on("n1", 2 * MiB, 2)
    size = ray.experimental.get_object_locations([ref])[ref]["object_size"]
    owner = rayfabric._pulls._owner(ray._private.worker.global_worker.core_worker, ref)
    item = pb.PullItem(object_id=ref.binary(), owner=owner, source_agent=record(cluster, "n1")["address"],
                       object_size=size)
    remote = client(cluster, "n0")
    before = remote.counters()["pulls_refused_remote"]
    with pytest.raises(grpc.RpcError) as refused:
        remote.pull([item], 5)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "only to processes of this node" in refused.value.details()
    assert remote.counters()["pulls_refused_remote"] - before == 1
    assert not ray.get(on("n0", is_local).remote([ref]))[0], "a refused Pull created the object anyway"
    # A flood of refused requests is counted one by one but logged at most 10 lines a minute (any
    # host can send them: the agent's log must not grow with them).
    log_path = Path(rayfabric._agents._log_path(cluster["nodes"]["n0"]))
    logged_before = log_path.read_text(errors="replace").count("refused")
    for _ in range(200):
        with pytest.raises(grpc.RpcError):
            remote.pull([item], 5)
    assert remote.counters()["pulls_refused_remote"] - before == 201
    logged = log_path.read_text(errors="replace").count("refused") - logged_before
    assert logged <= 20, f"{logged} refusal lines logged for 200 refused requests"
    # The local socket serves it.
    reply = client(cluster, "n0", local=True).pull([item], 30)
    assert reply.results[0].outcome == pb.PULLED, reply


def pull_socket_item(cluster, seed):
    """A PullItem of a 2 MiB object on n1, for n0's agent; (ref, item)."""
    ref = object_on("n1", 2 * MiB, seed)
    size = ray.experimental.get_object_locations([ref])[ref]["object_size"]
    owner = rayfabric._pulls._owner(ray._private.worker.global_worker.core_worker, ref)
    return ref, pb.PullItem(object_id=ref.binary(), owner=owner, source_agent=record(cluster, "n1")["address"],
                            object_size=size)


def raw_exchange(path, data, close_write=False):
    """Sends `data` on a fresh connection to `path`; (code, message) of the answer, or None when
    the agent closed without one."""
    import struct
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)  # blocking: waits for room in the listen backlog
        s.settimeout(30)
        try:
            s.sendall(data)
            if close_write:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed before it read: its answer is still there to read
        head = b""
        while len(head) < 8:
            chunk = s.recv(8 - len(head))
            if not chunk:
                return None
            head += chunk
        code, n = struct.unpack("<II", head)
        body = b""
        while len(body) < n:
            chunk = s.recv(n - len(body))
            assert chunk, "the answer was cut"
            body += chunk
        return error_name(code) if code else "", body.decode(errors="replace")


def frame(body, auth=b"", magic=b"RFP1", deadline_ms=30000, body_len=None, auth_len=None):
    from rayfabric._client import pull_socket_frame
    return pull_socket_frame(body, deadline_ms, auth, magic=magic, authorization_len=auth_len, body_len=body_len)


@pytest.mark.skipif(MODE != "none", reason="the attacks on the pull socket's framing run on the plain cluster")
def test_the_pull_socket_refuses_what_is_not_a_pull(cluster):
    """Malformed frames, a foreign protocol version, no items: each answered with its reason,
    counted, none creates anything, and the agent goes on serving."""
    path = record(cluster, "n0")["pull_socket"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    ref, item = pull_socket_item(cluster, 11)
    status = client(cluster, "n0")
    rejected = status.counters()["requests_rejected"]
    good = pb.PullRequest(protocol_version=pb.PROTOCOL_V3, items=[item], timeout_ms=30000).SerializeToString()
    cases = [
        (frame(good, magic=b"GET "), "InvalidArgument", "not a pull-socket request"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "InvalidArgument", "not a pull-socket request"),  # gRPC's preface
        (frame(b"", body_len=1 << 30), "InvalidArgument", "over the bounds"),
        (frame(b"", auth_len=1 << 20), "InvalidArgument", "over the bounds"),
        (frame(b"\xff" * 64), "InvalidArgument", "not a rayfabric.v1.PullRequest"),
        (frame(pb.PullRequest(protocol_version=pb.PROTOCOL_V3 + 7, items=[item]).SerializeToString()),
         "VersionMismatch", "is not spoken by this agent"),
        (frame(pb.PullRequest(protocol_version=pb.PROTOCOL_V3).SerializeToString()), "InvalidArgument",
         "Pull needs 1..100000 items, got 0"),
    ]
    for data, code, why in cases:
        answer = raw_exchange(path, data)
        assert answer is not None and answer[0] == code and why in answer[1], (data[:24], answer)
    # A frame cut short, and a connection closed before a whole header: no answer, nothing kept.
    assert raw_exchange(path, frame(good)[:-5], close_write=True) is None
    assert raw_exchange(path, b"RFP1\x00\x00", close_write=True) is None
    # Half a header, then a byte every 3 s (the connection left open): closed by the agent 10 s
    # after the frame's first byte, however the rest trickles in.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        t0 = time.monotonic()
        s.sendall(b"RFP1\x00\x00")
        closed = None
        for b in frame(good)[6:]:
            time.sleep(3)
            try:
                s.sendall(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                closed = time.monotonic() - t0
                break
        assert closed is not None and 9 <= closed < 20, closed
    assert status.counters()["requests_rejected"] - rejected == len(cases)
    assert not ray.get(on("n0", is_local).remote([ref]))[0], "a refused request created the object"
    # The same connection serves request after request once they are well formed.
    caller = PullSocketClient(path)
    for _ in range(3):
        reply = caller.pull([item], 30)
        assert reply.results[0].outcome in (pb.PULLED, pb.ALREADY_LOCAL), reply
    assert len(caller._idle) == 1
    assert ray.get(on("n0", digest).remote([ref])) == [expected_digest(2 * MiB, 11)]


@pytest.mark.skipif(MODE != "none", reason="runs on the plain cluster")
def test_the_pull_socket_bounds_its_connections(cluster):
    """256 connections held open (a thread each in the agent): the next is told so
    (ResourceExhausted) and rayfabric.get's call goes over gRPC's local socket instead, pulled."""
    path = record(cluster, "n0")["pull_socket"]
    ref, item = pull_socket_item(cluster, 14)
    held = []
    try:
        for _ in range(256):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            held.append(s)
        answer = raw_exchange(path, frame(b""))
        assert answer is not None and answer[0] == "ResourceExhausted" and "at most 256" in answer[1], answer
        with pytest.raises(PullSocketUnavailable):
            PullSocketClient(path).pull([item], 30)
        before = rayfabric.stats()
        reply = rayfabric._pulls._ask_local_agent(record(cluster, "n0"), [item], 30)
        assert reply.results[0].outcome == pb.PULLED, reply
        after = rayfabric.stats()
        assert after["pull_calls_grpc"] - before["pull_calls_grpc"] == 1, after
        assert after["pull_calls_socket"] == before["pull_calls_socket"], after
    finally:
        for s in held:
            s.close()
    # Once they are gone, the socket serves again.
    again = object_on("n1", 2 * MiB, 15)
    out = ray.get(on("n0", fetch).remote([again]))
    assert out["over_pull_socket"] == 1 and out["digests"] == [expected_digest(2 * MiB, 15)], out


@pytest.mark.skipif(MODE != "none" or os.geteuid() != 0, reason="needs root to listen as another user")
def test_a_pull_socket_of_another_user_is_not_told_anything(cluster):
    """Sockets at an agent record's paths served by another user (the agent gone, another user's
    process bound the paths): rayfabric's client checks who listens on the pull socket
    (SO_PEERCRED) and sends nothing, no token, no request, and does not turn to the gRPC socket
    beside it either; the get is left to Ray's path."""
    where = tempfile.mkdtemp(prefix="rayfabric-impostor-")  # in /tmp: reachable by uid 65534
    os.chmod(where, 0o777)
    grpc_path = os.path.join(where, "impostor.sock")
    path = grpc_path + ".pull"
    listener = subprocess.Popen(["python3", "-c", f"""
import os, socket, sys
os.setgid(65534); os.setuid(65534)
socks = []
for p in ({path!r}, {grpc_path!r}):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(p); os.chmod(p, 0o666); s.listen(4)
    s.settimeout(8)
    socks.append(s)
print("listening", flush=True)
got = 0
for s in socks:
    try:
        c, _ = s.accept()
        c.settimeout(3)
        got += len(c.recv(1 << 16))
    except OSError:
        pass
print("received", got, flush=True)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        ref, item = pull_socket_item(cluster, 16)
        with pytest.raises(PullSocketImpostor) as refused:
            PullSocketClient(path, authorization="Bearer " + "7" * 64).pull([item], 30)
        assert "uid 65534" in str(refused.value) and "nothing sent" in str(refused.value), refused.value
        assert refused.value.code().name == "PermissionDenied"
        # rayfabric.get's own call: raises (the get is then left to Ray's path), no gRPC beside it.
        before = rayfabric.stats()
        with pytest.raises(PullSocketImpostor):
            rayfabric._pulls._ask_local_agent({"pull_socket": path, "local_socket": grpc_path}, [item], 30)
        after = rayfabric.stats()
        assert after["pull_calls_grpc"] == before["pull_calls_grpc"], after
        out, _ = listener.communicate(timeout=60)
        assert out.strip() == "received 0", out
    finally:
        listener.kill()
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.skipif(MODE != "none" or os.geteuid() != 0, reason="needs root to connect as another user")
def test_the_pull_socket_serves_only_its_user(cluster):
    """The socket is 0600; were it opened to everyone (a misconfigured directory or mode), the
    agent still refuses a peer of another uid (SO_PEERCRED) before it reads a byte."""
    path = record(cluster, "n0")["pull_socket"]
    ref, item = pull_socket_item(cluster, 12)
    good = frame(pb.PullRequest(protocol_version=pb.PROTOCOL_V3, items=[item], timeout_ms=30000).SerializeToString())
    as_nobody = f"""
import os, socket, struct, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect({path!r})
except PermissionError:
    print("EACCES"); sys.exit(0)
try:
    s.sendall(bytes.fromhex({good.hex()!r}))
except (BrokenPipeError, ConnectionResetError):
    pass  # refused before it read: the answer waits
head = s.recv(8)
code, n = struct.unpack("<II", head)
print(code, s.recv(n).decode())
"""
    run = lambda: subprocess.run(["python3", "-c", as_nobody], capture_output=True, text=True, timeout=60)
    # As installed: the mode keeps the other user out.
    out = run()
    assert out.stdout.strip() == "EACCES", (out.stdout, out.stderr)
    unauthenticated = client(cluster, "n0").counters()["requests_unauthenticated"]
    # Opened to everyone: the socket, and a way through every directory above it.
    opened = [(path, 0o600)]
    d = os.path.dirname(path)
    while d not in ("/", ""):
        opened.append((d, os.stat(d).st_mode & 0o7777))
        d = os.path.dirname(d)
    for p, mode in opened:
        os.chmod(p, 0o666 if p == path else mode | 0o001)
    try:
        out = run()
    finally:
        for p, mode in opened:
            os.chmod(p, mode)
    code, _, message = out.stdout.strip().partition(" ")
    assert code and error_name(int(code)) == "PermissionDenied", (out.stdout, out.stderr)
    assert "serves processes of this agent's user" in message and "uid 65534" in message, message
    assert client(cluster, "n0").counters()["requests_unauthenticated"] - unauthenticated == 1
    assert not ray.get(on("n0", is_local).remote([ref]))[0], "another user's request created the object"


@ray.remote(num_cpus=0)
def is_local(refs):
    here = ray.get_runtime_context().get_node_id()
    core = ray._private.worker.global_worker.core_worker
    import rayfabric as rf
    locs = rf._pulls._locations(core, refs)
    return [here in locs[r]["node_ids"] for r in refs]


# ------------------------------------------------------------------------------------ token mode

@pytest.mark.skipif(MODE != "token", reason="RAYFABRIC_SECURITY_MODE=token only")
def test_calls_without_the_token_are_refused(cluster):
    address = record(cluster, "n0")["address"]
    before = client(cluster, "n0").counters()["requests_unauthenticated"]
    for metadata in (None, [("authorization", "Bearer " + "0" * 64)], [("authorization", cluster["token"])]):
        bare = AgentClient(address, channel=make_channel(address, insecure=True))
        for call in (lambda: bare._info(pb.InfoRequest(protocol_version=pb.PROTOCOL_V3), timeout=10, metadata=metadata),
                     lambda: bare._lease(pb.LeaseRequest(protocol_version=pb.PROTOCOL_V3, object_ids=[b"\x01" * 28]),
                                         timeout=10, metadata=metadata),
                     lambda: bare._status(pb.StatusRequest(protocol_version=pb.PROTOCOL_V3), timeout=10,
                                          metadata=metadata),
                     # Local's refusal on the network port and protocol V2's service check it first too.
                     lambda: bare._pull(pb.PullRequest(protocol_version=pb.PROTOCOL_V3), timeout=10,
                                        metadata=metadata),
                     lambda: bare.raw_call("Info", pb.InfoRequest().SerializeToString(), service="Agent",
                                           metadata=metadata),
                     lambda: bare.raw_call("Pull", b"", service="Agent", metadata=metadata)):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
        bare.close()
    # The local socket wants it too.
    local = "unix:" + record(cluster, "n0")["local_socket"]
    bare = AgentClient(local, channel=make_channel(local, insecure=True))
    with pytest.raises(grpc.RpcError) as refused:
        bare.status()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    fallbacks = client(cluster, "n0").counters()["fallbacks"]
    with pytest.raises(grpc.RpcError) as refused:
        bare.report_fallbacks([("forged without the token", 1000)])
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert client(cluster, "n0").counters()["requests_unauthenticated"] - before == 3 * 6 + 2
    assert client(cluster, "n0").counters()["fallbacks"] == fallbacks
    # This node's processes report with the token (Ray's channel), as rayfabric.get does.
    client(cluster, "n0", local=True).report_fallbacks([("reported with the token", 2)])
    assert client(cluster, "n0").counters()["fallbacks"] - fallbacks == 2
    # The pull socket wants it too: none, a wrong one, a bare token without "Bearer ".
    ref, item = pull_socket_item(cluster, 13)
    path = record(cluster, "n0")["pull_socket"]
    unauthenticated = client(cluster, "n0").counters()["requests_unauthenticated"]
    request = pb.PullRequest(protocol_version=pb.PROTOCOL_V3, items=[item], timeout_ms=30000).SerializeToString()
    for auth in (b"", b"Bearer " + b"0" * 64, cluster["token"].encode()):
        code, message = raw_exchange(path, frame(request, auth=auth))
        assert code == "PermissionDenied" and "token" in message, (auth, code, message)
    # A frame that announces 64 MiB without the token is refused before any of it is read.
    t0 = time.monotonic()
    code, message = raw_exchange(path, frame(b"", body_len=64 * MiB))
    assert code == "PermissionDenied" and time.monotonic() - t0 < 5, (code, message)
    assert client(cluster, "n0").counters()["requests_unauthenticated"] - unauthenticated == 4
    assert not ray.get(on("n0", is_local).remote([ref]))[0], "a request without the token created the object"
    reply = PullSocketClient(path).pull([item], 30)  # this process's token (Ray's own)
    assert reply.results[0].outcome == pb.PULLED, reply
    # With the cluster's token (what Ray's own channels send) every call is served.
    ok = AgentClient(address, channel=make_channel(address, insecure=True))
    good = [("authorization", "Bearer " + cluster["token"])]
    assert ok._info(pb.InfoRequest(protocol_version=pb.PROTOCOL_V3), timeout=10, metadata=good).token_auth


# -------------------------------------------------------------------------------------- tls mode

@pytest.mark.skipif(MODE != "tls", reason="RAYFABRIC_SECURITY_MODE=tls only")
def test_plaintext_and_certificateless_clients_are_refused(cluster):
    address = record(cluster, "n0")["address"]
    plain = AgentClient(address, channel=make_channel(address, insecure=True))
    with pytest.raises(grpc.RpcError) as refused:
        plain.info(timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # TLS that trusts the CA but shows no client certificate: the agent requires one, as Ray does.
    with open(os.environ["RAY_TLS_CA_CERT"], "rb") as f:
        ca = f.read()
    anonymous = AgentClient(address, channel=grpc.secure_channel(address, grpc.ssl_channel_credentials(ca)))
    with pytest.raises(grpc.RpcError) as refused:
        anonymous.info(timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert client(cluster, "n0").info().tls


# ----------------------------------------------------------------- attacks on the data path (none)

@pytest.mark.skipif(MODE != "none", reason="the data-path attacks run on the plain cluster")
def test_a_leased_descriptor_cannot_write(cluster):
    """A peer that got a lease (the exact descriptor) reads the object but cannot change a byte."""
    ref = object_on("n1", 8 * MiB, 3)
    n1 = client(cluster, "n1")
    lease = n1.lease([ref.binary()], ttl_ms=60000)
    granted = lease.leases[0]
    assert granted.error_code == pb.ERROR_CODE_NONE, granted
    address, region = lease.fabric_address.hex(), granted.region.hex()
    size = granted.data_size + granted.metadata_size
    read = probe("read", address, region, granted.offset, size)
    assert read.startswith("OK "), read
    wrote = probe("write", address, region, granted.offset, 4096)
    assert wrote.startswith("FAIL "), f"a write through a leased descriptor succeeded: {wrote}"
    assert probe("read", address, region, granted.offset, size) == read, "the object's bytes changed"
    assert ray.get(on("n1", digest).remote([ref])) == [expected_digest(8 * MiB, 3)]
    assert names(n1.release([(granted.lease_id, granted.token)]).error_codes) == [""]


def names(codes):
    return [error_name(c) if c else "" for c in codes]


@pytest.mark.skipif(MODE != "none", reason="the data-path attacks run on the plain cluster")
def test_forged_and_guessed_descriptors_read_nothing(cluster):
    """Keys are random 64-bit numbers: small keys (what a counter hands out), keys next to a real
    one, at base 0 or the real base, read nothing, leased or not."""
    ref = object_on("n1", 4 * MiB, 4)
    n1 = client(cluster, "n1")
    lease = n1.lease([ref.binary()], ttl_ms=60000)
    granted = lease.leases[0]
    region = granted.region
    key = int.from_bytes(region[16:24], "little")
    assert key > 0xFFFFFFFF, f"key {key} looks counted, not random"
    out = probe("guess", lease.fabric_address.hex(), region.hex(), granted.offset, 4096, 16)
    assert "GUESSED" not in out and out.startswith("DONE "), out
    n1.release([(granted.lease_id, granted.token)])
    # After the release a stale copy of the descriptor still only reads this store's objects,
    # never someone else's memory (arena exposure; see README, Security), and a forged one reads
    # nothing.
    forged = bytearray(region)
    forged[16:24] = (1).to_bytes(8, "little")
    assert probe("read", lease.fabric_address.hex(), bytes(forged).hex(), 0, 4096).startswith("FAIL ")


class LyingSource(AgentFront):
    """A real agent behind a front that rewrites each lease's metadata_size (a hostile or corrupt
    source describing an object of another size)."""

    def __init__(self, target, extra_metadata=4096):
        self.extra = extra_metadata
        super().__init__(target, threads=4)

    def forward(self, method, payload):
        reply = super().forward(method, payload)
        if method == "LeaseObjects":
            msg = pb.LeaseReply.FromString(reply)
            for lease in msg.leases:
                lease.metadata_size += self.extra
            reply = msg.SerializeToString()
        return reply


@pytest.mark.skipif(MODE != "none", reason="the data-path attacks run on the plain cluster")
def test_a_lease_whose_sizes_differ_from_rays_directory_is_refused(cluster):
    ref = object_on("n1", 4 * MiB, 5)
    size = ray.experimental.get_object_locations([ref])[ref]["object_size"]
    liar = LyingSource(record(cluster, "n1")["address"])
    local = client(cluster, "n0", local=True)
    try:
        before = local.counters()
        owner = rayfabric._pulls._owner(ray._private.worker.global_worker.core_worker, ref)
        result = local.pull([pb.PullItem(object_id=ref.binary(), owner=owner, source_agent=liar.address,
                                         object_size=size)], 30).results[0]
        after = local.counters()
        # The refused lease is released through the liar (after the Pull answered): keep it up
        # until the real source holds nothing.
        deadline = time.time() + 20
        while client(cluster, "n1").counters()["leases_active"] and time.time() < deadline:
            time.sleep(0.1)
    finally:
        liar.close()
    assert result.outcome == pb.FAILED and error_name(result.error_code) == "OutOfRange", result
    assert "Ray's directory says" in result.error
    assert after["leases_size_mismatch"] - before["leases_size_mismatch"] == 1
    assert after["objects_pulled"] == before["objects_pulled"]
    assert not ray.get(on("n0", is_local).remote([ref]))[0], "a replica of the lying size was created"
    # Nothing stays pinned at the source, and Ray's own path delivers the right bytes.
    assert client(cluster, "n1").counters()["leases_active"] == 0
    assert ray.get(on("n0", digest).remote([ref])) == [expected_digest(4 * MiB, 5)]


@pytest.mark.skipif(MODE != "none", reason="the data-path attacks run on the plain cluster")
def test_a_source_frozen_mid_transfer_never_changes_a_byte(cluster):
    """The source agent is stopped (SIGSTOP) while its object is read; the consumer's pull gives up
    (no progress for 6 s), cuts the reads off before it frees the replica, and Ray's path
    delivers. Then the consumer's store reuses the space for new objects, the source wakes up,
    and every object in both stores is still byte-identical."""
    src = record(cluster, "n1")
    n1 = client(cluster, "n1")
    n0 = client(cluster, "n0")
    size = 512 * MiB
    ref = None  # the object of the attempt in which the source was frozen, once the loop is left
    for attempt in range(4):
        ref = object_on("n1", size, 60 + attempt)
        resets_before = n0.counters()["endpoint_resets"]
        # A 20 s get: the lease the frozen source granted lasts the pull's 20 s + 2 s, since the
        # release sent while it is frozen is given up (the lease then expires there).
        pending = on("n0", fetch).remote([ref], 20)
        deadline = time.time() + 60
        while time.time() < deadline and n1.counters()["leases_active"] == 0:
            time.sleep(0.002)
        # Granted is not yet answered: give the lease reply a moment to leave, so that the source
        # is stopped while its 512 MiB are read (which takes a few hundred ms here).
        time.sleep((0.03, 0.06, 0.02, 0.1)[attempt])
        os.kill(src["pid"], signal.SIGSTOP)
        try:
            out = ray.get(pending, timeout=180)
            # Frozen while its bytes were moving (not while it was still answering the lease).
            frozen_mid_transfer = out["fallbacks"] == 1 and any("fi_read" in r for r in out["reasons"])
            if frozen_mid_transfer:
                # Fill n0's store where the aborted replica was, before the source wakes up.
                fillers = [on("n0", produce).remote(64 * MiB, 900 + i) for i in range(12)]
                ray.wait(fillers, num_returns=len(fillers), fetch_local=False, timeout=120)
                filler_digests = ray.get(on("n0", digest).remote(fillers))
        finally:
            os.kill(src["pid"], signal.SIGCONT)
        assert out["digests"] == [expected_digest(size, 60 + attempt)], out
        if frozen_mid_transfer:
            break
        ref = None  # this attempt's object goes before the next one is made
    else:
        pytest.fail("the transfer finished before the source could be frozen, 4 times")
    print(f"\nfrozen source: {out['reasons']}")
    assert n0.counters()["endpoint_resets"] - resets_before >= 1, "the consumer never cut the frozen reads off"
    time.sleep(3)  # the woken source answers the reads it was asked for
    assert ray.get(on("n0", digest).remote(fillers)) == filler_digests, "bytes landed after the abort"
    assert filler_digests == [expected_digest(64 * MiB, 900 + i) for i in range(12)]
    assert ray.get(on("n1", digest).remote([ref])) == [expected_digest(size, 60 + attempt)]
    # Both agents serve again.
    again = object_on("n1", 16 * MiB, 70)
    out = ray.get(on("n0", fetch).remote([again]))
    assert out["pulled"] == 1 and out["digests"] == [expected_digest(16 * MiB, 70)], out


@pytest.mark.skipif(MODE != "none", reason="runs on the plain cluster")
def test_a_store_that_stopped_answering_is_reconnected(cluster):
    """The raylet of n1 stops answering (SIGSTOP) while its agent asks its store for a lease: that
    connection breaks after store_timeout_ms and the agent connects again and serves, without a
    restart. The broken connection stays open while a lease granted on it lives (its pin with it),
    so its reader still reads the right bytes; released, it goes."""
    n1 = client(cluster, "n1")
    held = object_on("n1", 4 * MiB, 80)
    other = object_on("n1", 4 * MiB, 81)
    first = n1.lease([held.binary()], ttl_ms=60000).leases[0]
    assert first.error_code == pb.ERROR_CODE_NONE
    before = n1.counters()
    pid = raylet_pid(f"--node_id={cluster['nodes']['n1']}".encode())
    assert pid, "no raylet process for n1"
    os.kill(pid, signal.SIGSTOP)
    try:
        stuck = n1.lease([other.binary()], ttl_ms=60000, timeout=30).leases[0]
    finally:
        os.kill(pid, signal.SIGCONT)
    assert stuck.error_code != pb.ERROR_CODE_NONE, stuck
    assert "store" in stuck.error or "plasma" in stuck.error, stuck.error
    # The next call reconnects; the lease granted on the old connection still reads its object.
    again = n1.lease([other.binary()], ttl_ms=60000).leases[0]
    assert again.error_code == pb.ERROR_CODE_NONE, again
    after = n1.counters()
    assert after["store_reconnects"] - before["store_reconnects"] >= 1
    held_size = first.data_size + first.metadata_size
    read = probe("read", n1.info().fabric_address.hex(), first.region.hex(), first.offset, held_size)
    assert read.startswith("OK "), read
    assert names(n1.release([(first.lease_id, first.token)]).error_codes) == [""]
    assert names(n1.release([(again.lease_id, again.token)]).error_codes) == [""]
    # And pulls from that node go on by the fabric.
    fresh = object_on("n1", 8 * MiB, 82)
    out = ray.get(on("n0", fetch).remote([fresh]))
    assert out["pulled"] == 1 and out["digests"] == [expected_digest(8 * MiB, 82)], out
    deadline = time.time() + 30
    while n1.counters()["leases_active"] and time.time() < deadline:
        time.sleep(0.2)
    assert n1.counters()["leases_active"] == 0 and n1.counters()["pinned_bytes"] == 0


@pytest.mark.skipif(MODE != "none", reason="the data-path attacks run on the plain cluster")
def test_a_lease_reaches_its_object_only_and_only_while_leased(cluster):
    """Object exposure (auto on tcp): a lease's descriptor covers its object's bytes alone, with a
    key of its own that stops working when the lease is released."""
    a = object_on("n1", 4 * MiB, 90)
    b = object_on("n1", 4 * MiB, 91)
    n1 = client(cluster, "n1")
    reply = n1.lease([a.binary(), b.binary()], ttl_ms=60000)
    la, lb = reply.leases
    address = reply.fabric_address.hex()
    size = la.data_size + la.metadata_size
    assert la.offset == 0 and lb.offset == 0
    own = probe("read", address, la.region.hex(), 0, size)
    assert own.startswith("OK "), own
    # Nothing past A's own bytes (in arena mode these reads would reach B, or any object).
    assert probe("read", address, la.region.hex(), size, 4096).startswith("FAIL "), "read past the object"
    assert probe("read", address, la.region.hex(), 0, size + 4096).startswith("FAIL "), "read past the object"
    assert la.region != lb.region and la.region[16:24] != lb.region[16:24], "two leases share a key"
    # Released: A's key is revoked; B's lease is untouched.
    assert names(n1.release([(la.lease_id, la.token)]).error_codes) == [""]
    assert probe("read", address, la.region.hex(), 0, 4096).startswith("FAIL "), "a released lease still reads"
    assert probe("read", address, lb.region.hex(), 0, 4096).startswith("OK ")
    assert names(n1.release([(lb.lease_id, lb.token)]).error_codes) == [""]
    assert probe("read", address, lb.region.hex(), 0, 4096).startswith("FAIL ")


@pytest.mark.skipif(MODE != "none", reason="runs on the plain cluster")
def test_a_forged_job_record_is_at_most_an_opt_out(cluster, capsys):
    """Anyone who reaches the cluster's KV (the trust of Ray's own job table) can write a job's
    record (`job:<id>`, namespace rayfabric), which `rayfabric status` lists and the job's workers
    read at start-up. Played for real, as a hostile writer of this test's own job's record: garbage,
    a JSON list, a record whose fields have the wrong types and carry a terminal's escape sequences
    and a line break. Each is passed over by its readers (status and the workers' look alike), is
    printed escaped, and the fabric moves identical bytes throughout; the one thing a well-formed
    forgery can do is mark the job opted out (its workers then stay on Ray's path)."""
    import _rayfabric_autoload as autoload
    from ray.experimental import internal_kv
    from rayfabric import _records, cli
    job = ray.get_runtime_context().get_job_id()
    key = _records.KV_JOB_PREFIX + job

    def forge(value):
        internal_kv._internal_kv_put(key, value, overwrite=True, namespace=_records.NAMESPACE)

    try:
        for garbage in (b"\xff{not json", b"[1, 2, 3]", b"null"):
            forge(garbage)
            assert autoload._kv().job_record(job) == {}, garbage  # as if there were none: not an opt-out
            assert rayfabric.status()["jobs"] == [], garbage
        forge(json.dumps({"job_id": "another job", "mode": "on\n\x1b[2Jjob FAKE: transparent mode on", "autoload_off": True,
                          "pid": {"x": 1}, "node_id": 7, "entrypoint": "\x1b]0;owned\x07python evil.py",
                          "started": "yesterday"}))
        (listed,) = rayfabric.status()["jobs"]
        assert listed["job_id"] == job  # the job its key names, not the one it claims
        capsys.readouterr()
        cli._print_status(rayfabric.status())
        printed = capsys.readouterr().out
        (line,) = [x for x in printed.splitlines() if x.startswith("job ")]
        assert "\x1b" not in printed and "\x07" not in printed, printed
        assert "\\n\\x1b[2Jjob FAKE" in line and not any(x.startswith("job FAKE") for x in printed.splitlines())
        assert autoload._kv().job_record(job)["autoload_off"] is True  # what a forgery can do
        # The fabric's bytes are not the record's business.
        ref = object_on("n1", 8 * MiB, 4242)
        got = ray.get(on("n0", fetch).remote([ref]), timeout=120)
        assert got["digests"] == [expected_digest(8 * MiB, 4242)] and got["pulled"] == 1, got
    finally:
        internal_kv._internal_kv_del(key, namespace=_records.NAMESPACE)


@pytest.mark.skipif(MODE != "none", reason="runs on the plain cluster")
def test_a_garbled_agent_record_is_passed_over(cluster):
    """n1's agent record in the KV replaced by garbage, then by a record without an address: the
    readers pass it over (n1 is not listed as having an agent; status still answers for n0), and
    once the real record is back n1's agent serves again."""
    from ray.experimental import internal_kv
    from rayfabric import _agents
    n0, n1 = cluster["nodes"]["n0"], cluster["nodes"]["n1"]
    key = _agents.KV_PREFIX + n1
    real = internal_kv._internal_kv_get(key, namespace=_agents.NAMESPACE)
    assert real
    try:
        for forged in (b"\x00garbage", json.dumps({"node_id": n1, "address": 42, "local_socket": "/x"}).encode()):
            internal_kv._internal_kv_put(key, forged, overwrite=True, namespace=_agents.NAMESPACE)
            assert n1 not in _agents.published()
            st = rayfabric.status()["agents"]
            assert n1 not in st and st[n0]["alive"], st
    finally:
        internal_kv._internal_kv_put(key, real, overwrite=True, namespace=_agents.NAMESPACE)
    assert rayfabric.status()["agents"][n1]["alive"]
