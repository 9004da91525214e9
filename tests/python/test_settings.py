"""Settings the Python side reads from the environment at import: a bad value stops the import with
the variable, the value and what to use instead; good values take effect."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def import_api(**env):
    code = "import rayfabric.api as api; print('OWN_LOCATIONS', api.OWN_LOCATIONS, 'PULL_SOCKET', api.PULL_SOCKET)"
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
    code = ("import ray; from rayfabric import api, transparent, waits; transparent.enable(arguments=False); "
            "print('WAITS', waits.installed(), ray.wait is not api._ray_wait); transparent.disable(); "
            "print('RESTORED', ray.wait is api._ray_wait)")
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
