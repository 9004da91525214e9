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


# One configuration surface: every setting a row of python/rayfabric/settings.json, side "python"
# (the package's own: rayfabric.settings.TABLE) or "agent" (compiled into the C++ table by
# scripts/gen_config_table.py: src/common/config.cc, listed by `rayfabric-fabric-info --settings
# --json`).
sys.path.insert(0, str(ROOT / "python"))
from rayfabric import settings  # noqa: E402

# The Python library's modules: the package's own files (its programs are in rayfabric/bench/ and
# rayfabric/tools/: benchmarks, demo, doctor, netns, hugepages).
LIBRARY_FILES = sorted((ROOT / "python" / "rayfabric").glob("*.py"))
# Variables the package sets for itself, never a user's setting.
INTERNAL = {"RAYFABRIC_AUTOLOAD_CHAINED_SETUP_HOOK"}
GENERATOR = ROOT / "scripts" / "gen_config_table.py"
KEYS = {"name", "env", "side", "type", "min", "max", "choices", "default", "doc"}
BOUNDED = {"int", "bytes", "bytes_or_share"}
INT64 = (-(1 << 63), (1 << 63) - 1)
AGENT = [r for r in settings.ROWS if r["side"] == "agent"]


def engine_table():
    bin_dir = os.environ.get("RAYFABRIC_BIN_DIR") or str(ROOT / "build")
    tool = Path(bin_dir) / "tools" / "fabric_info" / "rayfabric-fabric-info"
    if not tool.exists():
        pytest.skip(f"no {tool}: build first (ninja -C build)")
    out = subprocess.run([str(tool), "--settings", "--json"], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("RAYFABRIC_")})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def size(text):
    """A size as the agent reads one (rayfabric::ParseBytes), else None."""
    m = re.fullmatch(r"(\d+)(|B|[Kk]|KiB|[Mm]|MiB|[Gg]|GiB)", text)
    return int(m[1]) << {"": 0, "B": 0, "K": 10, "M": 20, "G": 30}[m[2][:1].upper()] if m else None


def agent_value(row, text):
    """`text` as a value of the agent's `row` (what Config::Validate allows), else None."""
    kind = row["type"]
    if kind in ("text", "list"):
        return text
    if kind == "bool":
        return text in ("1", "true", "yes", "on", "0", "false", "no", "off", "") or None
    if kind == "choice":
        return text if text in row["choices"] else None
    if kind == "bytes_or_share" and text.endswith("%"):
        try:
            return text if 0 < float(text[:-1]) <= 100 else None
        except ValueError:
            return None
    number = (int(text) if re.fullmatch(r"-?\d+", text) else None) if kind == "int" else size(text)
    if number is None or not row.get("min", INT64[0]) <= number <= row.get("max", INT64[1]):
        return None
    return number


def test_every_row_has_one_side_and_a_unique_name_and_variable():
    assert settings.ROWS and AGENT and settings.TABLE
    names = [r["name"] for r in settings.ROWS]
    envs = [r["env"] for r in settings.ROWS]
    assert len(set(names)) == len(names), [n for n in names if names.count(n) > 1]
    assert len(set(envs)) == len(envs), [e for e in envs if envs.count(e) > 1]
    for r in settings.ROWS:
        assert set(r) <= KEYS and {"name", "env", "side", "type", "default", "doc"} <= set(r), r
        assert r["side"] in settings.SIDES, r
        assert r["env"] == "RAYFABRIC_" + r["name"].upper(), r
        assert r["type"] in settings.ALL_TYPES, r
        assert isinstance(r["default"], str) and isinstance(r["doc"], str) and len(r["doc"]) > 20, r
    # TABLE is exactly the python rows, in their order
    assert [s.name for s in settings.TABLE] == [r["name"] for r in settings.ROWS if r["side"] == "python"]


def test_every_python_row_has_a_type_a_default_it_allows_and_a_doc():
    for s in settings.TABLE:
        assert s.type in settings.TYPES, s
        settings.parse(s, s.default)  # the default is a value of its own type
        if s.type in ("bool", "choice"):
            assert s.choices and s.default in [v for v, _ in s.choices], s
            assert all(len(c) == 2 and all(isinstance(x, str) and x for x in c) for c in s.choices), s
        else:
            assert not s.choices, s
        row = next(r for r in settings.ROWS if r["name"] == s.name)
        assert "min" not in row and "max" not in row, row


