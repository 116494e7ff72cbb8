"""vLLM 0.34's capture sizes worked by hand from shared/reference/vllm-034-facts.md §2 (not by cgtune's code) on every
compute capability family a deployment runs, and on every ordering of the token bounds: max_num_batched_tokens below
max_num_seqs x q, below the decode token budget (SM100's 8192 or a set one), below the prefill cap (SM100's 8192 or a
set one), and explicit lists above each bound. Plain data, imported by both sides: tests/vllm034/answers.py gets
vLLM's own answers for these configs (test_vllm034_oracle.py holds them to the hand-worked ones), and
tests/vllm034/test_families_and_bounds_034.py holds cgtune's rulebook to them without vLLM installed.

Each case: `config` (the keyword arguments of `resolve_capture_sizes` and of the oracle's `Config`) and what vLLM
resolves: `prefill` and `decode` (the resolved lists), `budget` (`max_decode_cudagraph_capture_tokens` as resolved),
`decode_graphs` (the target manager's `(requests, q)` decode graphs, ascending), `max_record`, and where it says more
`record`, `draft` (the one-token draft decode request sizes) and `warnings` (messages vLLM logs)."""

from __future__ import annotations

from typing import Any

FAMILIES = ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))
"""Every compute capability family a deployment runs: Ampere (8.0, 8.6), Ada (8.9), Hopper (9.0), data-center
Blackwell (10.0 B200, 10.3 B300), Thor (11.0), consumer Blackwell (12.0 RTX PRO 6000 / RTX 5090, 12.1 DGX Spark).
Only 10.x is `is_device_capability_family(100)` (facts §2 step A: capability.to_int() // 10 == 10): the wide defaults
and the 1024-token ceiling."""

G512 = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
"""0.33's grid at its 512-token ceiling (the shared list off SM100)."""
PREFILL_GRID_8192 = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
                     640, 768, 896, 1024, *range(1280, 7681, 256), 8192]
"""`prefill_cudagraph_capture_grid(8192)` (facts §2: 54 sizes)."""
DECODE_GRID_512 = [1, 2, 3, 4, 5, 6, *range(8, 17, 2), *range(20, 49, 4), *range(56, 129, 8), *range(144, 353, 16),
                   *range(384, 513, 32)]
"""`decode_cudagraph_capture_grid(512)`: 1-6, strides of 2 from 8, 4 from 16, 8 from 48, 16 from 128, 32 from 352."""


def walked_to(grid: list[int], limit: int) -> list[int]:
    """A grid walked only up to `limit`: the sizes below it, then the limit (each step depends only on the size it
    starts from, so a shorter walk is a prefix of a longer one)."""
    return [s for s in grid if s < limit] + [limit]


DECODE_GRID_256 = walked_to(DECODE_GRID_512, 256)
STEP8_256 = [1, 2, 4, *range(8, 257, 8)]
"""The decode request counts 0.34 derives from G512 at q = 1 (every size above 256 requests clamped to 256)."""
SHARED_256X17 = sorted({*G512, 17, 34, 68, 408})
"""The shared list at 256 x 17 off SM100 (case (b)'s): G512 and the decode widths 17n <= 512 of the request grid."""


def _case(config: dict[str, Any], prefill: list[int], decode: list[int], budget: int | None,
          decode_graphs: list[tuple[int, int]], max_record: int, **more: Any) -> dict[str, Any]:
    return {"config": {"max_num_batched_tokens": 8192, **config}, "prefill": prefill, "decode": decode,
            "budget": budget, "decode_graphs": [list(g) for g in decode_graphs], "max_record": max_record, **more}


def _family_cases() -> dict[str, dict[str, Any]]:
    """Case (a) (256 requests, q = 1, 8192 tokens) on each family: the wide defaults on 10.x only; elsewhere 0.33's
    graphs. And 10.3 with the deprecated cap, which turns the wide defaults off there too."""
    cases = {}
    for major, minor in FAMILIES:
        config = {"max_num_seqs": 256, "gpu_capability": (major, minor)}
        if major == 10:
            cases[f"a on {major}.{minor}"] = _case(config, PREFILL_GRID_8192, DECODE_GRID_256, 8192,
                                                   [(n, 1) for n in DECODE_GRID_256], 8192)
        else:
            cases[f"a on {major}.{minor}"] = _case(config, G512, STEP8_256, None, [(n, 1) for n in STEP8_256], 512)
    cases["a on 10.3 with the deprecated cap"] = _case(
        {"max_num_seqs": 256, "gpu_capability": (10, 3), "max_cudagraph_capture_size": 512},
        G512, STEP8_256, None, [(n, 1) for n in STEP8_256], 512)
    return cases


