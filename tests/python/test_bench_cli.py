"""`rayfabric bench VARIANT` starts that variant's program (the older flag forms too, with a note
naming the new one; an unknown variant is refused); `rayfabric bench link` refuses what it cannot
do before it makes any namespace; `rayfabric bench --report` says what TCP congestion control the
runs it merges recorded."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import pytest  # noqa: E402

from rayfabric import cli  # noqa: E402
from rayfabric.bench import link as bench_link  # noqa: E402
from rayfabric.tools import netns  # noqa: E402


def run_bench(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-m", "rayfabric", "bench", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def run(*args):
    return run_bench("link", "--link", *args)


# `rayfabric bench VARIANT`: each variant's program, known by its own usage line (its argparse prog).
USAGE = {"objects": "usage: rayfabric bench objects ", "link": "usage: rayfabric bench link ",
         "rails": "usage: rayfabric bench rails ", "broadcast": "usage: rayfabric bench broadcast ",
         "tensors": "usage: rayfabric bench tensors ", "args": "usage: rayfabric bench args "}
# The forms from before the subcommands and the variant each is: the same program, a note on stderr.
LEGACY = [(["--rails"], "rails", "bench --rails"), (["--broadcast"], "broadcast", "bench --broadcast"),
          (["--link", "2gbit"], "link", "bench --link"), (["--link=2gbit"], "link", "bench --link"),
          (["--tensors"], "tensors", "bench --tensors"), (["--args"], "args", "bench --args"),
          # the first of the table's flags wins, as before: rails' and broadcast's own --link option
          (["--quick", "--rails", "--link", "1gbit"], "rails", "bench --rails"),
          (["--broadcast", "--link", "1gbit"], "broadcast", "bench --broadcast")]


def cli_main(argv, capsys, monkeypatch):
    """(exit status, stdout, stderr) of `rayfabric ARGV` in this process (every program imported
    once), argparse's own exits (--help, refusals) included."""
    monkeypatch.setenv("RAYFABRIC_AUTOLOAD", "0")   # the CLI sets it for its programs: put back after
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _importable(variant):
    """The tensors bench needs torch at its import (the rdt extra)."""
    return variant != "tensors" or importlib.util.find_spec("torch") is not None


@pytest.mark.parametrize("variant", sorted(USAGE))
def test_each_variant_starts_its_own_program(variant, capsys, monkeypatch):
    if not _importable(variant):
        pytest.skip("torch not installed: the tensors bench needs it")
    rc, out, err = cli_main(["bench", variant, "--help"], capsys, monkeypatch)
    assert rc == 0 and out.startswith(USAGE[variant]), (out[:300], err)
    assert "is now" not in err, err   # no note for the new form
    # only that program: no other variant's usage
    assert not [v for v, u in USAGE.items() if v != variant and u in out], out[:300]


def test_no_variant_is_the_objects_bench(capsys, monkeypatch):
    _, objects_help, _ = cli_main(["bench", "objects", "--help"], capsys, monkeypatch)
    # `bench ARGS` and `bench objects ARGS` are one program with the same arguments: the same
    # refusal of the same bad value, without a note
    for argv in (["bench", "--reps", "x"], ["bench", "objects", "--reps", "x"]):
        rc, out, err = cli_main(argv, capsys, monkeypatch)
        assert rc == 2 and err.startswith("usage: rayfabric bench objects ") and "--reps: invalid int value" in err, err
        assert "is now" not in err
    assert "--huge-pages" in objects_help and "--all-providers" in objects_help


@pytest.mark.parametrize("legacy,variant,said", LEGACY, ids=[" ".join(x[0]) for x in LEGACY])
def test_each_older_form_starts_the_same_program_with_a_note(legacy, variant, said, capsys, monkeypatch):
    if not _importable(variant):
        pytest.skip("torch not installed: the tensors bench needs it")
    rc, out, err = cli_main(["bench", *legacy, "--help"], capsys, monkeypatch)
    assert rc == 0 and out.startswith(USAGE[variant]), (out[:300], err)
    assert err.splitlines() == [f"rayfabric: `{said}` is now `rayfabric bench {variant}`"], err


