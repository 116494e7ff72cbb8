"""SGLang's speculative numbers resolved as SGLang 0.5.23 resolves them (topk 1 forces draft tokens = steps + 1, NGRAM's
12 draft tokens, DFLASH's block size else 16), the rules anchored to the wheel's own source lines; what a workload then
models, and says in `cgtune defaults`; and SGLang's KV budget starting from the free memory before the weights."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402

from tuner.engines.sglang.memory import SglangKvRule  # noqa: E402
from tuner.engines.sglang.speculative import ResolvedSpeculation, resolve_speculation  # noqa: E402
from tuner.workload.spec import WorkloadError, parse_workload  # noqa: E402

MIB, GIB = 1 << 20, 1 << 30
SGLANG = Path(__file__).resolve().parents[2] / "workloads/sglang-eagle-llama-3.1-8b.yaml"


@pytest.mark.parametrize(("algorithm", "given", "resolved"), [
    # EAGLE family: topk 1 forces speculative_num_draft_tokens = steps + 1, whatever was written
    ("EAGLE", dict(num_steps=3, eagle_topk=1, num_draft_tokens=6),
     ResolvedSpeculation(3, 1, 4, ("speculative_num_draft_tokens 6 -> 4: SGLang forces steps + 1 at "
                                   "speculative_eagle_topk 1 (speculative_hook.py:1255-1266)",))),
    ("EAGLE3", dict(num_steps=3, eagle_topk=None, num_draft_tokens=None), ResolvedSpeculation(3, 1, 4)),
    ("NEXTN", dict(num_steps=1, eagle_topk=1, num_draft_tokens=2), ResolvedSpeculation(1, 1, 2)),
    ("EAGLE", dict(num_steps=5, eagle_topk=4, num_draft_tokens=8), ResolvedSpeculation(5, 4, 8)),
    # NGRAM: its BFS breadth (10) is its topk, 12 draft tokens when unset, steps = draft // topk
    ("NGRAM", dict(num_steps=None, eagle_topk=None, num_draft_tokens=None),
     ResolvedSpeculation(1, 10, 12, ("speculative_num_draft_tokens unset -> 12: NGRAM's default "
                                     "(speculative_hook.py:1314-1318)",))),
    ("NGRAM", dict(num_steps=None, eagle_topk=None, num_draft_tokens=24), ResolvedSpeculation(2, 10, 24)),
    # DFLASH: one step at topk 1, the block size as draft tokens, 16 when neither is given
    ("DFLASH", dict(num_steps=None, eagle_topk=None, num_draft_tokens=8), ResolvedSpeculation(1, 1, 8)),
    ("DFLASH", dict(num_steps=None, eagle_topk=None, num_draft_tokens=None, dflash_block_size=10),
     ResolvedSpeculation(1, 1, 10)),
])
def test_resolution_as_sglang_resolves(algorithm, given, resolved):
    assert resolve_speculation(algorithm, **given) == resolved


def test_dflash_without_a_block_size_is_16_and_says_why():
    r = resolve_speculation("DFLASH", num_steps=3, eagle_topk=None, num_draft_tokens=None)
    assert (r.num_steps, r.eagle_topk, r.num_draft_tokens) == (1, 1, 16)
    assert r.changes[0].startswith("speculative_num_steps 3 -> 1: DFLASH runs one step at topk 1")
    assert "SGLang reads the draft model's block_size from its config.json, else 16" in r.changes[1]


@pytest.mark.parametrize(("algorithm", "given", "message"), [
    ("EAGLE", dict(num_steps=None, eagle_topk=None, num_draft_tokens=None), "^speculative_num_steps: missing"),
    ("EAGLE", dict(num_steps=3, eagle_topk=4, num_draft_tokens=None),
     r"^speculative_num_draft_tokens: missing \(needed with speculative_eagle_topk=4\)"),
    ("DFLASH", dict(num_steps=None, eagle_topk=None, num_draft_tokens=8, dflash_block_size=16),
     "^speculative_num_draft_tokens: 8 differs from speculative_dflash_block_size=16"),
])
def test_what_sglang_refuses_or_cgtune_would_guess_is_refused(algorithm, given, message):
    with pytest.raises(ValueError, match=message):
        resolve_speculation(algorithm, **given)


def _workload(serving: dict, method: str = "eagle") -> dict:
    data = yaml.safe_load(SGLANG.read_text())
    data["speculative"]["method"] = method
    if method == "ngram":
        del data["speculative"]["drafter"]
    elif method == "dflash":
        data["speculative"]["drafter"] = {"num_layers": 5}
    data["serving"] = {"max_running_requests": 128, "chunked_prefill_size": 8192, "context_length": 8192, **serving}
    data["traffic"]["requests"]["max"] = 128
    return data


@pytest.mark.parametrize(("method", "serving", "q", "steps"), [
    ("eagle", {"speculative_num_steps": 3, "speculative_num_draft_tokens": 8}, 4, 3),  # forced to steps + 1
    ("eagle", {"speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}, 8, 3),
    ("ngram", {}, 12, 1),
    ("dflash", {}, 16, 1),
    ("dflash", {"speculative_dflash_block_size": 10}, 10, 1),
])
def test_a_workload_models_the_width_sglang_runs(method, serving, q, steps):
    w = parse_workload(_workload(serving, method))
    assert w.engine.decode_query_len == q and w.serving.num_speculative_tokens == steps
    assert w.engine.decode_widths()[-1] == 128 * q  # the widest verify batch the search sees


@pytest.mark.parametrize(("serving", "message"), [
    ({}, "serving.speculative_num_steps: missing"),
    ({"speculative_num_steps": 3, "speculative_eagle_topk": 2}, "serving.speculative_num_draft_tokens: missing"),
])
def test_workload_errors_name_sglangs_keys(serving, message):
    with pytest.raises(WorkloadError, match=f"^{message}"):
        parse_workload(_workload(serving))


def test_defaults_say_what_sglang_resolved(tmp_path, capsys):
    path = tmp_path / "six.yaml"
    path.write_text(yaml.safe_dump(_workload({"speculative_num_steps": 3, "speculative_num_draft_tokens": 6})))
    code, out, err = run(capsys, "defaults", path)
    assert code == 0, err
    assert "EAGLE: speculative_num_steps 3, speculative_eagle_topk 1, speculative_num_draft_tokens 4, as SGLang " \
           "resolves them" in out
    assert "SGLang changes: speculative_num_draft_tokens 6 -> 4: SGLang forces steps + 1" in out
    code, out, err = run(capsys, "defaults", path, "--json")
    assert json.loads(out)["speculative"] == {
        "algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4,
        "changed_by_sglang": ["speculative_num_draft_tokens 6 -> 4: SGLang forces steps + 1 at speculative_eagle_topk "
                              "1 (speculative_hook.py:1255-1266)"]}


# ------------------------------------------------------------------------------------------ the wheel's own source
WHEEL = Path(os.environ.get("CGTUNE_SGLANG_WHEEL", "/tmp/wheels/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"))
HOOK = "sglang/srt/arg_groups/speculative_hook.py"
RULES = [  # (first line, last line, text that stands there in 0.5.23)
    (1255, 1266, "speculative_num_draft_tokens=cfg.speculative_num_steps + 1"),  # topk 1 forces steps + 1
    (1312, 1312, "speculative_eagle_topk=cfg.speculative_ngram_max_bfs_breadth"),  # NGRAM's topk
    (1314, 1318, "speculative_num_draft_tokens=12"),  # NGRAM's default
    (330, 350, "speculative_num_steps=1"),  # DFLASH: one step
    (380, 386, "speculative_num_draft_tokens=int(cfg.speculative_dflash_block_size)"),
    (389, 424, "inferred_block_size = 16"),  # DFLASH without a block size
    (324, 327, "DFLASH speculative decoding requires setting --speculative-draft-model-path"),
]


def _hook_source() -> str | None:
    try:
        if importlib.metadata.version("sglang") == "0.5.23":
            spec = importlib.util.find_spec("sglang")
            return (Path(next(iter(spec.submodule_search_locations))).parent / HOOK).read_text()
    except importlib.metadata.PackageNotFoundError:
        pass
    if WHEEL.is_file():
        with zipfile.ZipFile(WHEEL) as wheel:
            return wheel.read(HOOK).decode()
    return None


def test_the_rules_stand_at_the_quoted_lines_of_sglang_0_5_23():
    source = _hook_source()
    if source is None:
        reason = f"SGLang 0.5.23 neither installed nor its wheel at {WHEEL} (set CGTUNE_SGLANG_WHEEL)"
        if os.environ.get("CGTUNE_REQUIRE_SGLANG") == "1":
            pytest.fail(f"CGTUNE_REQUIRE_SGLANG=1 but {reason}")
        pytest.skip(reason)
    lines = source.splitlines()
    for first, last, text in RULES:
        assert text in "\n".join(lines[first - 1:last]), f"{HOOK}:{first}-{last}"


# ------------------------------------------------------------------------------------------------- the KV budget
def test_the_kv_budget_starts_from_free_memory_before_the_weights():
    rule = dict(total_memory_bytes=140 * GIB, weights_bytes=15 * GIB, activation_bytes=2 * GIB,
                required_kv_bytes=GIB, mem_fraction_static=0.9, gpu_memory_mib=140 * 1024)
    assumed = SglangKvRule(**rule)
    measured = SglangKvRule(**rule, pre_load_free_bytes=139 * GIB)  # the CUDA context and another process: 1 GiB
    # SGLang (kv_cache_configurator.py): KV = free after weights - free before x (1 - fraction) = before x f - weights
    assert measured.kv_available_bytes() == int(139 * GIB * 0.9) - 15 * GIB
    assert measured.capture_headroom_bytes(0, 0) == int(139 * GIB * 0.1 - 2 * GIB)
    # total memory in its place overstates both by the missing GiB times the fraction
    assert assumed.kv_available_bytes() - measured.kv_available_bytes() == pytest.approx(0.9 * GIB, abs=1)
    assert assumed.capture_headroom_bytes(0, 0) - measured.capture_headroom_bytes(0, 0) == pytest.approx(0.1 * GIB,
                                                                                                          abs=1)


def test_the_cost_model_takes_the_profiles_pre_load_reading_or_says_what_stands_in(tmp_path):
    from handmade_profiles import handmade_spec, write_handmade_inputs

    from tuner.model.costmodel import CostModel

    spec = handmade_spec(name="sg", engine="sglang", max_num_seqs=8, max_num_batched_tokens=64)
    spec["serving"] = {"max_running_requests": 8, "chunked_prefill_size": 64, "context_length": 64}
    _, profile, workload = write_handmade_inputs(tmp_path, spec, list(range(1, 65)))
    model = CostModel.from_files(profile, workload)
    assert model.budget.pre_load_free_bytes is None
    assert any(n.startswith("the profile has no pre_load_free_bytes (free memory before the weights load, where "
                            "SGLang's KV budget starts): total memory stands in") for n in model.notes)
    meta_path = profile.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta["pre_load_free_bytes"] = meta["total_memory_bytes"] - 64 * MIB
    meta_path.write_text(json.dumps(meta))
    model = CostModel.from_files(profile, workload)
    assert model.budget.pre_load_free_bytes == meta["total_memory_bytes"] - 64 * MIB
    assert not any("pre_load_free_bytes" in n for n in model.notes)
