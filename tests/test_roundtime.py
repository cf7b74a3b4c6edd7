"""mmfl.bench.roundtime: the per-round CPU / wall / GPU time of a run, and one call's time."""

import time

import pytest
import torch

from mmfl.bench.roundtime import cpu_seconds, time_call


def test_time_call_counts_cpu_time_not_sleep_and_has_no_gpu_time_on_the_cpu():
    def busy():
        t = cpu_seconds()
        while cpu_seconds() - t < 0.05:
            pass
        time.sleep(0.05)
        return "done"

    out, t = time_call(busy, "cpu")
    assert out == "done" and t["gpu"] is None
    assert 0.05 <= t["cpu"] < t["wall"]  # the sleep is wall time, not CPU time


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a GPU (scripts/gpu_check.sh runs it there)")
def test_time_call_on_cuda_times_the_kernels_by_events():
    x = torch.randn(2048, 2048, device="cuda")
    out, t = time_call(lambda: x @ x, "cuda")
    assert out.shape == (2048, 2048) and 0 < t["gpu"] <= t["wall"] * 1.5