def _bound_cases() -> dict[str, dict[str, Any]]:
    b200, h200 = {"gpu_capability": (10, 0)}, {"gpu_capability": (9, 0)}
    dflash_256 = {"max_num_seqs": 256, "num_speculative_tokens": 16, "speculative_method": "ngram"}
    cases = {
        # The issue's: 2048 tokens under SM100's 8192 budget; 2048 // 17 = 120 requests, a size of the grid.
        "B200, 2048 tokens below 256 x 17 and the 8192 budget": _case(
            {**b200, **dflash_256, "max_num_batched_tokens": 2048}, walked_to(PREFILL_GRID_8192, 2048),
            DECODE_GRID_256, 8192, [(n, 17) for n in DECODE_GRID_256 if n <= 120], 2048),
        # 2000 // 17 = 117: the grid's 120 is captured at 117 requests (1989 tokens), 128 and up are unreachable.
        "B200, 2000 tokens below 256 x 17: the next size clamped": _case(
            {**b200, **dflash_256, "max_num_batched_tokens": 2000}, walked_to(PREFILL_GRID_8192, 2000),
            DECODE_GRID_256, 8192, [*((n, 17) for n in DECODE_GRID_256 if n <= 112), (117, 17)], 2000),
        # 64 x 17 = 1088 < 4096 < 8192: nothing clamps the decode graphs; the prefill grid stops at 4096.
        "B200, 64 x 17 below 4096 tokens below the 8192 budget": _case(
            {**b200, "max_num_seqs": 64, "num_speculative_tokens": 16, "speculative_method": "ngram",
             "max_num_batched_tokens": 4096}, walked_to(PREFILL_GRID_8192, 4096), walked_to(DECODE_GRID_512, 64),
            8192, [(n, 17) for n in walked_to(DECODE_GRID_512, 64)], 4096),
        # A 512-token budget below 8192 tokens: 512 // 17 = 30, the grid's 32 clamped to 30.
        "B200, a 512 budget below 8192 tokens": _case(
            {**b200, **dflash_256, "max_decode_tokens": 512}, PREFILL_GRID_8192, DECODE_GRID_256, 512,
            [*((n, 17) for n in DECODE_GRID_256 if n <= 28), (30, 17)], 8192),
        # Off SM100 at 256 x 17 with 300 tokens: the shared max min(8704, 512) clipped to 300 (appended), decode
        # sizes 17n <= 300 of the request grid; the decode requests ceil(s / 17) within 300 tokens: 1..17.
        "H200, 300 tokens below 256 x 17": _case(
            {**h200, **dflash_256, "max_num_batched_tokens": 300},
            sorted({1, 2, 4, *range(8, 256, 8), 256, 272, 288, 300, 17, 34, 68}), list(range(1, 18)), None,
            [(n, 17) for n in range(1, 18)], 300),
        # Off SM100 a set budget of 4096 above 1024 tokens: the decode list's 64 is clamped to 1024 // 17 = 60,
        # 100 unreachable; the prefill graphs are the shared list (case (b)'s).
        "H200, a 4096 budget above 1024 tokens, decode list past both": _case(
            {**h200, **dflash_256, "max_num_batched_tokens": 1024, "max_decode_tokens": 4096,
             "decode_request_sizes": (8, 64, 100)}, SHARED_256X17, [8, 64, 100], 4096, [(8, 17), (60, 17)], 1020),
        # A prefill cap of 4096 above 1000 tokens: the grid stops at 1000; the decode sizes come from G512.
        "H200, a 4096 prefill cap above 1000 tokens": _case(
            {**h200, "max_num_seqs": 256, "max_num_batched_tokens": 1000, "max_prefill_tokens": 4096},
            walked_to(PREFILL_GRID_8192, 1000), STEP8_256, None, [(n, 1) for n in STEP8_256], 1000),
        # SM100's 8192-token prefill top above 1000 tokens.
        "B200, 1000 tokens below the 8192 prefill top": _case(
            {**b200, "max_num_seqs": 256, "max_num_batched_tokens": 1000}, walked_to(PREFILL_GRID_8192, 1000),
            DECODE_GRID_256, 8192, [(n, 1) for n in DECODE_GRID_256], 1000),
        "B200, a prefill list above 2048 tokens": _case(
            {**b200, "max_num_seqs": 256, "max_num_batched_tokens": 2048, "prefill_token_sizes": (512, 1024, 3000)},
            [512, 1024], DECODE_GRID_256, 8192, [(n, 1) for n in DECODE_GRID_256], 1024,
            warnings=["Dropping [3000] from prefill_cudagraph_capture_token_sizes: outside [1, 2048]."]),
        # A decode list above max_num_seqs = 64 (the shared list off SM100: min(128, 512) = 128, q = 1).
        "H200, a decode list above 64 requests": _case(
            {**h200, "max_num_seqs": 64, "decode_request_sizes": (8, 64, 100)}, [1, 2, 4, *range(8, 129, 8)],
            [8, 64], None, [(8, 1), (64, 1)], 128,
            warnings=["Dropping [100] from decode_cudagraph_capture_request_sizes: outside [1, 64]."]),
        # A decode cap of 100 above max_num_seqs = 64: the grid walks to 64 (the shared list off SM100 as above).
        "H200, a decode cap above 64 requests": _case(
            {**h200, "max_num_seqs": 64, "max_decode_requests": 100}, [1, 2, 4, *range(8, 129, 8)],
            walked_to(DECODE_GRID_512, 64), None, [(n, 1) for n in walked_to(DECODE_GRID_512, 64)], 128),
        "B200, a decode list above 2048 // 17 requests": _case(
            {**b200, **dflash_256, "max_num_batched_tokens": 2048, "decode_request_sizes": (8, 64, 200, 256)},
            walked_to(PREFILL_GRID_8192, 2048), [8, 64, 200, 256], 8192, [(8, 17), (64, 17), (120, 17)], 2048),
        # A decode graph of exactly max_num_batched_tokens tokens (120 x 17 = 2040): the clip is <=, so vLLM keeps
        # the grid's 120 requests; a strict clip would capture them at 119.
        "B200, 2040 tokens, exactly 120 x 17": _case(
            {**b200, **dflash_256, "max_num_batched_tokens": 2040}, walked_to(PREFILL_GRID_8192, 2040),
            DECODE_GRID_256, 8192, [(n, 17) for n in DECODE_GRID_256 if n <= 120], 2040),
        # The same off SM100 with an explicit list at q = 1: 2048 requests in 2048 tokens is kept whole.
        "H200, a 2048-request decode graph in 2048 tokens": _case(
            {**h200, "max_num_seqs": 2048, "max_num_batched_tokens": 2048, "decode_request_sizes": (8, 2048)},
            G512, [8, 2048], None, [(8, 1), (2048, 1)], 2048),
        "B200, a decode list above a 1000 budget // 17": _case(
            {**b200, **dflash_256, "max_decode_tokens": 1000, "decode_request_sizes": (8, 64, 256)},
            PREFILL_GRID_8192, [8, 64, 256], 1000, [(8, 17), (58, 17)], 8192),
    }
    # EAGLE K = 2 on SM100, 512 requests, a 300-token budget below 1024 tokens: q = 3 decode graphs up to 300 // 3
    # = 100 requests (the grid's 104 clamped), the one-token draft decode graphs up to 300 (the grid's 304 clamped).
    decode = [*((n, 3) for n in DECODE_GRID_512 if n <= 96), (100, 3)]
    draft = [*(n for n in DECODE_GRID_512 if n <= 288), 300]
    prefill = walked_to(PREFILL_GRID_8192, 1024)
    cases["B200 EAGLE, a 300 budget below 1024 tokens, 512 x 3"] = _case(
        {**b200, "max_num_seqs": 512, "num_speculative_tokens": 2, "speculative_method": "eagle",
         "max_num_batched_tokens": 1024, "max_decode_tokens": 300}, prefill, DECODE_GRID_512, 300, decode, 1024,
        draft=DECODE_GRID_512, record=sorted({*prefill, *(n * q for n, q in decode), *draft}))
    return cases


CASES = {**_family_cases(), **_bound_cases()}
