"""The Python package's own settings: one table, in the shape of the C++ one (src/common/config.cc:
name, environment variable, type, default, doc), read in one place with one parser per type. A bad
value is a ValueError that names the variable, its value and what it allows.

The agent's and the engine's settings (RAYFABRIC_PROVIDER, RAYFABRIC_CHUNK_SIZE, ...) are the C++
table's: `rayfabric-fabric-info --settings [--json]` lists them, and `rayfabric doctor --settings`
lists both tables, as `ucx_info -c` does. No name is in both (tests/python/test_settings.py).
Standard library only."""
import os
from collections import namedtuple

# choices: for "choice" and "bool", ((value, what it does), ...); a bool's are ("1", on), ("0", off).
Setting = namedtuple("Setting", "name env type default doc choices")
Setting.__new__.__defaults__ = ((),)

TYPES = ("bool", "bytes", "seconds", "choice", "text")

TABLE = (
    Setting("autoload", "RAYFABRIC_AUTOLOAD", "bool", "1",
            "transparent mode in every Ray driver and worker of a cluster where `rayfabric start` ran "
            "(the installed start-up hook); 0 keeps a job out. Read by the hook itself "
            "(python/_rayfabric_autoload.py, before rayfabric is imported), with the same values; a "
            "value that is neither keeps transparent mode off, said once.",
            (("1", "transparent mode in the job's processes"), ("0", "the job keeps Ray's path"))),
    Setting("min_object_bytes", "RAYFABRIC_MIN_OBJECT_BYTES", "bytes", "64K",
            "objects smaller than this go through Ray's own path (a pull's fixed cost is not worth it)."),
    Setting("min_pull_bytes", "RAYFABRIC_MIN_PULL_BYTES", "bytes", "1M",
            "a get whose remote objects add up to less than this goes through Ray's own path (one "
            "Pull costs a few round trips between processes; docs/benchmarks.md: crossover near 1 MiB "
            "on loopback TCP)."),
    Setting("pull_timeout_s", "RAYFABRIC_PULL_TIMEOUT_S", "seconds", "60",
            "the bound on one Pull of a get (per round); past it the get falls back to Ray's path."),
    Setting("own_locations", "RAYFABRIC_OWN_LOCATIONS", "bool", "1",
            "where a process finds the locations of the objects it owns.",
            (("1", "the locations of what a process owns are read from its own record"),
             ("0", "asked of the owner's RPC, as for borrowed objects"))),
    Setting("pull_socket", "RAYFABRIC_PULL_SOCKET", "bool", "1",
            "how a process asks this node's agent for a pull.",
            (("1", "pulls are asked of this node's agent over its pull socket"),
             ("0", "over gRPC on its local socket"))),
    Setting("fallback_report_timeout_s", "RAYFABRIC_FALLBACK_REPORT_TIMEOUT_S", "seconds", "2",
            "the bound on one report to this node's agent of what this process left to Ray's path."),
    Setting("waits", "RAYFABRIC_WAITS", "bool", "1",
            "transparent mode: who fetches for ray.wait(fetch_local=True) (rayfabric.waits).",
            (("1", "ray.wait(fetch_local=True) pulls by the fabric"), ("0", "ray.wait is Ray's alone"))),
    Setting("args", "RAYFABRIC_ARGS", "bool", "1",
            "transparent mode: who moves call arguments (rayfabric.args).",
            (("1", "the destination's agent reads them into its store by the fabric before the call goes"),
             ("0", "Ray's own pull"))),
    Setting("args_claim_wait_s", "RAYFABRIC_ARGS_CLAIM_WAIT_S", "seconds", "2",
            "how long a call waits for its destination to read its existing arguments (0: never; the "
            "prefetch then races Ray's own pull, which it loses almost always)."),
    Setting("args_wait_for", "RAYFABRIC_ARGS_WAIT_FOR", "choice", "sealed",
            "what a call with ready arguments waits for (at most args_claim_wait_s) before it is "
            "submitted; claimed goes sooner, but Ray's pull does not wait for an unsealed replica and "
            "moves the object too (issue 30).",
            (("sealed", "a call waits until its arguments are in the destination's store"),
             ("claimed", "until their replicas are created"))),
    Setting("args_pending", "RAYFABRIC_ARGS_PENDING", "choice", "ray",
            "an argument still being computed at submission (or one a call could not wait for, from "
            "an event loop): Ray's pull starts the moment it exists and moves all of it whatever the "
            "agent does.",
            (("ray", "an argument still being computed at submission is left to Ray's own pull"),
             ("race", "the destination's agent pulls it too, racing Ray's pull"))),
    Setting("metrics_interval_s", "RAYFABRIC_METRICS_INTERVAL_S", "seconds", "5",
            "how often each node's agent counters are exported to Ray's metrics (0: not exported)."),
    Setting("bin_dir", "RAYFABRIC_BIN_DIR", "text", "",
            "where the C++ binaries are (a meson build directory); empty: inside the installed "
            "package, else the source tree's build/."),
)
BY_NAME = {s.name: s for s in TABLE}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30,
          "GIB": 1 << 30}


def allows(setting):
    """What `setting` allows, in words (each choice with what it does; the default said)."""
    if setting.choices:
        each = [f"{value} ({'the default: ' if value == setting.default else ''}{meaning})"
                for value, meaning in setting.choices]
        return ", ".join(each[:-1]) + " or " + each[-1]
    return {"bytes": "a size (4096, 64K, 4M, 1G)", "seconds": "seconds, >= 0",
            "text": "text"}[setting.type] + f" (default {setting.default!r})"


def parse(setting, text):
    """`text` as a value of `setting`; ValueError (naming the variable) when it is not one."""
    value = str(text).strip()
    if setting.type == "text":
        return value
    low = value.lower()
    if setting.type == "bool" and (low in _TRUE or low in _FALSE):
        return low in _TRUE
    if setting.type == "choice" and low in [v for v, _ in setting.choices]:
        return low
    if setting.type == "seconds":
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if 0 <= seconds < float("inf"):
            return seconds
    if setting.type == "bytes":
        digits = value.rstrip("BbKkMmGgIi")
        unit = value[len(digits):].upper()
        if digits.isdigit() and unit in _UNITS:
            return int(digits) * _UNITS[unit]
    raise ValueError(f"{setting.env}={text!r}: use {allows(setting)}")


def get(name, env=None):
    """The value of setting `name`, from `env` (a mapping; default: this process's environment),
    else its default."""
    setting = BY_NAME[name]
    source = os.environ if env is None else env
    raw = source.get(setting.env)
    return parse(setting, setting.default if raw is None or (raw == "" and setting.type != "text")
                 else raw)