def test_older_forms_pass_the_same_arguments():
    assert cli.bench_variant(["--quick", "--rails", "--link", "1gbit"]) == ("rails", ["--quick", "--link", "1gbit"],
                                                                            "--rails")
    assert cli.bench_variant(["--broadcast", "--nodes", "8"]) == ("broadcast", ["--nodes", "8"], "--broadcast")
    # --link is the link bench's own option (its rates): kept
    assert cli.bench_variant(["--link", "2gbit", "--quick"]) == ("link", ["--link", "2gbit", "--quick"], "--link")
    assert cli.bench_variant(["--link=2gbit"]) == ("link", ["--link=2gbit"], "--link")
    assert cli.bench_variant(["--tensors", "--quick"]) == ("tensors", ["--quick"], "--tensors")
    assert cli.bench_variant(["--rounds", "1", "--args"]) == ("args", ["--rounds", "1"], "--args")
    assert cli.bench_variant(["link", "--link", "2gbit"]) == ("link", ["--link", "2gbit"], None)
    assert cli.bench_variant(["--quick"]) == ("objects", ["--quick"], None)
    assert cli.bench_variant([]) == ("objects", [], None)


def test_an_older_form_runs_the_program_with_its_arguments(capsys, monkeypatch):
    """Not only --help: the link bench's own refusal of its own option, by both forms."""
    for argv in (["bench", "link", "--link", ""], ["bench", "--link", ""], ["bench", "--link="]):
        rc, out, err = cli_main([*argv, "--sizes", "1M"], capsys, monkeypatch)
        assert rc == 2 and "rayfabric bench link: error: --link: no rate given" in err, (argv, err)
    rc, out, err = cli_main(["bench", "--args", "--steps", "many"], capsys, monkeypatch)
    assert rc == 2 and "rayfabric bench args: error: argument --steps: invalid int value" in err, err
    assert err.startswith("rayfabric: `bench --args` is now `rayfabric bench args`\n"), err


def test_bench_args_command_is_bench_args(capsys, monkeypatch):
    rc, out, err = cli_main(["bench-args", "--help"], capsys, monkeypatch)
    assert rc == 0 and out.startswith(USAGE["args"]), out[:300]
    assert err.splitlines() == ["rayfabric: `bench-args` is now `rayfabric bench args`"], err


