"""The report: renders a decision record (`tuner.decision.Decision`) into a run directory (`run`: report.md, plots,
summary.json, the engine's files, staged and moved in), its plots (`plots`), how numbers read (`text`), the engine's
own words (`vllm_words`: tokens and vLLM's estimate; `request_words`: requests and the engine's memory rule), the
decision's lines (`decision`), the validation section (`validation`) and the per-width table (`width_table`).
Imports profile, engines, workload, model and decide; never the search, so nothing here decides."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "render_markdown": "run", "summary": "run", "words_of": "run", "write_run": "run",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
