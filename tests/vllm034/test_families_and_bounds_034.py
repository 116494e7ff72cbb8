"""cgtune's vLLM 0.34 rulebook on every compute capability family and every ordering of the token bounds, held to the
answers worked by hand in tests/vllm034/hand_cases.py (test_vllm034_oracle.py holds vLLM 0.34's own code to the same
answers): `resolve_capture_sizes` and the target manager's decode graphs, and the same through the Engine a workload
gets (its defaults, and the lists it ships resolved again). Needs no vLLM."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vllm034 helpers (import-mode=importlib)
from hand_cases import CASES, FAMILIES  # noqa: E402

from tuner.engines.registry import engine_of  # noqa: E402
from tuner.engines.serving import ServingConfig  # noqa: E402
from tuner.engines.vllm.v034.defaults import SplitSizes, resolve_capture_sizes  # noqa: E402
from tuner.engines.vllm.v034.dispatch import Dispatcher034  # noqa: E402
from tuner.engines.vllm.v034.settings import Vllm034Settings  # noqa: E402


def _answer(split: SplitSizes, d: Dispatcher034, case: dict[str, Any]) -> dict[str, Any]:
    """What the case states, as cgtune resolved it."""
    got = {"prefill": split.prefill_token_sizes, "decode": split.decode_request_sizes,
           "budget": split.max_decode_tokens, "decode_graphs": sorted([n, q] for n, q in d.decode_shapes),
           "max_record": split.max_record, "record": split.record, "draft": split.draft_decode_request_sizes,
           "warnings": [w for w in split.warnings if w in case.get("warnings", [])]}
    return {k: got[k] for k in case if k != "config"}


@pytest.mark.parametrize("name", list(CASES))
def test_the_rulebook_resolves_the_hand_worked_case(name):
    case = CASES[name]
    cfg = case["config"]
    split = resolve_capture_sizes(**cfg)
    d = Dispatcher034.from_split(split, max_num_seqs=cfg["max_num_seqs"],
                                 uniform_decode_query_len=1 + cfg.get("num_speculative_tokens", 0))
    assert _answer(split, d, case) == {k: v for k, v in case.items() if k != "config"}


def _engine(cfg: dict[str, Any]) -> Any:
    settings = Vllm034Settings(**{k: cfg[k] for k in ("prefill_token_sizes", "max_prefill_tokens",
                                                      "decode_request_sizes", "max_decode_requests",
                                                      "max_decode_tokens") if k in cfg})
    return engine_of(ServingConfig(
        max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["max_num_batched_tokens"],
        num_speculative_tokens=cfg.get("num_speculative_tokens", 0), gpu_capability=cfg["gpu_capability"],
        speculative_method=cfg.get("speculative_method"),
        max_cudagraph_capture_size=cfg.get("max_cudagraph_capture_size"), engine_settings=settings, vllm_version="0.34"))


@pytest.mark.parametrize("name", list(CASES))
def test_the_engine_captures_the_hand_worked_graphs_and_ships_lists_that_resolve_to_them(name):
    # The Engine reads the workload's capability and 0.34 settings; a list it ships (explicit prefill and decode
    # sizes, the wide budget applying again on 10.x) must give vLLM the same graphs.
    case = CASES[name]
    engine = _engine(case["config"])
    defaults = engine.defaults()
    assert engine.version == "0.34" and defaults.max_size == case["max_record"]
    for d in (Dispatcher034.from_split(defaults.split, max_num_seqs=engine.serving.max_num_seqs,
                                       uniform_decode_query_len=engine.decode_query_len),
              engine.dispatcher(defaults.sizes)):
        assert sorted([n, q] for n, q in d.decode_shapes) == case["decode_graphs"]
        assert d.prefill_token_sizes == case["prefill"]
    widest_step = max(w for w, _ in engine.dispatcher(defaults.sizes).decode_graphs)
    assert widest_step <= engine.serving.max_num_batched_tokens  # no decode graph a step cannot fill


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f"{f[0]}.{f[1]}")
def test_only_the_10x_family_takes_the_wide_defaults_and_the_deprecated_fields_turn_them_off(family):
    # is_device_capability_family(100): major 10, whatever the minor (10.0 B200, 10.3 B300); not 11.x or 12.x.
    # 48 x 4 speculating: off 10.x the shared list's max min(48 x 4 x 2, 512) = 384.
    split = resolve_capture_sizes(max_num_seqs=48, max_num_batched_tokens=8192, num_speculative_tokens=3,
                                  gpu_capability=family)
    wide = family[0] == 10
    assert split.wide_defaults is wide
    assert (split.max_decode_tokens, split.max_record) == ((8192, 8192) if wide else (None, 384))
    legacy = resolve_capture_sizes(max_num_seqs=48, max_num_batched_tokens=8192, num_speculative_tokens=3,
                                   gpu_capability=family, max_cudagraph_capture_size=256)
    assert (legacy.wide_defaults, legacy.legacy, legacy.max_decode_tokens, legacy.max_record) == (False, True, None,
                                                                                                   256)


def test_cgtune_defaults_words_the_bound_that_stops_the_decode_graphs():
    # The issue's B200: 256 x 17 = 4352 tokens, max_num_batched_tokens 2048 under SM100's 8192 budget: the graphs stop
    # at 120 requests (2040 tokens); the words must not promise 256 requests or an 8192-token decode budget.
    from tuner.report.run import words_of

    engine = _engine(CASES["B200, 2048 tokens below 256 x 17 and the 8192 budget"]["config"])
    rows = {line[:22].strip(): line[22:] for line in words_of(engine).defaults_text(engine, None, as_json=False)
            .splitlines()}
    assert rows["max_num_seqs x q"].endswith("the widest uniform decode batch is 120 x 17 = 2040 tokens")
    assert rows["defaults"].endswith("prefill to 2048 tokens, decode to max_num_seqs within 2048 tokens")
    assert rows["decode request sizes"] == ("37 sizes, max 256 requests; 28 graphs at q = 17, up to 120 requests "
                                            "(2040 tokens: max_num_batched_tokens 2048), none above")
    budget = _engine(CASES["B200, a 512 budget below 8192 tokens"]["config"])
    text = words_of(budget).defaults_text(budget, None, as_json=False)
    assert "within 512 tokens" in text and "up to 30 requests (510 tokens: max_decode_cudagraph_capture_tokens 512)" \
        in text


@pytest.mark.parametrize(("name", "fits", "past"), [
    ("B200, 2048 tokens below 256 x 17 and the 8192 budget", 120, 121),  # 2048 // 17
    ("H200, 300 tokens below 256 x 17", 17, 18),  # 300 // 17, no decode token budget off SM100
    ("B200, a 512 budget below 8192 tokens", 30, 31),  # 512 // 17
])
def test_a_shipped_decode_size_past_the_lowest_token_bound_is_refused(name, fits, past):
    # vLLM would capture `past` requests at `fits` (the most the lowest of max_num_batched_tokens and the decode
    # token budget holds): the files would not hold the graphs cgtune chose.
    from tuner.engines.vllm.emit import EmitError
    from tuner.engines.vllm.v034.dispatch import join_keys
    from tuner.engines.vllm.v034.emit import files_fields

    cfg = CASES[name]["config"]
    engine = _engine(cfg)
    mnbt, seqs = cfg["max_num_batched_tokens"], cfg["max_num_seqs"]
    files_fields(engine, join_keys([8, mnbt], [1, fits]), "FULL_AND_PIECEWISE")
    for prefill, decode, message in (([8], [1, past], f"captures {fits} requests"),
                                     ([mnbt + 1], [1], f"> max_num_batched_tokens={mnbt}"),
                                     ([8], [seqs + 1], f"> max_num_seqs={seqs}")):
        with pytest.raises(EmitError, match=message):
            files_fields(engine, join_keys(prefill, decode), "FULL_AND_PIECEWISE")


# the compilation-config fields vLLM 0.34 reads, as `resolve_capture_sizes` names them
_FILE_FIELDS = {"prefill_cudagraph_capture_token_sizes": "prefill_token_sizes",
                "max_prefill_cudagraph_capture_tokens": "max_prefill_tokens",
                "decode_cudagraph_capture_request_sizes": "decode_request_sizes",
                "max_decode_cudagraph_capture_requests": "max_decode_requests",
                "max_decode_cudagraph_capture_tokens": "max_decode_tokens"}


def test_a_decode_token_budget_above_sm100s_8192_reaches_the_deployed_vllm():
    # A B200 with max_num_batched_tokens 16384 and max_decode_cudagraph_capture_tokens 16384 at 1024 x 16: cgtune
    # models (and validates) decode graphs up to 1024 requests; a compilation config without the budget would leave
    # vLLM on SM100's 8192-token default and stop them at 512, so the shipped config must carry it (issue 48).
    from tuner.engines.vllm.v034.emit import compilation_config_034, files_fields

    cfg = {"max_num_seqs": 1024, "num_speculative_tokens": 15, "max_num_batched_tokens": 16384,
           "gpu_capability": (10, 0), "max_decode_tokens": 16384}
    engine = _engine(cfg)
    keys = engine.defaults().sizes
    fields = files_fields(engine, keys, "FULL_AND_PIECEWISE")
    modelled = engine.dispatcher(keys).decode_shapes
    assert max(n for n, _ in modelled) == 1024
    shipped = compilation_config_034(keys, "FULL_AND_PIECEWISE", fields)
    split = resolve_capture_sizes(**{k: v for k, v in cfg.items() if k != "max_decode_tokens"},
                                  **{_FILE_FIELDS[k]: v for k, v in shipped.items() if k in _FILE_FIELDS})
    deployed = Dispatcher034.from_split(split, max_num_seqs=1024, uniform_decode_query_len=16).decode_shapes
    assert deployed == modelled