def test_bench_help_lists_the_variants_and_an_unknown_one_is_refused():
    p = run_bench("--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: rayfabric bench [VARIANT] [ARGS ...]\n"), p.stdout
    listed = [line.split()[0] for line in p.stdout.split("variants:\n", 1)[1].split("\n\n", 1)[0].splitlines()]
    assert listed == list(cli.BENCHES) == ["objects", "link", "rails", "broadcast", "tensors", "args"], listed
    for variant in cli.BENCHES:
        assert os.path.exists(ROOT / "python" / "rayfabric" / "bench" / f"{variant}.py"), variant
    p = run_bench("linkk", "--quick")
    assert p.returncode == 2 and p.stdout == "", p
    assert p.stderr == ("rayfabric bench: unknown variant 'linkk' (choose from objects, link, rails, broadcast, "
                        "tensors, args; `rayfabric bench --help`)\n"), p.stderr
    # the whole command's help names the bench and its variants
    p = subprocess.run([sys.executable, "-m", "rayfabric", "--help"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    assert p.returncode == 0 and "rayfabric bench [VARIANT]" in p.stdout and "objects, link, rails" in p.stdout


def test_the_tools_start_from_the_cli_and_as_modules(capsys, monkeypatch):
    rc, out, err = cli_main(["doctor", "--help"], capsys, monkeypatch)
    assert rc == 0 and out.startswith("usage: rayfabric doctor "), out[:300]
    rc, out, err = cli_main(["demo", "--help"], capsys, monkeypatch)
    assert rc == 0 and out.startswith("usage: rayfabric demo "), out[:300]
    demo_help = out
    # a program run as a module prints the same help as through the command
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    for module, cli_help in (("rayfabric.tools.demo", demo_help), ("rayfabric.tools.doctor", None)):
        p = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                           env=env)
        assert p.returncode == 0 and p.stdout.startswith("usage: rayfabric "), (module, p)
        if cli_help is not None:
            assert p.stdout == cli_help, module


needs_lists = pytest.mark.skipif(bench_link.congestion_list("allowed") is None,
                                 reason="this kernel has no per-namespace TCP congestion control")


@needs_lists
def test_the_kernels_congestion_controls_are_read():
    available, allowed = bench_link.congestion_list("available"), bench_link.congestion_list("allowed")
    assert set(allowed) <= set(available)
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        assert f.read().strip() in available   # the namespace's own is always one of them
    assert bench_link.congestion_refusal(allowed[0]) is None


@needs_lists
def test_an_unknown_congestion_control_is_refused_with_what_the_kernel_offers():
    why = bench_link.congestion_refusal("no_such_cc")
    assert why.startswith("this kernel offers ") and "modprobe tcp_no_such_cc" in why
    for name in bench_link.congestion_list("available"):
        assert name in why
    p = run("2gbit", "--quick", "--congestion", "no_such_cc")
    if p.returncode == 77:
        pytest.skip(p.stdout.strip())   # not root / no ip netns: refused later, as the skip says
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"--congestion no_such_cc: {why}" in p.stderr and "Traceback" not in p.stderr


def test_one_the_kernel_has_is_not_refused_for_not_being_allowed_yet(monkeypatch):
    """Not in tcp_allowed_congestion_control is no refusal: main allows it for the run."""
    lists = {"available": ["reno", "cubic", "bbr"], "allowed": ["reno", "cubic"]}
    monkeypatch.setattr(bench_link, "congestion_list", lambda kind: lists[kind])
    assert bench_link.congestion_refusal("bbr") is None
    assert bench_link.congestion_refusal("cubic") is None
    assert bench_link.congestion_refusal("vegas").startswith("this kernel offers reno, cubic, bbr ")
    monkeypatch.setattr(bench_link, "congestion_list", lambda kind: None)
    assert "kernel before 4.15" in bench_link.congestion_refusal("cubic")


# CongestionAllowed against the kernel's own setting (root: it is host-wide). Each test sets the
# list it needs and `allowed_list` puts back the one the host had, whatever the test did.
ALLOWED = netns.ALLOWED_CONGESTION


read_allowed, write_allowed = netns.read_allowed_congestion, netns.write_allowed_congestion


@pytest.fixture
def allowed_list():
    """(an algorithm the kernel has other than the host's default, the host's list): the host's
    list is written back after the test."""
    if os.geteuid() != 0 or bench_link.congestion_list("allowed") is None:
        pytest.skip("needs root and a kernel with tcp_allowed_congestion_control")
    host = read_allowed()
    default = bench_link.tcp_sysctl("tcp_congestion_control")
    spare = [n for n in bench_link.congestion_list("available") if n != default]
    if not spare:
        pytest.skip(f"this kernel has no TCP congestion control besides {default}")
    yield spare[-1], host
    write_allowed(host)


def test_an_algorithm_only_available_is_allowed_for_the_run_and_the_list_set_back(allowed_list):
    name, host = allowed_list
    write_allowed([n for n in host if n != name])   # as on a fresh machine: available, not allowed
    before = read_allowed()
    ns = "rfcctest"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        with netns.CongestionAllowed(name) as allowance:
            assert allowance.widened and allowance.before == before
            assert sorted(read_allowed()) == sorted(before + [name])
            netns.NetnsPair(links=1, congestion=name)._set_congestion(ns)   # a namespace may now choose it
            assert bench_link.congestion_in(ns) == name
            said = bench_link.say_allowed(allowance)
        assert said == (f"--congestion {name}: the kernel has it, but network namespaces may choose only from "
                        f"{', '.join(before)} (net.ipv4.tcp_allowed_congestion_control); allowed for this run "
                        f"(set to \"{' '.join(before + [name])}\"), set back to \"{' '.join(before)}\" at exit")
        assert read_allowed() == before and allowance.after_exit == before
        assert bench_link.say_restored(allowance) == (
            f"net.ipv4.tcp_allowed_congestion_control set back to \"{' '.join(before)}\" (as before the run)")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_an_algorithm_allowed_already_changes_nothing(allowed_list):
    name, host = allowed_list
    write_allowed(sorted(set(host) | {name}))
    before = read_allowed()
    with netns.CongestionAllowed(name) as allowance:
        assert not allowance.widened and read_allowed() == before
    assert read_allowed() == before
    assert bench_link.say_allowed(allowance) is None and bench_link.say_restored(allowance) is None


def test_a_change_made_by_someone_else_during_the_run_is_left_alone(allowed_list):
    name, host = allowed_list
    write_allowed([n for n in host if n != name])
    with netns.CongestionAllowed(name) as allowance:
        write_allowed(["reno", name])   # an operator's own change meanwhile
    assert read_allowed() == ["reno", name]
    assert bench_link.say_restored(allowance) == (
        f"net.ipv4.tcp_allowed_congestion_control changed during the run by someone else (now \"reno {name}\"): "
        "left as it is")


def test_the_list_is_set_back_when_the_run_is_killed(allowed_list):
    """SIGKILL leaves no finally: the janitor, in a session of its own, sees its stdin close."""
    name, host = allowed_list
    write_allowed([n for n in host if n != name])
    before = read_allowed()
    child = subprocess.Popen([sys.executable, "-c", f"from rayfabric.tools import netns; import time\n"
                              f"netns.CongestionAllowed({name!r}).apply(); print('widened', flush=True); "
                              "time.sleep(600)"], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    try:
        assert child.stdout.readline().strip() == "widened"
        assert name in read_allowed()
        child.kill()
        child.wait()
    finally:
        child.kill()
    deadline = time.monotonic() + 30
    while read_allowed() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_allowed() == before


def test_a_list_that_cannot_be_written_is_a_clear_error_and_changes_nothing(allowed_list):
    """The write fails for real: the child runs in a mount namespace of its own where /proc/sys is
    read-only."""
    name, host = allowed_list
    write_allowed([n for n in host if n != name])
    before = read_allowed()
    read_only_proc_sys = "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$@\""
    code = ("from rayfabric.tools import netns\n"
            "try:\n"
            f"    netns.CongestionAllowed({name!r}).apply()\n"
            "except RuntimeError as e:\n"
            "    print('REFUSED', e)\n")
    r = subprocess.run(["unshare", "-m", "sh", "-c", read_only_proc_sys, "sh", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    if r.returncode != 0 and "REFUSED" not in r.stdout:
        pytest.skip(f"/proc/sys cannot be made read-only in a mount namespace here: {r.stderr.strip()[:200]}")
    wanted = " ".join(before + [name])
    assert r.stdout.strip() == (f"REFUSED cannot add it to {ALLOWED} for the run: Read-only file system (as root, "
                                f"`sysctl -w net.ipv4.tcp_allowed_congestion_control=\"{wanted}\"` allows it)"), r
    assert read_allowed() == before


def test_bad_sizes_and_reps_are_refused_before_anything_starts():
    for args, said in ((["--sizes", "64X"], "--sizes '64X': use sizes such as 64M,512M"),
                       (["--sizes", ","], "give at least one size above zero"),
                       (["--reps", "0"], "--reps: at least 1")):
        p = run("2gbit", *args)
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    p = run("", "--sizes", "1M")
    assert p.returncode == 2 and "--link: no rate given" in p.stderr


def test_report_says_when_its_runs_differ(tmp_path):
    files = []
    for i, cc in enumerate(("bbr", "cubic", None)):
        machine = {"cpus": 2} if cc is None else {"cpus": 2, "tcp_congestion_control": cc}
        f = tmp_path / f"run{i}.json"
        f.write_text(json.dumps({"meta": {"command": "bench", "machine": machine}, "ceilings": {}, "results": []}))
        files.append(str(f))
    p = run_bench("--report", files[0], files[0], "--json", str(tmp_path / "same.json"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("TCP congestion control recorded in the runs: bbr\n")
    p = run_bench("--report", files[0], files[1], files[2], "--json", str(tmp_path / "merged.json"))
    assert p.returncode == 0, p.stderr
    said = "differs between the files: bbr, cubic, not recorded"
    assert p.stdout.startswith(f"TCP congestion control recorded in the runs: {said}\n")
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["meta"]["machine"]["tcp_congestion_control"] == said
    # a report of reports keeps what its parts recorded
    p = run_bench("--report", str(tmp_path / "merged.json"), str(tmp_path / "same.json"))
    assert p.stdout.startswith("TCP congestion control recorded in the runs: differs between the files: "
                               "bbr, cubic, not recorded, bbr, bbr\n")


def test_a_bad_rate_is_refused_before_anything_starts():
    p = run("10gbit,fast", "--sizes", "1M")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--link: rate 'fast': use e.g. 500mbit, 1gbit, 10gbit" in p.stderr and "Traceback" not in p.stderr


def test_a_namespace_that_refuses_the_congestion_control_is_a_clear_error():
    """The kernel itself refusing the write (here: no such algorithm), in a namespace of its own."""
    pair = netns.NetnsPair(links=1, congestion="not_a_real_cc")
    with pytest.raises(RuntimeError, match="not a kernel module name"):
        netns.NetnsPair(links=1, congestion="cubic; touch /x")._set_congestion("unused")
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        pytest.skip("needs root and ip netns")
    ns = "rfcctest"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        with pytest.raises(RuntimeError) as e:
            pair._set_congestion(ns)
        said = str(e.value)
        assert said.startswith(f"cannot set TCP congestion control not_a_real_cc in namespace {ns}: ")
        assert "tcp_allowed_congestion_control lists" in said
        assert bench_link.congestion_in(ns) == bench_link.tcp_sysctl("tcp_congestion_control")  # left as it was
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# numpy blocked, as on a node where only the library was installed (`pip install rayfabric`).
NO_NUMPY = "import sys; sys.modules['numpy'] = None; "


def test_the_library_needs_no_numpy_and_the_programs_say_they_do():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    lib = subprocess.run([sys.executable, "-c", NO_NUMPY + "import ray, rayfabric, rayfabric.transparent, "
                          "rayfabric.args, rayfabric.waits, rayfabric.rdt, rayfabric.cli; print('imported')"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert lib.returncode == 0 and "imported" in lib.stdout, lib.stderr
    for argv, program in ((["bench"], "bench"), (["bench", "args"], "bench"), (["bench-args"], "bench"),
                          (["demo"], "demo")):
        out = subprocess.run([sys.executable, "-c", NO_NUMPY + "from rayfabric import cli; "
                              f"sys.exit(cli.main({argv + ['--help']!r}))"],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 2, (argv, out)
        assert f"rayfabric {program}: needs numpy" in out.stderr and "rayfabric[bench]" in out.stderr, out.stderr
    toml = (ROOT / "pyproject.toml").read_text()
    deps = toml.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "numpy" not in deps, deps
