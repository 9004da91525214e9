"""The `rayfabric` command (also `python -m rayfabric`):

    rayfabric start  [--address ADDR] [--provider P]   agents on every node of a running cluster
    rayfabric stop   [--address ADDR]                  stop them (the cluster keeps running)
    rayfabric status [--address ADDR] [--json]         per-node provider, counters, fallbacks by reason
    rayfabric demo   [--size-mb N] [--provider P]      README's main job (its own local cluster)
    rayfabric doctor [--json] ...                      what this node's fabric can do
    rayfabric bench  ...                               Ray vs rayfabric, side by side
    rayfabric bench-args ... (or bench --args)         call arguments: Ray alone vs rayfabric.args

start is idempotent: run it again after nodes join (agents that run are kept)."""
import argparse
import importlib.util
import json
import os
import sys


def _connect(address):
    import ray
    ray.init(address=address, logging_level="ERROR", namespace="rayfabric-cli")


def _mib(n):
    return "-" if n is None else f"{n / 2**20:.1f}"


def _share(x):
    return "-" if x is None else f"{x:.0%}"


def _shown(value):
    """A value from the cluster's KV as one printable line: control characters (a terminal's escape
    sequences, line breaks) escaped."""
    text = "-" if value is None else str(value)
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _print_status(st):
    rows = st["agents"]
    if not rows:
        print("no rayfabric agents published in this cluster (`rayfabric start`)")
        return
    # Per node: the best fabric, peers pulled from, objects and bytes in (pulled) and out (served
    # to peers), the rate of both since the agent started, leases and pinned bytes now, failures,
    # the objects this node's processes left to Ray's own transfer (fallbacks; why, below), the bytes
    # Ray's own object manager brought in (its metric) and the fabric's share of all that came in.
    print(f"{'node':14s} {'address':22s} {'provider':14s} {'domain':8s} {'exposure':8s} {'auth':9s} "
          f"{'peers':>5s} {'pulled':>7s} {'MiB in':>9s} {'MiB out':>9s} {'MiB/s':>7s} {'up s':>7s} "
          f"{'leases':>6s} {'pinned MiB':>10s} {'failed':>6s} {'fallbacks':>9s} {'Ray MiB in':>10s} {'coverage':>8s}")
    for node, a in sorted(rows.items()):
        if not a.get("alive"):
            print(f"{_shown(node)[:12]:14s} {_shown(a.get('address')):22s} DEAD: {_shown(a.get('error', ''))}")
            continue
        auth = "+".join(x for x, on in (("token", a.get("token_auth")), ("tls", a.get("tls"))) if on) or "none"
        up_s = a.get("uptime_ms", 0) / 1000
        moved = a["bytes_pulled"] + a["bytes_leased"]
        rate = moved / 2**20 / up_s if up_s > 0 else 0.0
        print(f"{node[:12]:14s} {a['address']:22s} {a['provider']:14s} {a['domain']:8s} {a.get('exposure', '?'):8s} "
              f"{auth:9s} {len(a.get('peer_links') or []):5d} {a['objects_pulled']:7d} "
              f"{a['bytes_pulled'] / 2**20:9.1f} {a['bytes_leased'] / 2**20:9.1f} {rate:7.1f} {up_s:7.0f} "
              f"{a['leases_active']:6d} {a['pinned_bytes'] / 2**20:10.1f} {a['pulls_failed']:6d} "
              f"{a.get('fallbacks', 0):9d} {_mib(a.get('ray_bytes_received')):>10s} {_share(a.get('coverage')):>8s}")
        fabrics = a.get("fabrics") or []
        if len(fabrics) > 1 or any(f.get("rail_domains") for f in fabrics):
            print(f"{'':14s} fabrics: " + ", ".join(
                f"{f['provider']}/{'+'.join([f['domain'], *f.get('rail_domains', [])])}" for f in fabrics))
        for link in a.get("peer_links") or []:
            rails = f" x{link['rails']} rails" if link.get("rails", 0) > 1 else ""
            print(f"{'':14s} from {link['peer']:22s} over {link['provider'] or 'NONE'}"
                  f"{'/' + link['domain'] if link['domain'] else ''}{rails}: {link['objects_pulled']} pulled, "
                  f"{link['pulls_failed']} failed" + (f" ({link['last_error'][:80]})" if link["last_error"] else ""))
        for reason, n in sorted((a.get("fallback_reasons") or {}).items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"{'':14s} to Ray's path: {n} object(s): {_shown(reason)}")
    # Which running jobs have transparent mode (the installed package turns it on in every job of
    # a cluster with agents; RAYFABRIC_AUTOLOAD=0 keeps a job out), and which keep Ray's path.
    # (What a job record says is printed escaped: anyone who reaches the cluster's KV can write one.)
    for job in st.get("jobs") or []:
        print(f"job {_shown(job.get('job_id'))}: transparent mode {_shown(job.get('mode'))} (driver pid "
              f"{_shown(job.get('pid'))} on {_shown(job.get('node_id'))[:12]}: {_shown(job.get('entrypoint'))[:80]})")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="rayfabric", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="start an agent on every node")
    s.add_argument("--address", default="auto")
    s.add_argument("--provider")
    s = sub.add_parser("stop", help="stop every agent")
    s.add_argument("--address", default="auto")
    s = sub.add_parser("status", help="agents and their counters")
    s.add_argument("--address", default="auto")
    s.add_argument("--json", action="store_true")
    sub.add_parser("demo", help="README's main job", add_help=False)
    sub.add_parser("doctor", help="what this node's fabric can do", add_help=False)
    sub.add_parser("bench", help="Ray vs rayfabric benchmark", add_help=False)
    sub.add_parser("bench-args", help="call arguments: Ray alone vs rayfabric.args", add_help=False)
    if argv and argv[0] in ("demo", "doctor", "bench", "bench-args"):
        rest = argv[1:]
        # rayfabric's own programs measure against Ray alone and turn transparent mode on where
        # they mean to: the installed package's start-up hook stays out of their jobs (drivers, and
        # the workers of the clusters they start or, through the driver's record, join).
        os.environ["RAYFABRIC_AUTOLOAD"] = "0"
        if argv[0] != "doctor" and importlib.util.find_spec("numpy") is None:
            print(f"rayfabric {argv[0]}: needs numpy, which the rayfabric library does not: "
                  "pip install 'rayfabric[bench]' (or pip install numpy)", file=sys.stderr)
            return 2
        if argv[0] == "bench-args":
            from rayfabric.bench import args as bench_args
            return bench_args.main(rest)
        if argv[0] == "demo":
            from rayfabric.tools import demo
            return demo.main(rest)
        if argv[0] == "doctor":
            from rayfabric.tools import doctor
            return doctor.main(rest)
        if "--rails" in rest:  # `rayfabric bench --rails ...`: one rail vs two on shaped links
            from rayfabric.bench import rails as bench_rails
            return bench_rails.main([x for x in rest if x != "--rails"])
        if "--broadcast" in rest:  # `rayfabric bench --broadcast ...`: one object to every node
            from rayfabric.bench import broadcast as bench_broadcast
            return bench_broadcast.main([x for x in rest if x != "--broadcast"])
        if any(x == "--link" or x.startswith("--link=") for x in rest):
            # `rayfabric bench --link RATES ...` (no --rails, --broadcast): one shaped link, Ray and
            # rayfabric next to the raw ceilings over the same link
            from rayfabric.bench import link as bench_link
            return bench_link.main(rest)
        if "--tensors" in rest:  # `rayfabric bench --tensors ...`: actor-to-actor tensors, RDT
            from rayfabric.bench import tensors as bench_tensors
            return bench_tensors.main([x for x in rest if x != "--tensors"])
        if "--args" in rest:  # `rayfabric bench --args ...`: the call-argument cases
            from rayfabric.bench import args as bench_args
            return bench_args.main([x for x in rest if x != "--args"])
        from rayfabric.bench import objects
        return objects.main(rest)
    a = p.parse_args(argv)
    import rayfabric
    _connect(a.address)
    if a.command == "start":
        records = rayfabric.init(provider=a.provider, watch_new_nodes=False)
        for node, r in sorted(records.items()):
            print(f"{node[:12]}  {r['address']:22s} {r['provider']} {r['domain']}  log {r['log']}")
        print(f"rayfabric: {len(records)} agent(s) running")
        return 0
    if a.command == "stop":
        print(f"rayfabric: stopped {rayfabric.shutdown()} agent(s)")
        return 0
    st = rayfabric.status()
    if a.json:
        print(json.dumps(st, indent=1, default=str))
    else:
        _print_status(st)
    dead = [n for n, r in st["agents"].items() if not r.get("alive")]
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main())
