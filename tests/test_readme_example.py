"""The README's worked example agrees with what `cgtune example` prints for a new user (no vLLM installed: cgtune's
default release): the lines it quotes and its picture's caption figures, made by scripts/readme_example.py from a fresh
run here. Its timing is not compared (it is the machine's). A stale README is regenerated with that script."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "the README's worked example is stale: regenerate it with `python scripts/readme_example.py`"


def _script():
    spec = importlib.util.spec_from_file_location("readme_example", ROOT / "scripts/readme_example.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_example"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_readmes_worked_example_is_what_cgtune_example_prints(tmp_path) -> None:
    script = _script()
    out = tmp_path / "example"
    stdout, _ = script.run_example(out)
    readme = script.readme_region(script.README.read_text())
    quoted = script.quoted_lines(stdout)
    # The release a new user gets, said first; then the lists as graphs.
    assert quoted[0].startswith("searched under the rules of vLLM 0.34 (cgtune's default")
    block = readme.split("```\n")[1].splitlines()
    assert block == quoted, REGENERATE
    assert " ".join(script.caption(out).split()) in " ".join(readme.split()), REGENERATE
    assert (ROOT / "docs/img/example-pareto.png").stat().st_size > 10_000
