"""How far stacked training drifts from one-by-one training, next to float32's own drift.

    .venv/bin/python benchmarks/perf/batched_drift.py                    # SGD and Adam, 2 clients
    .venv/bin/python benchmarks/perf/batched_drift.py --images 3000 --optimizers adam

Stacked training (``batch_clients``) equals one-by-one training within float tolerance, not
bit for bit (summation order inside the kernels differs). How large that tolerance is after
many steps depends on the optimizer: Adam divides each update by the root of its second
moment, so a rounding difference in a tiny gradient becomes a difference of about ``lr`` in
the update. This script trains ``--clients`` clients of the issue's workload (MOON's simple
CNN on Fashion-MNIST, ``--images`` each, batch 64, 1 epoch) from one start three ways:
one-by-one in float32 (mmfl's :func:`~mmfl.core.training.local_train`), one-by-one in float64
(the reference) and stacked in float32 (:func:`~mmfl.core.batched.train_stacked`), and prints
the largest parameter difference of each pair: stacked vs one-by-one should be no larger than
float32 vs float64.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's mmfl
from common import workload  # noqa: E402

from mmfl.config import TrainConfig, load_config  # noqa: E402
from mmfl.core.batched import BatchedClient, BatchedTask, train_stacked  # noqa: E402
from mmfl.core.training import local_train  # noqa: E402
from mmfl.engine.runner import Experiment  # noqa: E402


class _CrossEntropy(BatchedClient):
    def batched_loss(self, forward, params, inputs, labels, extras, shared):
        return torch.nn.functional.cross_entropy(forward(params, inputs)["logits"], labels, reduction="none")


class _Float64(torch.nn.Module):
    """A float64 copy of a model that takes mmfl's float32 inputs."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model.double()

    def forward(self, inputs):
        return self.model({k: v.double() for k, v in inputs.items()})


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--images", type=int, default=3000, help="training images per client")
    ap.add_argument("--optimizers", nargs="+", choices=["sgd", "adam"], default=["sgd", "adam"])
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    exp = Experiment(load_config(None, workload("drift", clients=10, per_round=a.clients, rounds=1)), progress=False)
    datas = [exp.federation.clients[c].subset(torch.arange(a.images).numpy()) for c in range(a.clients)]
    out = {}
    for opt in a.optimizers:
        train = TrainConfig(optimizer=opt, local_epochs=1, batch_size=64, lr=0.001 if opt == "adam" else 0.01,
                            momentum=0.9, weight_decay=1e-5)
        model = exp.make_model()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        stacked = train_stacked(model, _CrossEntropy(), [BatchedTask(start=start) for _ in datas], datas,
                                [torch.Generator().manual_seed(7 + i) for i in range(a.clients)], train)
        for i, d in enumerate(datas):
            f32 = exp.make_model()
            f32.load_state_dict(start)
            steps = local_train(f32, d, train, torch.Generator().manual_seed(7 + i))["steps"]
            f64 = exp.make_model()
            f64.load_state_dict(start)
            local_train(_Float64(f64), d, train, torch.Generator().manual_seed(7 + i))
            s32, s64, sb = f32.state_dict(), f64.state_dict(), stacked[i][0]
            row = {"steps": steps, "float32_vs_float64": max_diff(s32, s64),
                   "stacked_vs_one_by_one": max_diff(sb, s32), "stacked_vs_float64": max_diff(sb, s64)}
            out[f"{opt}/{i}"] = row
            print(f"{opt:>4s} client {i} ({steps} steps): max |diff| one-by-one float32 vs float64 "
                  f"{row['float32_vs_float64']:.1e}; stacked vs one-by-one {row['stacked_vs_one_by_one']:.1e}; "
                  f"stacked vs float64 {row['stacked_vs_float64']:.1e}", flush=True)
    return out


if __name__ == "__main__":
    main()
