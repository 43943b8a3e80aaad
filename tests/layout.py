"""The package's import graph, read from the source (nothing is imported or run).

`python tests/layout.py` prints the import cycles between files and between packages, and
how many spanflow modules the example task imports; tests/test_layout.py asserts on them.
Every import counts, also one inside a function: a cycle there is still two modules that
need each other.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spanflow"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__main__.py"}


def imports_of(path: Path, known: set[str], name: str | None = None) -> set[str]:
    """The spanflow modules that `path` imports (a name imported from a package that is a
    module counts as that module)."""
    name = name or module_name(path)
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "spanflow")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            if base.split(".")[0] != "spanflow":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(p, set(mods)) for m, p in mods.items()}


def package_of(module: str, mods: dict[str, Path] | None = None) -> str:
    """The layer a module belongs to: spanflow's direct subpackage (spanflow.models), or a task's
    folder (spanflow.tasks.ner); a module at the top (spanflow.errors) stands alone."""
    parts = module.split(".")
    task = ".".join(parts[:3])
    if parts[1:2] == ["tasks"] and len(parts) >= 3 and (PACKAGE / "tasks" / parts[2]).is_dir():
        return task
    return ".".join(parts[:2])


def package_graph() -> dict[str, set[str]]:
    """Packages as nodes (spanflow.tasks.ner.features, spanflow.models, ...); an edge when a module of one
    imports a module of another. The top package's __init__ re-exporting the API is not an edge."""
    mods = modules()
    out: dict[str, set[str]] = {}
    for m, deps in graph().items():
        src = package_of(m, mods)
        for d in deps:
            dst = package_of(d, mods)
            if dst != src and m != "spanflow":
                out.setdefault(src, set()).add(dst)
        out.setdefault(src, set())
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def example_task_imports() -> set[str]:
    """The spanflow modules tests/textcat_task.py (the example of a new task) imports."""
    path = ROOT / "tests" / "textcat_task.py"
    return imports_of(path, set(modules()), name="tests.textcat_task")


TASK_NAMES = {"ner", "re", "embed"}


def task_name_tests(path: Path) -> list[str]:
    """`line: code` of each comparison in `path` of a task's name with something called a task
    (`cfg.get("task") == "ner"`, `task.name in ("ner", "re")`): a shared layer that switches on a
    task's name. A command's name (`args.command in ("train", "embed")`) is not a task's."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [any(isinstance(v, ast.Constant) and v.value in TASK_NAMES
                     for v in (s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s])) for s in sides]
        if any(named) and any("task" in ast.unparse(s) for s, n in zip(sides, named) if not n):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def shared_task_switches() -> dict[str, list[str]]:
    """task_name_tests of every module outside spanflow/tasks/ and the CLI's task commands."""
    out = {}
    for m, path in modules().items():
        if m.startswith("spanflow.tasks.") and m.count(".") > 2 or m == "spanflow.cli.embed":
            continue  # a task's own folder; `spanflow embed` is the embed task's own command
        hits = task_name_tests(path)
        if hits:
            out[m] = hits
    return out


if __name__ == "__main__":
    for what, g in (("files", graph()), ("packages", package_graph())):
        cyc = cycles(g)
        print(f"import cycles between {what}: {len(cyc)}")
        for c in cyc:
            print("  " + " <-> ".join(c))
            for a in c:
                print("    " + a + " -> " + ", ".join(sorted(set(g[a]) & set(c))))
    ex = example_task_imports()
    print(f"the example task imports {len(ex)} spanflow modules from "
          f"{len({package_of(m, modules()) for m in ex})} packages: {', '.join(sorted(ex))}")