def test_every_agent_row_is_valid_for_its_type():
    for r in AGENT:
        assert r["type"] != "seconds", r  # not a C++ type
        if r["type"] in BOUNDED:
            for key in ("min", "max"):
                if key in r:
                    assert isinstance(r[key], int) and not isinstance(r[key], bool), r
                    assert INT64[0] <= r[key] <= INT64[1], r
            assert r.get("min", INT64[0]) <= r.get("max", INT64[1]), r
        else:
            assert "min" not in r and "max" not in r, r
        if r["type"] == "choice":
            assert r["choices"] and all(isinstance(c, str) and c and "|" not in c for c in r["choices"]), r
        else:
            assert "choices" not in r, r
        assert agent_value(r, r["default"]) is not None, r  # the default is allowed


def bound_in_words(row):
    """What Config's listing says of a row's bounds (BoundInWords in config.cc)."""
    sizes = row["type"] != "int"

    def word(v):
        if sizes and v >= 1 << 20 and v % (1 << 20) == 0:
            return f"{v >> 20}M"
        if sizes and v >= 1 << 10 and v % (1 << 10) == 0:
            return f"{v >> 10}K"
        return str(v)
    low, high = row.get("min"), row.get("max")
    if low is not None and high is not None:
        return f"in [{word(low)}, {word(high)}]"
    return f"at least {word(low)}" if low is not None else f"at most {word(high)}" if high is not None else ""


def test_the_built_cpp_table_is_the_json_agent_rows():
    # The C++ table as the build compiled it: every agent row, in order, with its variable, type,
    # bounds or choices, default and doc; no other row. Fails when the generation drifts.
    engine = engine_table()
    assert [r["name"] for r in engine] == [r["name"] for r in AGENT]
    for built, row in zip(engine, AGENT):
        assert built["env"] == row["env"], (built, row)
        assert built["type"].replace(" ", "_") == row["type"], (built, row)
        assert built["default"] == row["default"] and built["value"] == row["default"], (built, row)
        assert built["doc"] == row["doc"], (built, row)
        if row["type"] == "choice":
            assert built["allows"] == ", ".join(row["choices"][:-1]) + " or " + row["choices"][-1], built
        bound = bound_in_words(row)
        assert (bound in built["allows"]) if bound else not re.search(r"at least|at most|in \[", built["allows"]), \
            (built, row)


def test_the_generator_refuses_a_bad_row_with_its_name(tmp_path):
    good = {"name": "x_y", "env": "RAYFABRIC_X_Y", "side": "agent", "type": "int", "default": "1",
            "doc": "a setting of the test"}
    for bad, why in [({"type": "seconds"}, "is not one the agent reads"), ({"min": 5, "max": 1}, "min 5 > max 1"),
                     ({"type": "choice", "default": "a"}, "needs choices"),
                     ({"type": "choice", "choices": ["b"], "default": "a"}, "is not one of"),
                     ({"type": "bool", "min": 1}, "has no min or max"), ({"side": "both"}, "side must be"),
                     ({"colour": "red"}, "unknown keys")]:
        src = tmp_path / "settings.json"
        src.write_text(json.dumps({"settings": [{**good, **bad}]}))
        r = subprocess.run([sys.executable, str(GENERATOR), str(src), str(tmp_path / "out.inc")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "x_y" in r.stderr and why in r.stderr, (bad, r.stderr)
    src.write_text(json.dumps({"settings": [good, {**good, "name": "p", "env": "RAYFABRIC_P", "side": "python"}]}))
    r = subprocess.run([sys.executable, str(GENERATOR), str(src), str(tmp_path / "out.inc")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "out.inc").read_text()
    assert '{"x_y", "RAYFABRIC_X_Y",' in out and "SettingType::kInt" in out and '"RAYFABRIC_P"' not in out


def test_the_two_sides_cover_every_variable_the_library_reads():
    engine = engine_table()
    cpp = {row["env"] for row in engine}
    py = {s.env for s in settings.TABLE}
    assert not cpp & py, f"in both tables: {cpp & py}"
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
