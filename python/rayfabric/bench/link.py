"""rayfabric bench link: Ray and rayfabric on a wire that is the bottleneck, next to raw ceilings.

  python3 -m rayfabric bench link [--link 2gbit,10gbit,25gbit] [--sizes 64M,512M] [--reps 3]
                                  [--congestion cubic] [--quick] [--json F]
  (also `rayfabric bench --link RATES ...`, the form from before the subcommands)

Two Ray nodes, each started with `ray start` in its own network namespace (rayfabric.tools.netns),
joined by one veth pair shaped with tc to each rate in turn (both directions). Per rate, over that link:
  raw TCP     a TCP stream between two processes (rayfabric-bench's ceiling)
  raw read    fi_read between two processes, same provider, into memory already mapped
              (rayfabric-bench --listen in node B's namespace, --peer in node A's)
  ray         a task on node A ray.get()s a fresh object made on node B (Ray's object manager)
  rayfabric   the same, with rayfabric.get (agents on the link's interfaces)
The two Ray paths alternate rep by rep, on fresh objects (the first rep of each size warms up and
is not counted); every object's sha256 is checked against one computed on node B. Reported per
rate and size: each path's median throughput as a fraction of the link rate, rayfabric against
Ray and against the raw read, CPU seconds per GB moved (user+sys of every process in both
namespaces: raylets, workers, agents, the driver), and where rayfabric.get's time went (its
phases, as `rayfabric bench` prints them) beside one raw read of the size. Both paths ride TCP:
the namespaces' TCP congestion control (printed; --congestion sets it before Ray starts, else a
new namespace's default, the initial namespace's) paces them (docs/benchmarks-history.md, "TCP congestion
control"). The link rate is what tc lets through, Ethernet headers included, so a full link
carries about 96% of it as payload (MTU 1500).
Needs root and `ip netns` (exit 77 otherwise). No delay is added (this kernel has no sch_netem);
the namespaces' veth adds microseconds. --quick: 2gbit, 64 MiB, one rep (the CI form). Exit 1 if
any byte differs, a rayfabric get did not move its object by the fabric, a raw ceiling failed, the
nodes could not be started or the namespaces do not have the asked --congestion; exit 2 for a bad
argument (a congestion control the kernel does not have, with its list). One the kernel has but
network namespaces may not choose yet (not in net.ipv4.tcp_allowed_congestion_control, as on a
fresh Debian machine: `reno bbr`) is added to that list for the run, said so, and the list set
back at exit, also on an error or SIGTERM (and by a janitor process if this one is SIGKILLed)."""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from rayfabric import bin_dir
from rayfabric.bench.objects import parse_size, tcp_sysctl
from rayfabric.tools import netns

MiB = 1 << 20
RAW_PORT = 7311

DRIVER = netns.PAIR_DRIVER_PRELUDE + netns.CPU_DRIVER_HELPERS + r"""
NETNS = namespace_inodes({"A": None, "B": cfg["other_ns"]})

@ray.remote(num_cpus=0, resources={"nA": 0.01})
def fetch(refs, how):
    import rayfabric as rf
    from rayfabric.bench.objects import PHASE_KEYS, _instrument  # where rayfabric.get's time goes
    phases = _instrument()
    for k in PHASE_KEYS:
        phases[k] = 0.0
    before = rf.stats()["objects_pulled"] if how == "rayfabric" else 0
    t0 = time.perf_counter()
    v = ray.get(refs[0]) if how == "ray" else rf.get(refs[0], timeout=600)
    seconds = time.perf_counter() - t0
    pulled = rf.stats()["objects_pulled"] - before if how == "rayfabric" else 0
    ms = {k: round(phases[k] * 1e3, 3) for k in PHASE_KEYS} if how == "rayfabric" else {}
    return seconds, hashlib.sha256(v.tobytes()).hexdigest(), pulled, ms

rayfabric.init(node_env={by_name[k]: v for k, v in cfg["node_env"].items()}, watch_new_nodes=False)
rows = []
seed = 1000
for nbytes in cfg["sizes"]:
    for rep in range(cfg["reps"] + 1):  # rep 0 warms up and is not counted
        for how in (("ray", "rayfabric") if rep % 2 == 0 else ("rayfabric", "ray")):
            seed += 1
            ref = make.remote(nbytes, seed)
            want = ray.get(digest_at_source.remote([ref]))
            cpu0 = cpu_ticks(NETNS)
            seconds, got, pulled, phases_ms = ray.get(fetch.remote([ref], how))
            cpu = sum(cpu_seconds_between(cpu0, cpu_ticks(NETNS)).values())
            rows.append({"path": how, "bytes": nbytes, "rep": rep, "seconds": seconds, "cpu_s": cpu,
                         "ok": got == want, "pulled": pulled, "phases_ms": phases_ms})
            del ref
rayfabric.shutdown()
print("RESULT " + json.dumps(rows))
"""


