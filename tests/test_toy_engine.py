"""A fourth engine is one rulebook and one `register` call: a toy engine, all of it in this file, runs `cgtune
defaults`, `cgtune search` and `cgtune report` end to end through the Engine interface alone. Its rules are made up
for the test (graphs by batch size, a KV cache sized after the graphs); the profile is hand-made: a test fixture,
never a measurement."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402
from handmade_profiles import handmade_spec, mixed_traffic, write_handmade_inputs  # noqa: E402

from tuner.engines import registry as engines  # noqa: E402
from tuner.engines.request_engine import RequestEngine  # noqa: E402


@dataclass(frozen=True)
class ToyKvRule:
    """ToyLLM captures its graphs first, then gives the KV cache all the memory left: total - non-KV - real pool."""

    total_memory_bytes: int
    non_kv_cache_bytes: int
    required_kv_bytes: int
    estimate_enabled: bool = False

    @property
    def requested_bytes(self) -> int:
        return self.total_memory_bytes

    def kv_available_bytes(self, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0, top: int = 0) -> int:
        return int(self.total_memory_bytes - self.non_kv_cache_bytes - round(real_bytes))

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int:
        return self.kv_available_bytes(real_bytes=real_pool_bytes)

    def applied_estimate(self, profiled_bytes: int) -> int:
        return profiled_bytes

    def real_budget_bytes(self, top: int = 0) -> int:
        return self.total_memory_bytes - self.non_kv_cache_bytes - self.required_kv_bytes

    def graph_budget(self, top: int = 0) -> tuple[int, str]:
        return max(0, self.real_budget_bytes()), "most graph memory ToyLLM's KV rule allows"


class ToyEngine(RequestEngine):
    """ToyLLM: decode graphs for 1, 2 and 4 requests by default; a batch pads up to the next graph."""

    name, label, files = "toyllm", "ToyLLM", ("toyllm-batch-sizes.json",)

    def default_requests(self, gpu_memory_mib: float | None) -> list[int]:
        return [1, 2, 4]

    def kv_rule(self, *, total_memory_bytes: int, non_kv_cache_bytes: int, weights_bytes: Callable[[], int],
                required_kv_bytes: int, tensor_parallel_size: int, notes: list[str],
                pre_load_free_bytes: int | None = None,
                activation_peak_bytes: int | None = None, kv: object = None) -> ToyKvRule:
        return ToyKvRule(total_memory_bytes, non_kv_cache_bytes, required_kv_bytes)

    def render_request_files(self, batch_sizes: Sequence[int], deployment: object, provenance: object
                             ) -> dict[str, str]:
        return {self.files[0]: json.dumps({"batch_sizes": list(batch_sizes)})}

    def memory_rule_words(self, budget: ToyKvRule, default_top: int, tuned_top: int,
                          mem: Callable[[float], str]) -> tuple[str, str]:
        return (f"- KV cache, as ToyLLM sizes it: total {mem(budget.total_memory_bytes)} - non-KV "
                f"{mem(budget.non_kv_cache_bytes)} - real pool"), "the KV cache itself"


@pytest.fixture()
def toy_workload(tmp_path: Path):
    """ToyLLM registered for one test (the registry as it was afterwards), and its workload and profile files."""
    saved = dict(engines.ENGINES), dict(engines.ENGINE_FILES)
    engines.register(ToyEngine)
    spec = handmade_spec(name="toy", engine="toyllm", max_num_seqs=8, max_num_batched_tokens=64,
                         traffic=mixed_traffic(8, 64))
    yield write_handmade_inputs(tmp_path, spec, list(range(1, 65)))
    for registry, before in zip((engines.ENGINES, engines.ENGINE_FILES), saved):
        registry.clear()
        registry.update(before)
    engines.engine_of.cache_clear()


def test_a_toy_engine_runs_defaults_search_and_report_through_the_interface_alone(toy_workload, tmp_path, capsys):
    wl_path, profile, workload = toy_workload
    assert type(workload.engine) is ToyEngine

    code, out, err = run(capsys, "defaults", wl_path, "--json")
    assert code == 0, err
    defaults = json.loads(out)
    # ToyLLM's own default, and its padding rule: 5..8 requests pad past the largest graph (4) and run eager.
    assert defaults["engine"] == "toyllm" and defaults["batch_sizes"] == [1, 2, 4]
    assert defaults["eager_batch_sizes"] == [5, 6, 7, 8]

    run_dir = tmp_path / "run"
    code, out, err = run(capsys, "search", wl_path, "--profile", profile, "--out", run_dir, "--trials", 8,
                         "--no-progress")
    assert code == 0, err
    assert not (run_dir / "compilation_config.json").exists()  # ToyLLM's files, no other engine's
    summary = json.loads((run_dir / "summary.json").read_text())
    tuned = json.loads((run_dir / "toyllm-batch-sizes.json").read_text())["batch_sizes"]
    shipped = "compact" if summary["shipped"]["list"] == "compact" else "tuned"  # the list the files carry
    assert summary["engine"]["batch_sizes"] == summary["tuned"]["batch_sizes"]
    assert tuned == summary[shipped]["batch_sizes"]
    assert summary["default"]["batch_sizes"] == [1, 2, 4] and all(1 <= b <= 8 for b in tuned)
    # ToyLLM's KV rule, as the cost model applied it: the KV cache is what the graphs leave.
    t = summary["tuned"]
    assert t["kv_available_bytes"] == summary["total_memory_bytes"] - summary["non_kv_cache_bytes"] \
        - t["graph_memory_bytes"]

    code, out, err = run(capsys, "report", run_dir)
    assert code == 0, err
    assert f"max {tuned[-1]} requests" in out and "toyllm-batch-sizes.json" in out
    report = (run_dir / "report.md").read_text()
    assert "- KV cache, as ToyLLM sizes it: total" in report and "ToyLLM default" in report
    assert "Files: `toyllm-batch-sizes.json`, `summary.json`." in report
