"""Counting what a step launches: CUDA kernels from profiler events (stand-in events here), aten ops that do work
from a real CPU profile of a few hand-picked ops."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import torch
from torch.autograd import DeviceType

from tuner.measure.kernels import count_cpu_ops, count_cuda_kernels, cuda_kernels_per_layer


def test_cuda_kernels_are_device_events_without_copies_and_memsets() -> None:
    events = [
        SimpleNamespace(name="aten::mm", device_type=DeviceType.CPU),
        SimpleNamespace(name="cudaLaunchKernel", device_type=DeviceType.CPU),
        SimpleNamespace(name="sm90_xmma_gemm_bf16", device_type=DeviceType.CUDA),
        SimpleNamespace(name="triton_red_fused_add_mean_mul_pow_rsqrt_0", device_type=DeviceType.CUDA),
        SimpleNamespace(name="Memcpy HtoD (Pageable -> Device)", device_type=DeviceType.CUDA),
        SimpleNamespace(name="Memset (Device)", device_type=DeviceType.CUDA),
    ]
    assert count_cuda_kernels(events) == 2


def test_cpu_ops_count_outermost_ops_that_do_work() -> None:
    from torch.profiler import ProfilerActivity, profile

    x, w = torch.randn(4, 8), torch.randn(6, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y = torch.nn.functional.linear(x, w)  # 1 (its t + mm inside are not counted again)
        y = y.view(2, 12).transpose(0, 1)  # views: 0
        z = y.reshape(24)  # a reshape of a transposed view copies: 1
        torch.cat((z, z))  # 1
        torch.empty(3)  # an allocation alone: 0
    names: Counter = Counter()
    assert count_cpu_ops(prof.events(), by_name=names) == 3
    assert names == Counter({"aten::linear": 1, "aten::reshape": 1, "aten::cat": 1})


def test_kernel_count_is_not_read_off_cuda() -> None:
    assert cuda_kernels_per_layer(lambda: None, 32, "cpu") is None