def raw_over_link(provider, sizes, iters):
    """rayfabric-bench between the two namespaces over link 0: fi_read per size and a TCP stream
    (GB/s), or {"error": why}."""
    exe = os.path.join(bin_dir(), "bench", "rayfabric-bench")
    if not os.path.exists(exe):
        return {"error": f"{exe} not found (build it: ninja -C build)"}
    dev_a, dev_b, _, ip_b = netns.LINKS[0]
    ns_a, ns_b = netns.NAMESPACES
    server = subprocess.Popen(["ip", "netns", "exec", ns_b, exe, "--listen", str(RAW_PORT), "--provider", provider,
                               "--domain", dev_b], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        time.sleep(0.3)  # the client retries its connect, this only saves a retry
        cmd = ["ip", "netns", "exec", ns_a, exe, "--peer", f"{ip_b}:{RAW_PORT}", "--provider", provider,
               "--domain", dev_a, "--op", "read", "--verify", "--iters", str(iters),
               "--sizes", ",".join(str(s) for s in sizes), "--json", path]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            return {"error": f"rayfabric-bench exited {p.returncode}: {p.stderr.strip()[-400:]}"}
        with open(path) as f:
            raw = json.load(f)
        return {"read_gbytes": {r["size"]: r["gbps"] for r in raw["results"]},
                "tcp_gbytes": raw["ceilings"]["tcp_stream_gbps"], "engine": raw.get("engine")}
    except (subprocess.TimeoutExpired, OSError, ValueError) as e:
        return {"error": f"rayfabric-bench: {e}"}
    finally:
        server.kill()
        server.wait()
        os.unlink(path)


def congestion_in(ns):
    """The namespace's TCP congestion control (a new namespace starts with the initial namespace's):
    it paces Ray's connections and the tcp provider's alike (docs/benchmarks-history.md, "TCP congestion
    control"). None when it cannot be read."""
    try:
        p = netns.in_ns(ns, "cat", "/proc/sys/net/ipv4/tcp_congestion_control", check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() or None


def congestion_list(kind):
    """/proc/sys/net/ipv4/tcp_{kind}_congestion_control as a list (None: unreadable)."""
    value = tcp_sysctl(f"tcp_{kind}_congestion_control")
    return None if value is None else value.split()


def congestion_refusal(name):
    """Why the namespaces cannot be given congestion control `name`, or None: the kernel must have
    it (tcp_available_congestion_control). One it has but namespaces may not choose yet (not in
    tcp_allowed_congestion_control) is allowed for the run by main (netns.CongestionAllowed)."""
    available, allowed = congestion_list("available"), congestion_list("allowed")
    if available is None or allowed is None:
        return ("cannot read /proc/sys/net/ipv4/tcp_available_congestion_control and "
                "tcp_allowed_congestion_control here (a kernel before 4.15 has no per-namespace setting)")
    if name not in available:
        return (f"this kernel offers {', '.join(available) or 'none'} (tcp_available_congestion_control; "
                f"`modprobe tcp_{name}` loads a module of that name)")
    return None


def say_allowed(allowance):
    """What the run did to the host's allowed list, for the user (None: nothing)."""
    if not allowance.widened:
        return None
    return (f"--congestion {allowance.name}: the kernel has it, but network namespaces may choose only from "
            f"{', '.join(allowance.before)} (net.ipv4.tcp_allowed_congestion_control); allowed for this run "
            f"(set to \"{' '.join(allowance.widened_to)}\"), set back to \"{' '.join(allowance.before)}\" at exit")


def say_restored(allowance):
    """What the allowed list is after the run, for the user (None: the run did not change it)."""
    if not allowance.widened:
        return None
    after = allowance.after_exit
    if after is not None and sorted(after) == sorted(allowance.before):
        return f"net.ipv4.tcp_allowed_congestion_control set back to \"{' '.join(after)}\" (as before the run)"
    return (f"net.ipv4.tcp_allowed_congestion_control changed during the run by someone else (now "
            f"\"{' '.join(after or ['unreadable'])}\"): left as it is")


def summarize(rate, nbytes, rows, raw):
    link = netns.rate_bits(rate)
    out = {"link": rate, "bytes": nbytes}
    for how in ("ray", "rayfabric"):
        timed = [r for r in rows if r["path"] == how and r["bytes"] == nbytes and r["rep"] > 0]
        med = statistics.median(r["seconds"] for r in timed)
        out[how] = {"seconds": med, "link_fraction": nbytes * 8 / med / link,
                    "cpu_s_per_gb": statistics.median(r["cpu_s"] / (nbytes / 1e9) for r in timed)}
    read = (raw.get("read_gbytes") or {}).get(nbytes)
    out["raw_read_fraction"] = read * 8e9 / link if read else None
    out["raw_tcp_fraction"] = raw["tcp_gbytes"] * 8e9 / link if raw.get("tcp_gbytes") else None
    out["rf_vs_ray"] = out["ray"]["seconds"] / out["rayfabric"]["seconds"]
    out["rf_vs_raw_read"] = out["rayfabric"]["link_fraction"] / out["raw_read_fraction"] if read else None
    rf_timed = [r["phases_ms"] for r in rows if r["path"] == "rayfabric" and r["bytes"] == nbytes and r["rep"] > 0
                and r.get("phases_ms")]
    out["rayfabric"]["phases_ms"] = ({k: round(statistics.median(p[k] for p in rf_timed), 3) for k in rf_timed[0]}
                                     if rf_timed else {})
    # The raw read's time for one object of this size over the same link, beside the agent's read.
    out["raw_read_ms"] = nbytes / read / 1e6 if read else None
    return out


def pct(x):
    return f"{100 * x:.1f}%" if x is not None else "-"


def print_table(summaries):
    print(f"\n{'link':>8s} {'size':>6s} {'raw TCP':>8s} {'raw read':>9s} {'Ray':>7s} {'rayfabric':>10s} "
          f"{'rf/Ray':>7s} {'rf/raw read':>12s} {'CPU s/GB Ray':>13s} {'CPU s/GB rf':>12s}")
    for s in summaries:
        print(f"{s['link']:>8s} {s['bytes'] // MiB:5d}M {pct(s['raw_tcp_fraction']):>8s} "
              f"{pct(s['raw_read_fraction']):>9s} {pct(s['ray']['link_fraction']):>7s} "
              f"{pct(s['rayfabric']['link_fraction']):>10s} {s['rf_vs_ray']:6.2f}x "
              f"{pct(s['rf_vs_raw_read']):>12s} {s['ray']['cpu_s_per_gb']:13.2f} "
              f"{s['rayfabric']['cpu_s_per_gb']:12.2f}")
    print("(fractions of the link rate; rf/raw read: rayfabric's throughput over the raw fi_read's "
          "on the same link)")
    steps = ("wait", "locations", "pull_rpc", "agent_lease", "agent_create", "agent_prepare", "agent_post",
             "agent_wait", "agent_seal", "agent_total", "local_get")
    if not any(s["rayfabric"].get("phases_ms") for s in summaries):
        return
    print("\nwhere rayfabric.get's time goes, ms, each column the median of the repetitions (exists = waiting for "
          "the object to exist; Pull = the RPC to the local agent, lease..total = the agent's steps inside it, read = "
          "its wait for the fi_read; raw = one raw fi_read of the size at the raw read's rate)")
    label = {"wait": "exists", "locations": "locate", "pull_rpc": "Pull", "agent_wait": "read",
             "local_get": "ray.get"}
    print(f"{'link':>8s} {'size':>6s} {'get':>8s} " + " ".join(f"{label.get(x, x.replace('agent_', '')):>8s}"
                                                                 for x in steps)
          + f" {'raw':>8s}")
    for s in summaries:
        ph = s["rayfabric"].get("phases_ms") or {}
        raw = f"{s['raw_read_ms']:8.1f}" if s.get("raw_read_ms") else f"{'-':>8s}"
        print(f"{s['link']:>8s} {s['bytes'] // MiB:5d}M {s['rayfabric']['seconds'] * 1e3:8.1f} "
              + " ".join(f"{ph[x]:8.1f}" if x in ph else f"{'-':>8s}" for x in steps) + f" {raw}")


def run_links(a, rates, sizes, allowance):
    """Both nodes started in their namespaces, then per rate: the raw ceilings and the driver's rows.
    Returns (results, summaries, the namespaces' congestion control as read); the namespaces are
    torn down however it ends."""
    dev_a, dev_b = netns.LINKS[0][:2]
    cfg = {"sizes": sizes, "reps": a.reps, "other_ns": netns.NAMESPACES[1],
           "node_env": {"nA": {"RAYFABRIC_DOMAIN": dev_a, "RAYFABRIC_PROVIDER": a.provider},
                        "nB": {"RAYFABRIC_DOMAIN": dev_b, "RAYFABRIC_PROVIDER": a.provider}}}
    extra = {k: os.environ[k] for k in ("PYTHONPATH", "RAYFABRIC_BIN_DIR") if k in os.environ}
    pair = netns.NetnsPair(links=1, store_bytes=max(300 * MiB, 4 * max(sizes)), congestion=a.congestion)
    print(f"rayfabric bench link: 2 nodes in network namespaces, one link shaped to {', '.join(rates)} in turn; "
          f"objects of {', '.join(f'{s // MiB} MiB' for s in sizes)}; {a.reps} repetitions (+1 warm-up); "
          f"{a.provider}", flush=True)
    if allowance is not None and allowance.widened:
        print(f"  {say_allowed(allowance)}", flush=True)
    results, summaries, congestion = [], [], None
    try:
        try:
            pair.start()
        except RuntimeError as e:  # a command that set up the namespaces or Ray in them failed
            raise SystemExit(f"rayfabric bench link: could not start the two nodes: {e}") from e
        # The source's side (B) sends the bytes, so its setting paces them; both are read.
        seen = {ns: congestion_in(ns) for ns in (netns.NAMESPACES[1], netns.NAMESPACES[0])}
        congestion = seen[netns.NAMESPACES[1]] if len(set(seen.values())) == 1 else (
            ", ".join(f"{ns}: {v or 'unreadable'}" for ns, v in seen.items()))
        print(f"  TCP congestion control in the namespaces: {congestion or 'unreadable'}"
              + ("" if a.congestion else " (a new namespace's default: the initial namespace's)"), flush=True)
        if a.congestion and set(seen.values()) != {a.congestion}:
            raise SystemExit(f"rayfabric bench link: asked for --congestion {a.congestion}, the namespaces have "
                             f"{congestion or 'a setting that could not be read'}")
        for rate in rates:
            pair.shape(rate)
            t0 = time.monotonic()
            raw = raw_over_link(a.provider, sizes, iters=max(3, a.reps))
            if "error" in raw:
                print(f"  {rate}: raw ceiling not measured: {raw['error']}", flush=True)
            out = pair.run_driver(DRIVER, json.dumps(cfg), extra_env=extra, timeout=3600)
            rows = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
            results.append({"link": rate, "raw": raw, "rows": rows})
            for nbytes in sizes:
                summaries.append(summarize(rate, nbytes, rows, raw))
            print(f"  {rate}: done ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        pair.stop()
    return results, summaries, congestion


def main(argv=None):
    p = argparse.ArgumentParser(prog="rayfabric bench link", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--link", default="2gbit,10gbit,25gbit", help="tc rates, comma list (e.g. 2gbit,10gbit)")
    p.add_argument("--sizes", default="64M,512M", help="object sizes, comma list (default 64M,512M)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per size and path (+1 warm-up)")
    p.add_argument("--provider", default="tcp;ofi_rxm", help="libfabric provider of agents and raw read")
    p.add_argument("--congestion", help="TCP congestion control of the two namespaces, set before Ray starts "
                   "(e.g. cubic, bbr; one of /proc/sys/net/ipv4/tcp_available_congestion_control: one "
                   "that tcp_allowed_congestion_control does not list is added to it for the run, and "
                   "the list set back at exit); default: what a new namespace gets, the initial namespace's")
    p.add_argument("--quick", action="store_true", help="2gbit, 64 MiB, one repetition")
    p.add_argument("--json", help="write every row and summary here")
    a = p.parse_args(argv)
    if a.quick:
        a.link, a.sizes, a.reps = "2gbit", "64M", 1
    # Every bad argument is refused before any namespace or Ray node is made.
    rates = [r.strip() for r in a.link.split(",") if r.strip()]
    if not rates:
        p.error("--link: no rate given (e.g. 2gbit,10gbit)")
    for r in rates:
        try:
            netns.rate_bits(r)
        except ValueError as e:
            p.error(f"--link: {e}")
    try:
        sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes {a.sizes!r}: use sizes such as 64M,512M")
    if not sizes or min(sizes) <= 0:
        p.error(f"--sizes {a.sizes!r}: give at least one size above zero (e.g. 64M,512M)")
    if a.reps < 1:
        p.error("--reps: at least 1")
    skipped = netns.cannot_run(netns.NetnsPair, "rayfabric bench link")
    if skipped:
        return skipped
    if a.congestion:
        why_not = congestion_refusal(a.congestion)
        if why_not:
            p.error(f"--congestion {a.congestion}: {why_not}")
    allowance = None
    if a.congestion:
        allowance = netns.CongestionAllowed(a.congestion)
        try:
            allowance.apply()
        except RuntimeError as e:
            p.error(f"--congestion {a.congestion}: {e}")
    # SIGTERM (a timeout, a kill) ends the run as an error does: namespaces torn down, the allowed list
    # restored (its janitor restores it even after SIGKILL).
    on_term = (signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
               if threading.current_thread() is threading.main_thread() else None)
    try:
        results, summaries, congestion = run_links(a, rates, sizes, allowance)
    finally:
        if allowance is not None:
            allowance.restore()
            if allowance.widened:
                print(say_restored(allowance), flush=True)
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)
    print_table(summaries)
    rows = [r for res in results for r in res["rows"]]
    bad = [r for r in rows if not r["ok"] or (r["path"] == "rayfabric" and r["pulled"] != 1)]
    print(f"\nbytes verified: {'all' if not bad else f'{len(bad)} BAD'} ({len(rows)} gets, sha256 against "
          f"the source's); rayfabric gets that did not move their object by the fabric: "
          f"{sum(1 for r in rows if r['path'] == 'rayfabric' and r['pulled'] != 1)}")
    raw_failed = [res["link"] for res in results if res["raw"].get("error")]
    if raw_failed:
        print(f"raw ceiling not measured on: {', '.join(raw_failed)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"provider": a.provider, "reps": a.reps, "tcp_congestion_control": congestion,
                       "runs": results, "summary": summaries}, f, indent=1)
    return 1 if bad or raw_failed else 0


if __name__ == "__main__":
    sys.exit(main())
