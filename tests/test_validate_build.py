"""Validation's decode model that does not fit the device: one line naming the workload and the memory asked, not a
traceback from inside the allocator."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_workload  # noqa: E402

from tuner.measure import decoder  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.validate.backend import ValidationError, build_backend  # noqa: E402


def test_out_of_memory_building_the_validation_model_is_one_line(tmp_path, monkeypatch) -> None:
    workload = handmade_workload()
    model = CostModel.from_files(handmade_profile(tmp_path, workload, [1, 2, 4, 8]), workload)

    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (scripted)")

    monkeypatch.setattr(decoder, "build_model", no_memory)
    with pytest.raises(ValidationError) as caught:
        build_backend(model, {"default": model.evaluate(model.default_sizes)}, "cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("hand: out of memory building the model on cpu: it asks ")
    # As wide as the widest graph or step of the lists (16 tokens here), at the workload's mean context.
    assert message.endswith("GiB of KV cache for 16 tokens at context 2048")
