"""The Python library's modules import one another one way (no cycle, the package's __init__
included), never the programs, and the standard-library-only ones stay so. Read from the source
(every import statement, at module level or inside a function)."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "rayfabric"
# The programs (benchmarks, demo, doctor, namespaces, huge pages): they may import the library.
PROGRAMS = {"bench", "bench_args", "bench_broadcast", "bench_link", "bench_rails", "bench_tensors", "demo",
            "doctor", "netns", "hugepages"}
# Imported by the start-up hook, the doctor run as a script, or at the package's import before
# anything else: the standard library only.
STDLIB_ONLY = {"settings", "launch_env", "_paths"}
MODULES = {p.stem for p in PACKAGE.glob("*.py")}
LIBRARY = MODULES - PROGRAMS


def imports_of(module):
    """(rayfabric modules, other top-level packages) that `module` imports anywhere in it."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    ours, others = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "rayfabric":
                others.add(parts[0])
            elif len(parts) > 1:
                ours.add(parts[1])
            else:  # from rayfabric import x: the module x, or a name of the package's __init__
                ours |= {a.name if a.name in MODULES else "__init__" for a in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != "rayfabric":
                    others.add(parts[0])
                else:
                    ours.add(parts[1] if len(parts) > 1 else "__init__")
    ours.discard(module)
    return ours, others


def test_no_import_cycle_in_the_library():
    graph = {m: imports_of(m)[0] & LIBRARY for m in LIBRARY}
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


def test_the_library_imports_no_program():
    for m in sorted(LIBRARY - {"cli"}):  # the CLI starts the programs: its subcommands
        assert not imports_of(m)[0] & PROGRAMS, (m, imports_of(m)[0] & PROGRAMS)


def test_standard_library_only_modules():
    stdlib = set(sys.stdlib_module_names)
    for m in sorted(STDLIB_ONLY):
        ours, others = imports_of(m)
        assert not ours, (m, ours)
        assert others <= stdlib, (m, others - stdlib)
