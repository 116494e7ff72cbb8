"""Emitted SGLang flags and JSON parse back to the list; lists SGLang would change are refused in one line."""

from __future__ import annotations

import json
import shlex

import pytest

from tuner.engines.sglang.emit import (
    CUDA_GRAPH_CONFIG_FILE,
    FLAGS_FILE,
    EmitError,
    LaunchSettings,
    cuda_graph_config,
    flag_line,
    render_files,
    validate_decode_batch_sizes,
)
from tuner.engines.vllm.emit import Provenance

PROVENANCE = Provenance("0.1.0", "reports/x/profile.csv", "handmade test fixture", "sglang-eagle (abc)",
                        "2026-01-01T00:00Z", {"source": "exact"})
SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192]


SPECULATIVE = (("speculative-algorithm", "EAGLE"), ("speculative-draft-model-path", "my-org/eagle-head"),
               ("speculative-num-steps", 3), ("speculative-eagle-topk", 1), ("speculative-num-draft-tokens", 4))


def launch(max_running_requests: int = 192, **kw) -> LaunchSettings:
    return LaunchSettings(**{"max_running_requests": max_running_requests, "context_length": 8192,
                             "chunked_prefill_size": 8192, "tp_size": 1, "dtype": "bfloat16",
                             "speculative": SPECULATIVE, **kw})


def _flag_tokens(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1
    return shlex.split(lines[0])


def test_files_parse_back_to_the_list():
    files = render_files(SIZES, launch(), tokens_per_request=4, provenance=PROVENANCE)
    assert sorted(files) == sorted([FLAGS_FILE, CUDA_GRAPH_CONFIG_FILE])
    tokens = _flag_tokens(files[FLAGS_FILE])
    flags = dict(zip(tokens[::2], tokens[1::2]))
    assert len(flags) * 2 == len(tokens)  # every flag takes one value
    assert flags["--max-running-requests"] == "192"
    # The list as --cuda-graph-config JSON, a string on the line (SGLang parses the argument, never a path).
    assert json.loads(flags["--cuda-graph-config"]) == {"decode": {"bs": SIZES}}
    assert json.loads(files[CUDA_GRAPH_CONFIG_FILE]) == {"decode": {"bs": SIZES}}
    # The four speculative flags and the draft model, as given.
    assert [flags[f"--{k}"] for k, _ in SPECULATIVE] == [str(v) for _, v in SPECULATIVE]
    assert (flags["--context-length"], flags["--chunked-prefill-size"], flags["--tp-size"], flags["--dtype"]) == \
        ("8192", "8192", "1", "bfloat16")
    assert "--mem-fraction-static" not in flags  # SGLang's automatic fraction, as modelled
    assert "# profile: reports/x/profile.csv (device: handmade test fixture)" in files[FLAGS_FILE]
    assert "bs x 4 token(s)" in files[FLAGS_FILE]


def test_a_set_fraction_and_notes_are_written():
    files = render_files([1, 2, 4], launch(4, mem_fraction_static=0.85, notes=("a note for the reader",)))
    assert dict(zip(*[iter(_flag_tokens(files[FLAGS_FILE]))] * 2))["--mem-fraction-static"] == "0.85"
    assert "# a note for the reader\n" in files[FLAGS_FILE]


def test_removed_flags_are_never_emitted():
    files = render_files(SIZES, launch())
    tokens = _flag_tokens(files[FLAGS_FILE])
    assert "--cuda-graph-bs" not in tokens and "--cuda-graph-max-bs" not in tokens
    assert not any(t.startswith("--cuda-graph-max-bs") for t in tokens)


def test_flag_line_is_shell_quoted_and_config_mapping():
    line = flag_line([4, 1, 2], launch(4, speculative=()))
    assert line == ("--max-running-requests 4 --context-length 8192 --chunked-prefill-size 8192 --tp-size 1 "
                    "--dtype bfloat16 --cuda-graph-config '{\"decode\":{\"bs\":[1,2,4]}}'")
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
        render_files(sizes, launch(8))


def test_list_ending_below_the_pool_is_valid():
    assert validate_decode_batch_sizes([1, 2, 4], max_running_requests=256) == [1, 2, 4]
