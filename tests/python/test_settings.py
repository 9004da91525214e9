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


@pytest.mark.parametrize("value, expected", [(None, True), ("1", True), ("true", True), ("0", False),
                                             ("FALSE", False)])
def test_own_locations_values(value, expected):
    r = import_api(RAYFABRIC_OWN_LOCATIONS=value)
    assert r.returncode == 0, r.stderr
    assert f"OWN_LOCATIONS {expected}" in r.stdout


def test_own_locations_bad_value_is_refused_with_the_reason():
    r = import_api(RAYFABRIC_OWN_LOCATIONS="maybe")
    assert r.returncode != 0
    assert "RAYFABRIC_OWN_LOCATIONS='maybe': use 1 (the default" in r.stderr, r.stderr
    assert "or 0 (asked of the owner's RPC" in r.stderr, r.stderr


@pytest.mark.parametrize("value, expected", [(None, True), ("1", True), ("0", False), ("false", False)])
def test_pull_socket_values(value, expected):
    r = import_api(RAYFABRIC_PULL_SOCKET=value)
    assert r.returncode == 0, r.stderr
    assert f"PULL_SOCKET {expected}" in r.stdout


def test_pull_socket_bad_value_is_refused_with_the_reason():
    r = import_api(RAYFABRIC_PULL_SOCKET="grpc")
    assert r.returncode != 0
    assert "RAYFABRIC_PULL_SOCKET='grpc': use 1 (the default: pulls are asked of this node's agent over its " \
           "pull socket) or 0 (over gRPC on its local socket)" in r.stderr, r.stderr
