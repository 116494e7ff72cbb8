"""Configurations vLLM refuses to start are refused by cgtune, under 0.33 and 0.34, in one line naming vLLM's own
reason: at workload load (so search and every command that reads a workload), and by `cgtune defaults` given flags
(exit 2). tests/vllm034/test_files_engine_034.py holds the same checks to vLLM 0.34's own code on random deployments;
the reasons quoted here are vLLM's (SchedulerConfig.verify_max_model_len, VllmConfig._set_max_num_scheduled_tokens,
SpeculativeConfig)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402
from handmade_profiles import handmade_spec  # noqa: E402

from tuner.engines.registry import engine_of  # noqa: E402
from tuner.engines.serving import ServingConfig  # noqa: E402
from tuner.workload.spec import WorkloadError, parse_workload  # noqa: E402

SLOTS = "does not have enough slots to schedule a token and support the speculative decoding settings"


def _spec(version: str, method: str | None, k: int, mnbt: int, seqs: int = 1, **extra: object) -> dict:
    drafter = {"drafter": {"num_layers": 1}} if method in ("eagle", "eagle3", "mtp", "dflash", "draft_model") else {}
    return handmade_spec(max_num_seqs=seqs, num_speculative_tokens=k, max_num_batched_tokens=mnbt,
                         vllm_version=version, speculative={"method": method, **drafter, **extra} if method else None)


@pytest.mark.parametrize("version", ["0.33", "0.34"])
@pytest.mark.parametrize(("method", "k", "refused_below"), [
    ("eagle", 1, 1),      # lookahead K: max_num_batched_tokens 1 <= 1 is refused, 2 starts
    ("eagle3", 4, 4), ("mtp", 3, 3), ("draft_model", 2, 2),
    ("dflash", 3, 4),     # DFlash's fill-in drafting: a bonus query plus K, lookahead K + 1
    ("ngram", 5, 0),      # the model-free methods write no KV past the target: nothing to refuse
    ("suffix", 2, 0),
])
def test_a_token_budget_without_a_slot_beside_the_drafters_lookahead_is_refused(version, method, k, refused_below):
    for mnbt in range(1, refused_below + 3):
        engine = engine_of(ServingConfig(max_num_seqs=1, num_speculative_tokens=k, max_num_batched_tokens=mnbt,
                                         speculative_method=method, vllm_version=version))
        line = engine.config_refusal()
        if mnbt <= refused_below:
            assert line == (f"serving.max_num_batched_tokens: {mnbt}: vLLM {version} refuses to start with it: "
                            f"VllmConfig {SLOTS}. Got max_num_batched_tokens={mnbt} and "
                            f"num_lookahead_tokens={refused_below}.")
        else:
            assert line is None, (method, mnbt)


@pytest.mark.parametrize("version", ["0.33", "0.34"])
def test_a_workload_vllm_would_not_start_is_refused_at_load(version):
    with pytest.raises(WorkloadError) as exc:
        parse_workload(_spec(version, "eagle", 1, 1))
    assert str(exc.value) == (f"serving.max_num_batched_tokens: 1: vLLM {version} refuses to start with it: "
                              f"VllmConfig {SLOTS}. Got max_num_batched_tokens=1 and num_lookahead_tokens=1.")


def test_034_refuses_what_its_speculative_config_refuses_and_033_takes():
    # custom_class is 0.33's method; 0.34 knows only registered custom speculators
    spec = _spec("0.34", "custom_class", 2, 64)
    with pytest.raises(WorkloadError, match=r"^speculative.method: custom_class: vLLM 0.34 refuses to start with it: "
                                            r"Unknown speculative method 'custom_class'\.$"):
        parse_workload(spec)
    assert parse_workload(_spec("0.33", "custom_class", 2, 64)).engine.config_refusal() is None
    # parallel drafting: only DFlash and DSpark take it in 0.34 (0.33 took it for EAGLE and a draft model too)
    with pytest.raises(WorkloadError, match=r"^speculative.parallel_drafting: True: vLLM 0.34 refuses to start with "
                                            r"it: parallel_drafting is only supported by the dflash and dspark "
                                            r"methods, not 'eagle'\.$"):
        parse_workload(_spec("0.34", "eagle", 2, 64, parallel_drafting=True))
    assert parse_workload(_spec("0.33", "eagle", 2, 64, parallel_drafting=True)).engine.config_refusal() is None
    assert parse_workload(_spec("0.34", "dflash", 2, 64, parallel_drafting=True)).engine.config_refusal() is None


@pytest.mark.parametrize("version", ["0.33", "0.34"])
def test_cgtune_defaults_refuses_in_one_line_and_exit_2(capsys, version):
    code, out, err = run(capsys, "defaults", "--vllm-version", version, "--max-num-seqs", "9000")
    assert (code, out) == (2, "")
    assert err.strip() == (f"cgtune defaults: error: --max-num-seqs: 9000: vLLM {version} refuses to start with it: "
                           f"max_num_batched_tokens (8192) must be greater than or equal to max_num_seqs (9000).")
    code, out, _ = run(capsys, "defaults", "--vllm-version", version, "--max-num-seqs", "9000",
                       "--max-num-batched-tokens", "9000")
    assert code == 0 and out


@pytest.mark.parametrize("version", ["0.33", "0.34"])
def test_search_refuses_the_workload_in_one_line_and_writes_nothing(capsys, tmp_path, version):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_spec(version, "eagle", 1, 1)))
    out_dir = tmp_path / "run"
    code, out, err = run(capsys, "search", path, "--profile", tmp_path / "missing.csv", "--out", out_dir,
                         "--no-progress")
    assert code == 2 and len(err.strip().splitlines()) == 1 and SLOTS in err
    assert not out_dir.exists()
