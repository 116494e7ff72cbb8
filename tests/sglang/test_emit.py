"""Emitted SGLang flags and JSON parse back to the list; lists SGLang would change are refused in one line."""

from __future__ import annotations

import json
import shlex

import pytest

from tuner.sglang.emit import (
    CUDA_GRAPH_CONFIG_FILE,
    FLAGS_FILE,
    EmitError,
    cuda_graph_config,
    flag_line,
    render_files,
    validate_decode_batch_sizes,
)
from tuner.vllm.emit import Provenance

PROVENANCE = Provenance("0.1.0", "reports/x/profile.csv", "handmade test fixture", "sglang-eagle (abc)",
                        "2026-01-01T00:00Z", {"source": "exact"})
SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192]


def _flag_tokens(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1
    return shlex.split(lines[0])


def test_files_parse_back_to_the_list():
    files = render_files(SIZES, max_running_requests=192, tokens_per_request=4, provenance=PROVENANCE)
    assert sorted(files) == sorted([FLAGS_FILE, CUDA_GRAPH_CONFIG_FILE])
    tokens = _flag_tokens(files[FLAGS_FILE])
    assert tokens[:2] == ["--max-running-requests", "192"]
    i = tokens.index("--cuda-graph-bs-decode")
    assert [int(t) for t in tokens[i + 1:]] == SIZES
    assert json.loads(files[CUDA_GRAPH_CONFIG_FILE]) == {"decode": {"bs": SIZES}}
    assert "# profile: reports/x/profile.csv (device: handmade test fixture)" in files[FLAGS_FILE]
    assert "bs x 4 token(s)" in files[FLAGS_FILE]


def test_json_in_the_flag_comment_parses_too():
    text = render_files([1, 2, 4], max_running_requests=4)[FLAGS_FILE]
    line = next(line for line in text.splitlines() if "--cuda-graph-config" in line)
    args = shlex.split(line.lstrip("# ").split(": ", 1)[1])
    assert json.loads(args[args.index("--cuda-graph-config") + 1]) == {"decode": {"bs": [1, 2, 4]}}


def test_removed_flags_are_never_emitted():
    files = render_files(SIZES, max_running_requests=192)
    tokens = _flag_tokens(files[FLAGS_FILE])
    assert "--cuda-graph-bs" not in tokens and "--cuda-graph-max-bs" not in tokens
    assert not any(t.startswith("--cuda-graph-max-bs") for t in tokens)


def test_flag_line_without_pool_and_config_mapping():
    assert flag_line([4, 1, 2]) == "--cuda-graph-bs-decode 1 2 4"
    assert cuda_graph_config([4, 1, 2, 2]) == {"decode": {"bs": [1, 2, 4]}}


def test_list_above_the_request_pool_is_refused_in_one_line():
    with pytest.raises(EmitError) as info:
        validate_decode_batch_sizes([1, 8, 64, 256], max_running_requests=48)
    message = str(info.value)
    assert message.startswith("cuda_graph_bs_decode: 256 > request pool 48 (max_running_requests=48")
    assert "\n" not in message


def test_pool_is_per_dp_rank():
    with pytest.raises(EmitError, match=r"^cuda_graph_bs_decode: 64 > request pool 48 \(max_running_requests=192 / "
                                        r"attn_dp_size=4\)"):
        validate_decode_batch_sizes([1, 64], max_running_requests=192, attn_dp_size=4)
    assert validate_decode_batch_sizes([1, 48], max_running_requests=192, attn_dp_size=4) == [1, 48]


def test_sizes_the_alignment_filter_drops_are_refused():
    with pytest.raises(EmitError, match=r"^cuda_graph_bs_decode: SGLang would capture \[2, 4\], not \[1, 2, 3, 4\]"):
        validate_decode_batch_sizes([1, 2, 3, 4], max_running_requests=4, mul_base=2)


@pytest.mark.parametrize(
    ("sizes", "pattern"),
    [([], r"^cuda_graph_bs_decode: \[\] is empty"), ([0, 4], r"holds a size < 1"),
     ([4, 2], r"must be sorted and unique"), ([2, 2], r"must be sorted and unique")],
)
def test_malformed_lists_are_refused(sizes, pattern):
    with pytest.raises(EmitError, match=pattern):
        render_files(sizes, max_running_requests=8)


def test_list_ending_below_the_pool_is_valid():
    assert validate_decode_batch_sizes([1, 2, 4], max_running_requests=256) == [1, 2, 4]
