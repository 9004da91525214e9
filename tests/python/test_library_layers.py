"""The Python library's modules import one another one way (no cycle, the package's __init__
included), never the programs, and the standard-library-only ones stay so. Read from the source
(every import statement, at module level or inside a function).

Modules are named as inside the package: "api", "_agents", "bench.objects", "tools.doctor"; a
package's __init__ by its own name ("__init__" for rayfabric's, "bench", "tools"). The start-up hook
beside the package (python/_rayfabric_autoload.py, run by site-packages' .pth in every process) is
read too: it imports the package, never the other way."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "rayfabric"
# The programs: everything under rayfabric/bench/ (the benchmarks) and rayfabric/tools/ (doctor, demo,
# network namespaces, huge pages). They may import the library and one another.
PROGRAM_PACKAGES = ("bench", "tools")
# Imported by the start-up hook, the doctor run as a script, or at the package's import before
# anything else: the standard library only.
STDLIB_ONLY = {"settings", "launch_env", "_paths"}
# The start-up hook, outside the package; it loads FILE_LOADED_BY_THE_HOOK on its own (without the
# package's __init__, which imports the whole library): the standard library at its import, Ray
# only inside its functions, nothing else of rayfabric.
HOOK = ROOT / "python" / "_rayfabric_autoload.py"
HOOK_NAME = HOOK.stem
FILE_LOADED_BY_THE_HOOK = "_kv"


def _name(path):
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts) or "__init__"


FILES = {_name(p): p for p in PACKAGE.rglob("*.py") if "_bin" not in p.parts}
MODULES = set(FILES)


def is_program(m):
    return m.split(".")[0] in PROGRAM_PACKAGES


PROGRAMS = {m for m in MODULES if is_program(m)}
LIBRARY = MODULES - PROGRAMS


def _resolve(dotted):
    """The module a dotted name under rayfabric is (its longest prefix that is one)."""
    parts = dotted.split(".") if dotted else []
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) or "__init__"


def imports_of(module, module_level_only=False):
    """(rayfabric modules, other top-level packages) that `module` imports anywhere in it (or at
    its module level only: the statements run at its import, outside functions and classes).
    HOOK_NAME: the start-up hook's."""
    path = HOOK if module == HOOK_NAME else FILES[module]
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    here = [] if module in ("__init__", HOOK_NAME) else module.split(".")
    ours, others = set(), set()
    for node in (_module_level(tree) if module_level_only else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package, up level - 1
                base = here if is_pkg else here[:-1]
                base = base[:len(base) - (node.level - 1)]
                inside = ".".join(base + (node.module.split(".") if node.module else []))
            elif node.module and node.module.split(".")[0] == "rayfabric":
                inside = node.module.partition(".")[2]
            else:
                others.add(node.module.split(".")[0])
                continue
            for a in node.names:  # from rayfabric.x import y: the module x.y, or a name of x
                sub = f"{inside}.{a.name}" if inside else a.name
                ours.add(sub if sub in MODULES else _resolve(inside))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != "rayfabric":
                    others.add(parts[0])
                else:  # import rayfabric.a.b: rayfabric's __init__, a's, ..., and a.b
                    ours.add("__init__")
                    ours |= {_resolve(".".join(parts[1:i + 1])) for i in range(1, len(parts))}
    ours.discard(module)
    return ours, others


def _module_level(tree):
    """The nodes of `tree` outside its functions and classes (what runs at the module's import)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _no_cycle(graph):
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_programs_are_where_the_layout_says():
    assert {"bench.objects", "bench.args", "bench.broadcast", "bench.link", "bench.rails", "bench.tensors",
            "tools.doctor", "tools.netns", "tools.hugepages", "tools.demo"} <= PROGRAMS
    assert {"api", "cli", "transparent", "args", "rdt", "settings", "_agents"} <= LIBRARY
    # no program left beside the library
    flat = {p.stem for p in PACKAGE.glob("*.py")}
    assert not flat & {"bench", "bench_args", "bench_broadcast", "bench_link", "bench_rails", "bench_tensors",
                       "demo", "doctor", "netns", "hugepages"}, flat


def test_imports_are_read_as_modules():
    assert imports_of("bench.link")[0] >= {"bench.objects", "tools.netns", "__init__"}
    assert "tools.doctor" in imports_of("tools.hugepages")[0]
    assert "rdt" in imports_of("bench.tensors")[0]


def test_no_import_cycle_in_the_library():
    _no_cycle({m: imports_of(m)[0] & LIBRARY for m in LIBRARY})


def test_the_package_never_imports_the_start_up_hook():
    """The hook is beside the package, not of it: whatever the package shares with it lives in the
    package (rayfabric._kv), so that imports run one way, from the hook into the package."""
    assert not [m for m in sorted(MODULES) if HOOK_NAME in imports_of(m)[1]]


def test_no_import_cycle_through_the_start_up_hook():
    graph = {m: imports_of(m)[0] | ({HOOK_NAME} & imports_of(m)[1]) for m in MODULES}
    graph[HOOK_NAME] = imports_of(HOOK_NAME)[0]
    assert graph[HOOK_NAME] >= {"transparent", "waits"}  # (read: it turns transparent mode on)
    _no_cycle(graph)


def test_the_start_up_hook_costs_nothing_at_its_import():
    """Run by the .pth in every process: at its import the standard library only, no Ray, nothing
    of rayfabric (that waits for `import ray` and the hook's functions); the file of the package it
    loads on its own, without the package's __init__, is the standard library only at its import,
    imports nothing of rayfabric anywhere, and Ray inside its functions."""
    stdlib = set(sys.stdlib_module_names)
    ours, others = imports_of(HOOK_NAME, module_level_only=True)
    assert not ours and others <= stdlib, (ours, others - stdlib)
    assert f'"{FILE_LOADED_BY_THE_HOOK}.py"' in HOOK.read_text()
    ours, others = imports_of(FILE_LOADED_BY_THE_HOOK, module_level_only=True)
    assert not ours and others <= stdlib, (ours, others - stdlib)
    ours, others = imports_of(FILE_LOADED_BY_THE_HOOK)
    assert not ours and others <= stdlib | {"ray"}, (ours, others - stdlib)


def test_the_library_imports_no_program():
    for m in sorted(LIBRARY - {"cli"}):  # the CLI starts the programs: its subcommands
        assert not imports_of(m)[0] & PROGRAMS, (m, imports_of(m)[0] & PROGRAMS)


def test_the_cli_starts_the_programs_by_name_only():
    """cli.py names its programs as strings (importlib), never at its import: `rayfabric status`
    loads no benchmark and no numpy."""
    assert not imports_of("cli")[0] & PROGRAMS, imports_of("cli")[0] & PROGRAMS


def test_numpy_only_in_the_programs():
    """numpy is no dependency of the package (pyproject.toml: the bench extra): the library never
    imports it, anywhere in a module; the programs that do are the ones `rayfabric bench`, `demo`
    check it for."""
    assert not [m for m in sorted(LIBRARY) if "numpy" in imports_of(m)[1]]
    assert {m for m in PROGRAMS if "numpy" in imports_of(m)[1]} >= {"bench.objects", "bench.args", "tools.demo"}


def test_standard_library_only_modules():
    stdlib = set(sys.stdlib_module_names)
    for m in sorted(STDLIB_ONLY):
        ours, others = imports_of(m)
        assert not ours, (m, ours)
        assert others <= stdlib, (m, others - stdlib)


def test_the_doctor_runs_by_path_on_the_standard_library():
    """tools/doctor.py runs as a plain script (python3 python/rayfabric/tools/doctor.py): what it
    imports of rayfabric are standard-library-only modules of the library (found by path, in the
    folder above its own), the rest is the standard library."""
    ours, others = imports_of("tools.doctor")
    assert ours <= STDLIB_ONLY, ours - STDLIB_ONLY
    # run as a script: `import settings`, `from launch_env import ...` (top-level names)
    assert others <= set(sys.stdlib_module_names) | STDLIB_ONLY, others - set(sys.stdlib_module_names)
    assert (PACKAGE / "tools" / "doctor.py").is_file() and all((PACKAGE / f"{m}.py").is_file() for m in ours)
