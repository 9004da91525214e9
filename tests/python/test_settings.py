"""Settings the Python side reads from the environment at import: a bad value stops the import with
the variable, the value and what to use instead; good values take effect."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def import_api(**env):
    code = ("import rayfabric.api, rayfabric._pulls as p; "
            "print('OWN_LOCATIONS', p.OWN_LOCATIONS, 'PULL_SOCKET', p.PULL_SOCKET)")
    full = {**os.environ, "PYTHONPATH": str(ROOT / "python"), **env}
    for k, v in env.items():
        if v is None:
            full.pop(k)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


# (variable, name in rayfabric.api, a bad value, what its refusal must say)
SWITCHES = [
    ("RAYFABRIC_OWN_LOCATIONS", "OWN_LOCATIONS", "maybe",
     "RAYFABRIC_OWN_LOCATIONS='maybe': use 1 (the default: the locations of what a process owns are read "
     "from its own record) or 0 (asked of the owner's RPC"),
    ("RAYFABRIC_PULL_SOCKET", "PULL_SOCKET", "grpc",
     "RAYFABRIC_PULL_SOCKET='grpc': use 1 (the default: pulls are asked of this node's agent over its pull "
     "socket) or 0 (over gRPC on its local socket)"),
]


@pytest.mark.parametrize("variable, name", [(v, n) for v, n, _, _ in SWITCHES])
@pytest.mark.parametrize("value, expected", [(None, True), ("1", True), ("true", True), ("0", False),
                                             ("FALSE", False)])
def test_switch_values(variable, name, value, expected):
    r = import_api(**{variable: value})
    assert r.returncode == 0, r.stderr
    assert f"{name} {expected}" in r.stdout


@pytest.mark.parametrize("variable, name, bad, why", SWITCHES)
def test_switch_bad_value_is_refused_with_the_reason(variable, name, bad, why):
    r = import_api(**{variable: bad})
    assert r.returncode != 0
    assert why in r.stderr, r.stderr


def enable_transparent(value):
    """transparent.enable() in a fresh process (no Ray cluster needed to install the hooks) with
    RAYFABRIC_WAITS=value (None: unset); prints whether ray.wait is rayfabric's."""
    code = ("import ray; from rayfabric import _pulls, transparent, waits; transparent.enable(arguments=False); "
            "print('WAITS', waits.installed(), ray.wait is not _pulls._ray_wait); transparent.disable(); "
            "print('RESTORED', ray.wait is _pulls._ray_wait)")
    full = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    full.pop("RAYFABRIC_WAITS", None)
    if value is not None:
        full["RAYFABRIC_WAITS"] = value
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


@pytest.mark.parametrize("value, expected", [(None, True), ("1", True), ("0", False), ("false", False)])
def test_waits_switch(value, expected):
    r = enable_transparent(value)
    assert r.returncode == 0, r.stderr
    assert f"WAITS {expected} {expected}" in r.stdout and "RESTORED True" in r.stdout, r.stdout


def test_waits_switch_bad_value_is_refused_with_the_reason():
    r = enable_transparent("sometimes")
    assert r.returncode != 0
    assert ("RAYFABRIC_WAITS='sometimes': use 1 (the default: ray.wait(fetch_local=True) pulls by the fabric) "
            "or 0 (ray.wait is Ray's alone)") in r.stderr, r.stderr


def import_args(value):
    """rayfabric.args imported in a fresh process with RAYFABRIC_ARGS_WAIT_FOR=value (None: unset)."""
    code = "from rayfabric import args; print('CLAIM_MODE', repr(args.CLAIM_MODE))"
    full = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    full.pop("RAYFABRIC_ARGS_WAIT_FOR", None)
    if value is not None:
        full["RAYFABRIC_ARGS_WAIT_FOR"] = value
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


@pytest.mark.parametrize("value, expected", [(None, "'sealed'"), ("sealed", "'sealed'"), (" Claimed ", "True")])
def test_what_a_call_waits_for(value, expected):
    r = import_args(value)
    assert r.returncode == 0, r.stderr
    assert f"CLAIM_MODE {expected}" in r.stdout, r.stdout


def test_a_bad_wait_for_is_refused_with_both_choices():
    r = import_args("soon")
    assert r.returncode != 0
    assert ("RAYFABRIC_ARGS_WAIT_FOR='soon': use sealed (the default: a call waits until its arguments are in "
            "the destination's store) or claimed (until their replicas are created)") in r.stderr, r.stderr


def test_a_bad_pending_mode_is_refused_with_both_choices():
    code = "from rayfabric import args; print('PENDING', args.PENDING)"
    full = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "RAYFABRIC_ARGS_PENDING": "maybe"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert r.returncode != 0
    assert ("RAYFABRIC_ARGS_PENDING='maybe': use ray (the default: an argument still being computed at submission "
            "is left to Ray's own pull) or race (the destination's agent pulls it too, racing Ray's pull)") in r.stderr
    full["RAYFABRIC_ARGS_PENDING"] = " Race "
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert r.returncode == 0 and "PENDING race" in r.stdout, r.stderr


# One configuration surface: the Python table (python/rayfabric/settings.py) beside the C++ one
# (src/common/config.cc, listed by `rayfabric-fabric-info --settings --json`).
sys.path.insert(0, str(ROOT / "python"))
from rayfabric import settings  # noqa: E402

