"""The `rayfabric` command (also `python -m rayfabric`):

    rayfabric start  [--address ADDR] [--provider P]   agents on every node of a running cluster
    rayfabric stop   [--address ADDR]                  stop them (the cluster keeps running)
    rayfabric status [--address ADDR] [--json]         per-node provider, counters, fallbacks by reason
    rayfabric demo   [--size-mb N] [--provider P]      README's main job (its own local cluster)
    rayfabric doctor [--json] ...                      what this node's fabric can do
    rayfabric bench [VARIANT] ...                      benchmarks (`rayfabric bench --help` lists them):
                     objects (the default), link, rails, broadcast, tensors, args

start is idempotent: run it again after nodes join (agents that run are kept)."""
import argparse
import importlib
import importlib.util
import json
import os
import sys

# `rayfabric bench VARIANT ...`: one program each, in rayfabric.bench (rayfabric/bench/VARIANT.py);
# `rayfabric bench ...` with no variant is the objects bench. variant -> what it measures.
BENCHES = {
    "objects": "Ray vs rayfabric: object transfers side by side on a local or running cluster (the default)",
    "link": "one tc-shaped link: Ray and rayfabric next to raw fi_read and TCP (root, ip netns)",
    "rails": "one rail against two, on shaped links (root, ip netns)",
    "broadcast": "one object to every node: Ray, rayfabric direct, rayfabric.broadcast (root, ip netns)",
    "tensors": "tensors between actors: Ray's object store, RDT over rayfabric, NIXL, GLOO",
    "args": "call arguments: Ray alone against rayfabric.args",
}
# The forms from before the subcommands, still taken: the first of these flags found anywhere after
# `bench` (in this order: `bench --rails --link 1gbit` is rails) names the variant. The flag is
# dropped, except --link: the link bench's own option (its rates), kept as given.
LEGACY_BENCH_FLAGS = {"--rails": "rails", "--broadcast": "broadcast", "--link": "link", "--tensors": "tensors",
                      "--args": "args"}
# `rayfabric bench-args ...` is `rayfabric bench args ...`.
LEGACY_COMMANDS = {"bench-args": ["bench", "args"]}


def _is_flag(arg, flag):
    return arg == flag or (flag == "--link" and arg.startswith("--link="))


def bench_variant(rest):
    """(variant, its arguments, the legacy form used or None) for `rayfabric bench REST`."""
    if rest and rest[0] in BENCHES:
        return rest[0], rest[1:], None
    for flag, variant in LEGACY_BENCH_FLAGS.items():
        if any(_is_flag(x, flag) for x in rest):
            return variant, rest if flag == "--link" else [x for x in rest if x != flag], flag
    return "objects", rest, None


def _bench_help():
    width = max(map(len, BENCHES))
    return "\n".join(
        ["usage: rayfabric bench [VARIANT] [ARGS ...]", "",
         "Benchmarks, one program each (`rayfabric bench VARIANT --help`: its own options); no VARIANT: objects.",
         "", "variants:"]
        + [f"  {name:{width}s}  {what}" for name, what in BENCHES.items()]
        + ["", "Older forms still taken: " + ", ".join(f"bench {flag} (bench {v})" for flag, v in LEGACY_BENCH_FLAGS.items())
           + ", bench-args (bench args)."])


def _bench(rest):
    """`rayfabric bench [VARIANT] ...`: the variant's main(argv)."""
    if rest in (["--help"], ["-h"]):
        print(_bench_help())
        return 0
    if rest and not rest[0].startswith("-") and rest[0] not in BENCHES:
        print(f"rayfabric bench: unknown variant {rest[0]!r} (choose from {', '.join(BENCHES)}; "
              "`rayfabric bench --help`)", file=sys.stderr)
        return 2
    variant, args, legacy = bench_variant(rest)
    if legacy:
        print(f"rayfabric: `bench {legacy}` is now `rayfabric bench {variant}`", file=sys.stderr)
    return importlib.import_module(f"rayfabric.bench.{variant}").main(args)


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
    sub.add_parser("bench", help="benchmarks: " + ", ".join(BENCHES) + " (the default: objects)", add_help=False)
    if argv and argv[0] in LEGACY_COMMANDS:
        new = LEGACY_COMMANDS[argv[0]]
        print(f"rayfabric: `{argv[0]}` is now `rayfabric {' '.join(new)}`", file=sys.stderr)
        argv = new + argv[1:]
    if argv and argv[0] in ("demo", "doctor", "bench"):
        # rayfabric's own programs measure against Ray alone and turn transparent mode on where
        # they mean to: the installed package's start-up hook stays out of their jobs (drivers, and
        # the workers of the clusters they start or, through the driver's record, join).
        os.environ["RAYFABRIC_AUTOLOAD"] = "0"
        if argv[0] != "doctor" and importlib.util.find_spec("numpy") is None:
            print(f"rayfabric {argv[0]}: needs numpy, which the rayfabric library does not: "
                  "pip install 'rayfabric[bench]' (or pip install numpy)", file=sys.stderr)
            return 2
        if argv[0] == "bench":
            return _bench(argv[1:])
        return importlib.import_module(f"rayfabric.tools.{argv[0]}").main(argv[1:])
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
