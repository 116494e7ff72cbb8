"""Rerun `cgtune example` as a new user does (no vLLM installed: cgtune's default release) and rewrite the README's
worked example from what it printed: the run's time, the lines quoted, the picture's caption, and the picture itself
(`docs/img/example-pareto.png`, the run's plots/pareto.png). Run it from the checkout after anything that changes the
example's output (the lead, after merging):

    python scripts/readme_example.py            # rewrites README.md and docs/img/example-pareto.png
    python scripts/readme_example.py --check    # exit 1, saying what differs, where the README is stale

The README's part between the `readme_example` markers is this script's; `tests/test_readme_example.py` holds it to a
fresh run. Every number in it is the synthetic example's (made-up profile, written log), as the README says."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PICTURE = ROOT / "docs/img/example-pareto.png"
BEGIN = "<!-- readme_example: begin (scripts/readme_example.py writes what follows, up to its end marker) -->"
END = "<!-- readme_example: end -->"
QUOTED = ("searched under the rules of", "tuned list (", "expected step ", "shipped: ")
"""The search's lines the README quotes (the first of each), in this order; then the check's table rows below."""
CHECKED = ("kv_available_bytes", "kv_capacity_bytes", "graph_pool_bytes", "capture_s")
WIDTH = 118


@contextlib.contextmanager
def as_a_new_user() -> Iterator[None]:
    """No vLLM installed and no --vllm-version: the release a new user's `cgtune example` runs under (the default)."""
    from tuner.engines.vllm import versions

    saved_env, saved_installed = os.environ.pop(versions.VERSION_ENV, None), versions.installed_version
    versions.installed_version = lambda: None  # as a fresh clone without vLLM has it
    try:
        yield
    finally:
        versions.installed_version = saved_installed
        if saved_env is not None:
            os.environ[versions.VERSION_ENV] = saved_env


def run_example(out: Path) -> tuple[str, tuple[float, float]]:
    """`cgtune example --out OUT --no-progress` from the checkout as a new user: (what it printed, (wall seconds, CPU
    seconds of this process)): on a busy machine the first runs longer than the second."""
    from tuner.cli import main

    stdout = io.StringIO()
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        with as_a_new_user(), contextlib.redirect_stdout(stdout):
            started, cpu = time.perf_counter(), time.process_time()
            code = main(["example", "--out", str(out), "--no-progress"])
            seconds = (time.perf_counter() - started, time.process_time() - cpu)
    finally:
        os.chdir(cwd)
    if code:
        raise SystemExit(f"cgtune example exited {code}:\n{stdout.getvalue()}")
    return stdout.getvalue(), seconds


def quoted_lines(stdout: str) -> list[str]:
    """The lines the README quotes from a run's output, wrapped as the README prints them."""
    lines = stdout.splitlines()
    picked = [next(line for line in lines if line.startswith(prefix)) for prefix in QUOTED]
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("quantity ")):]
    picked += ["...", table[0]] + [line for line in table if line.split()[:1] and line.split()[0] in CHECKED]
    return [part for line in picked for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ",
                                                              break_on_hyphens=False) or [line]]


def caption(out: Path) -> str:
    """The picture's caption, its figures read from the run's summary.json."""
    s = json.loads((out / "summary.json").read_text())
    real = s["compact_choice"]["memory_counted"] == "graph_memory_bytes"
    axis = "the real graph pool the KV cache gives up" if real else "vLLM's graph-memory estimate"

    def at(name: str) -> str:
        e = s[name]
        return f"{e[s['compact_choice']['memory_counted']] / (1 << 30):.2f} GiB, {e['expected_step_ms']:.2f} ms"

    shipped = s["shipped"]["list"]
    return (f"The run's `plots/pareto.png` (copied to `docs/img/example-pareto.png`; SYNTHETIC profile "
            f"`workloads/profiles/synthetic-dflash-llama-3.1-8b.csv`, made-up numbers, written by "
            f"`scripts/readme_example.py`): each list's expected step against {axis}, under vLLM "
            f"{s['vllm_version']}'s rules, with the front of the lists found. vLLM's default ({at('default')}) is "
            f"slow for its memory; the fastest list is the star ({at('tuned')}), the compact list the red triangle "
            f"({at('compact')}: the least memory within {s['tolerance']:.0%} of the fastest), and the "
            f"{'compact list' if shipped == 'compact' else 'fastest list'} ships.")


def region(stdout: str, seconds: tuple[float, float], out: Path) -> str:
    """The README's part between the markers."""
    cores, machine = os.cpu_count(), platform.machine()
    took = (f"It took {seconds[0]:.0f} s ({seconds[1]:.0f} s of CPU) on a {cores}-core {machine} machine "
            f"(`scripts/readme_example.py`, which runs `cgtune example --no-progress` as a new user does: no vLLM "
            f"installed, so under cgtune's default release) and printed, among its lines:")
    return "\n".join([
        BEGIN,
        *textwrap.wrap(took, WIDTH, break_on_hyphens=False),
        "",
        "```",
        *quoted_lines(stdout),
        "```",
        "",
        "![Expected step latency against graph memory for the example's lists](docs/img/example-pareto.png)",
        "",
        *textwrap.wrap(caption(out), WIDTH, break_on_hyphens=False),
        END,
    ])


def readme_region(text: str) -> str:
    """The README's current part between the markers (ValueError without them)."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether README.md is current (exit 1: not)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="readme-example-") as tmp:
        out = Path(tmp) / "example"
        stdout, seconds = run_example(out)
        text = README.read_text()
        old = readme_region(text)
        new = region(stdout, seconds, out)
        if args.check:
            stale = [line for line in quoted_lines(stdout) if line not in old] + (
                [] if " ".join(caption(out).split()) in " ".join(old.split()) else ["the picture's caption"])
            print("README.md is current" if not stale else "README.md is stale: " + "; ".join(stale))
            return 1 if stale else 0
        README.write_text(text.replace(old, new))
        shutil.copyfile(out / "plots" / "pareto.png", PICTURE)
    print(f"rewrote {README.relative_to(ROOT)} (its worked example) and {PICTURE.relative_to(ROOT)} from a "
          f"{seconds[0]:.0f} s run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
