"""A 0.34 workload's own capture fields reach the engine as written (`tuner.engines.vllm.v034.settings`), and a value
vLLM would refuse is refused in one line naming the field. Issue 47's mutation run found a reader that dropped a field
(the workload's explicit decode sizes, its request cap, its prefill cap under another key) or took a negative cap,
and no test saw it: a deployment that pins its graphs would have been costed on vLLM's defaults instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.engines.vllm.v034.settings import Vllm034Settings
from tuner.fields import WorkloadError
from tuner.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[2]

FIELDS = {  # every 0.34 field, each away from vLLM's default
    "prefill_cudagraph_capture_token_sizes": [64, 128, 256],
    "max_prefill_cudagraph_capture_tokens": 256,
    "decode_cudagraph_capture_request_sizes": [1, 2, 4, 8, 16],
    "max_decode_cudagraph_capture_requests": 16,
    "max_decode_cudagraph_capture_tokens": 272,
    "extensible_kv_cache": False,
}


def workload_with(tmp_path: Path, **fields: object):
    spec = yaml.safe_load((ROOT / "workloads/ngram-llama-3.1-8b.yaml").read_text())
    spec["serving"].update(vllm_version="0.34", **fields)
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_workload(path)


def test_every_034_field_a_workload_sets_reaches_the_engine_as_written(tmp_path):
    settings = workload_with(tmp_path, **FIELDS).serving.engine_settings
    assert settings == Vllm034Settings(prefill_token_sizes=(64, 128, 256), max_prefill_tokens=256,
                                       decode_request_sizes=(1, 2, 4, 8, 16), max_decode_requests=16,
                                       max_decode_tokens=272, extensible_kv_cache=False)
    # and none is read when none is set: vLLM's defaults apply
    assert workload_with(tmp_path).serving.engine_settings == Vllm034Settings()


def test_the_explicit_decode_sizes_are_the_decode_graphs_the_engine_costs(tmp_path):
    wl = workload_with(tmp_path, decode_cudagraph_capture_request_sizes=[2, 8, 32])
    sizes = wl.engine.defaults().sizes  # the deployment's lists as the engine keeps them
    kinds = {what: widths for what, _, widths in wl.engine.graph_kinds(sizes)}
    assert [widths for what, widths in kinds.items() if "decode" in what] == [[2 * 17, 8 * 17, 32 * 17]], kinds


@pytest.mark.parametrize("key, bad", [("max_prefill_cudagraph_capture_tokens", -1),
                                      ("max_decode_cudagraph_capture_requests", -1),
                                      ("max_decode_cudagraph_capture_tokens", 0),
                                      ("decode_cudagraph_capture_request_sizes", [0, 4]),
                                      ("prefill_cudagraph_capture_token_sizes", [-8])])
def test_a_value_vllm_refuses_is_refused_naming_the_field(tmp_path, key, bad):
    with pytest.raises(WorkloadError) as err:
        workload_with(tmp_path, **{key: bad})
    message = str(err.value)
    assert f"serving.{key}" in message and str(bad) in message and "\n" not in message