# The Python library's modules: the package's own files (its programs are in rayfabric/bench/ and
# rayfabric/tools/: benchmarks, demo, doctor, netns, hugepages).
LIBRARY_FILES = sorted((ROOT / "python" / "rayfabric").glob("*.py"))
# Variables the package sets for itself, never a user's setting.
INTERNAL = {"RAYFABRIC_AUTOLOAD_CHAINED_SETUP_HOOK"}


def engine_table():
    bin_dir = os.environ.get("RAYFABRIC_BIN_DIR") or str(ROOT / "build")
    tool = Path(bin_dir) / "tools" / "fabric_info" / "rayfabric-fabric-info"
    if not tool.exists():
        pytest.skip(f"no {tool}: build first (ninja -C build)")
    out = subprocess.run([str(tool), "--settings", "--json"], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("RAYFABRIC_")})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_python_row_has_a_type_a_default_it_allows_and_a_doc():
    for s in settings.TABLE:
        assert s.env == "RAYFABRIC_" + s.name.upper(), s
        assert s.type in settings.TYPES, s
        assert len(s.doc) > 20, s
        settings.parse(s, s.default)  # the default is a value of its own type
        if s.type in ("bool", "choice"):
            assert s.choices and s.default in [v for v, _ in s.choices], s


def test_the_two_tables_share_no_name_and_cover_every_variable_the_library_reads():
    engine = engine_table()
    cpp = {row["env"] for row in engine}
    py = {s.env for s in settings.TABLE}
    assert not cpp & py, f"in both tables: {cpp & py}"
    assert {row["name"] for row in engine}.isdisjoint(settings.BY_NAME), "a name in both tables"
    for row in engine:
        assert row["type"] and row["allows"] and row["doc"] and row["source"] == "default", row
    mentioned = {}
    assert any(f.stem == "api" for f in LIBRARY_FILES) and not any(f.stem == "doctor" for f in LIBRARY_FILES)
    for f in LIBRARY_FILES + [ROOT / "python" / "_rayfabric_autoload.py"]:
        if f.stem.endswith("_pb2"):
            continue
        for var in re.findall(r"RAYFABRIC_[A-Z_]+", f.read_text()):
            mentioned.setdefault(var, set()).add(f.name)
    unknown = {v: sorted(m) for v, m in mentioned.items() if v not in cpp | py | INTERNAL}
    assert not unknown, f"variables the library reads that no table lists: {unknown}"


def test_the_readme_documents_every_setting_of_both_tables():
    readme = (ROOT / "README.md").read_text()
    missing = [row["env"] for row in engine_table() if f"`{row['env']}`" not in readme]
    missing += [s.env for s in settings.TABLE if f"`{s.env}`" not in readme]
    assert not missing, f"not in README.md's Configuration: {missing}"


def test_the_start_up_hook_reads_autoload_as_the_table_does():
    import _rayfabric_autoload as hook
    row = settings.BY_NAME["autoload"]
    for value in ("", "1", "0", "true", "FALSE", " yes ", "no", "on", "off"):
        assert hook.off({row.env: value}) == (not settings.get("autoload", {row.env: value})), value
    assert hook.off({}) is False and settings.get("autoload", {}) is True
    with pytest.raises(ValueError):
        settings.get("autoload", {row.env: "maybe"})
    assert hook.off({row.env: "maybe"}) is True  # the hook: a typo keeps transparent mode off


@pytest.mark.parametrize("value, parsed", [("64K", 65536), ("1M", 1 << 20), ("4096", 4096), ("2MiB", 2 << 20)])
def test_sizes(value, parsed):
    assert settings.get("min_pull_bytes", {"RAYFABRIC_MIN_PULL_BYTES": value}) == parsed


def test_doctor_lists_every_setting_and_flags_the_bad_ones():
    engine_table()  # skips without the build
    bin_dir = os.environ.get("RAYFABRIC_BIN_DIR") or str(ROOT / "build")
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAYFABRIC_")}
    doctor = [sys.executable, str(ROOT / "python" / "rayfabric" / "tools" / "doctor.py"), "--settings"]
    good = subprocess.run(doctor, capture_output=True, text=True, timeout=120, env={**base, "RAYFABRIC_BIN_DIR": bin_dir})
    assert good.returncode == 0, good.stdout + good.stderr
    for s in settings.TABLE:
        assert f"\n{s.env}=" in good.stdout, s.env
    for row in engine_table():
        assert f"\n{row['env']}={row['default']}\n" in good.stdout, row["env"]
    bad = subprocess.run(doctor + ["--json"], capture_output=True, text=True, timeout=120,
                         env={**base, "RAYFABRIC_BIN_DIR": bin_dir, "RAYFABRIC_MAX_RAILS": "99",
                              "RAYFABRIC_PULL_TIMEOUT_S": "soon"})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    report = json.loads(bad.stdout)
    assert "max_rails='99' must be in [1, 64] (from env RAYFABRIC_MAX_RAILS)" in report["engine_error"], report
    why = {r["env"]: r["error"] for r in report["python"]}
    assert why["RAYFABRIC_PULL_TIMEOUT_S"] == "RAYFABRIC_PULL_TIMEOUT_S='soon': use seconds, >= 0 (default '60')"
    assert not why["RAYFABRIC_MIN_PULL_BYTES"]
