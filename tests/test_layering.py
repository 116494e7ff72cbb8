"""The house by stage (tuner/face.py): every import in tuner/ read from the source, held to the layering written down
there; no import cycle between modules; each package's face is what it says; `import tuner` loads no stage."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.face import FOUNDATIONS, LAYERS, PENDING, face_home

ROOT = Path(__file__).resolve().parents[1]
TUNER = ROOT / "tuner"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(TUNER.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """Every cgtune module `path` imports, wherever the import stands (top, function, TYPE_CHECKING): `from tuner.x
    import y` names tuner.x.y when that is a module, else tuner.x."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "tuner")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "tuner":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in MODULES else node.module)
    return found


GRAPH = {m: imports_of(p) for m, p in MODULES.items()}


def unit(module: str) -> str:
    """The layer a module belongs to: its stage package, or the top-level module itself; `tuner` for the API."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tuner"


def edges() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for m, targets in GRAPH.items():
        for t in targets:
            if unit(t) != unit(m):
                found.setdefault((unit(m), unit(t)), []).append(f"{m} -> {t}")
    return found


def test_the_top_level_holds_the_stage_packages_and_at_most_eight_modules() -> None:
    modules = sorted(p.stem for p in TUNER.glob("*.py"))
    packages = sorted(p.parent.name for p in TUNER.glob("*/__init__.py"))
    assert len(modules) <= 8, modules
    assert set(modules) == {"__init__", *FOUNDATIONS, *(u for u in LAYERS if u not in packages)}, modules
    assert set(packages) <= set(LAYERS), f"a package the layering does not place: {set(packages) - set(LAYERS)}"
    stray = [p for p in TUNER.rglob("*.py") if not (p.parent / "__init__.py").is_file()]
    assert not stray, f"modules in a folder that is no package: {stray}"


def test_the_layering_is_ordered_lowest_first_so_it_has_no_cycle() -> None:
    seen: set[str] = set()
    for name, below in LAYERS.items():
        assert set(below) <= seen, f"{name} may import {set(below) - seen}, which is not below it"
        seen.add(name)


def test_every_import_keeps_to_the_layering() -> None:
    wrong = []
    for (src, dst), where in sorted(edges().items()):
        if dst == "tuner":
            continue  # the root: `__version__`, or the API module object; it loads no stage (below)
        if src in FOUNDATIONS:
            ok = dst in FOUNDATIONS
        elif src == "tuner":
            ok = True  # the API sits above every stage
        else:
            ok = dst in FOUNDATIONS or dst in LAYERS.get(src, ())
        if not ok:
            more = f" (+{len(where) - 1} more)" if where[1:] else ""
            wrong.append(f"{src} may not import {dst}: {where[0]}{more}")
    assert not wrong, "\n".join(wrong)


def test_each_pending_edge_is_still_used_and_allowed() -> None:
    used = edges()
    for (src, dst), why in PENDING.items():
        assert dst in LAYERS[src], f"{src} -> {dst} is pending but the layering forbids it"
        assert (src, dst) in used, f"{src} no longer imports {dst}: drop it from PENDING and LAYERS ({why[:40]}...)"


def test_no_two_modules_import_each_other_through_any_chain() -> None:
    # Tarjan's strongly connected components over every import (a function-level or TYPE_CHECKING import included:
    # either way one module cannot be read, or moved, without the other). A package's face (its __init__) is left
    # out as a target: faces name submodules lazily or eagerly by design, and the submodule edge is what is read.
    graph = {m: sorted(t for t in ts if t in MODULES and not (MODULES[t].name == "__init__.py" and t != m))
             for m, ts in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_layering_test_sees_an_upward_import(tmp_path: Path) -> None:
    # The reader is what the other tests rest on: an import written into a profile module, of the search, is found.
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from tuner.search.study import SearchResult\n"
                     "    from tuner.decision import record\n")
    assert imports_of(probe) == {"tuner.search.study", "tuner.decision.record"}


LAZY_FACES = sorted(m for m, p in MODULES.items() if p.name == "__init__.py" and "lazy_face" in p.read_text())


def test_the_stage_packages_have_lazy_faces() -> None:
    assert {m.split(".")[1] for m in LAZY_FACES} == {"profile", "engines", "workload", "model", "load", "search",
                                                    "decision", "report", "validate", "check", "fleet"}


@pytest.mark.parametrize("package", LAZY_FACES)
def test_a_face_names_what_its_modules_define_and_no_submodule(package: str) -> None:
    face = importlib.import_module(package)
    assert face.__doc__ and len(face.__doc__.split()) > 20, f"{package} says what it owns"
    submodules = {m.name for m in pkgutil.iter_modules(face.__path__)}
    assert not set(face.__all__) & submodules, "a face name that is also a submodule's resolves to whichever loaded"
    for name in face.__all__:
        obj = getattr(face, name)
        home = importlib.import_module(face_home(package, face._FACE[name]))
        assert getattr(home, name) is obj
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        face.not_a_name  # noqa: B018


def test_importing_tuner_or_a_face_loads_no_stage() -> None:
    code = ("import sys, tuner, tuner.search, tuner.decision, tuner.report, tuner.model, tuner.engines\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('tuner.') and m.count('.') > 1)\n"
            "print(loaded)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
