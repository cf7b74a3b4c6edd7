"""Self-distillation check of CreamFL's server distillation (eq. 7) on the packaged mfeat config
(a CNN image encoder with BatchNorm): after the run, distill the final server toward its *own*
representations of the public set (what the engine computes, eval mode) once with BatchNorm in
eval mode (``algorithm.distill_norm = "eval"``, the default) and once in train mode (the authors'
code), each from the same state at the server's base learning rate, and report how far that moves it: the largest change of a
BatchNorm running statistic and of a parameter, and the test R@1 (fifths + all, the paper's
four-term R@1_sum, and i2t + t2i on all) before and after. A fixed point moves nothing.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/creamfl/self_distill.py --seeds 0 --rounds 8
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import tomllib
from pathlib import Path

import torch

from mmfl.algorithms.creamfl_terms import public_reps, retrieval_metrics
from mmfl.config import resolve
from mmfl.core.training import set_lr
from mmfl.engine.runner import Experiment

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = ROOT / "mmfl" / "configs" / "creamfl_mfeat.toml"


def measure(seed: int, rounds: int) -> list[dict]:
    raw = tomllib.loads(PACKAGED.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        raw.update(seed=seed, rounds=rounds, output_dir=tmp, threads=1)
        exp = Experiment(resolve(raw), progress=False)
        exp.run()
        server = exp.server
        state = copy.deepcopy(server.model.state_dict())
        opt = copy.deepcopy(server.opt_kd.state_dict())
        test = exp.federation.test
        before = retrieval_metrics(server.model, test, server.ctx.meta, server.pair)
        own = public_reps(server.model, server.public, server.pair)
        rows = []
        for mode in ("eval", "train"):
            server.model.load_state_dict(state)
            server.opt_kd.load_state_dict(opt)
            server.params.distill_norm = mode
            set_lr(server.opt_kd, server.params.server_lr)  # the schedule's top rate (its end is ~0)
            server.distill(own, rounds)
            after = server.model.state_dict()
            stats = max(float((after[k] - state[k]).abs().max()) for k in state
                        if k.endswith(("running_mean", "running_var")))
            par = max(float((after[k] - state[k]).abs().max()) for k, _ in server.model.named_parameters())
            m = retrieval_metrics(server.model, test, server.ctx.meta, server.pair)
            rows.append(dict(seed=seed, mode=mode, stats=stats, params=par,
                             sum_before=before["rsum_authors"], sum_after=m["rsum_authors"],
                             two_before=before["r1_sum"], two_after=m["r1_sum"]))
        return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--rounds", type=int, default=8, help="rounds of the run before the check (the config's 8)")
    a = ap.parse_args()
    print("| seed | BatchNorm in the distillation | max change of a running statistic | max change of a parameter "
          "| R@1_sum (four terms) before -> after | R@1 i2t+t2i (all) before -> after |")
    print("|---|---|---|---|---|---|")
    for s in a.seeds:
        for r in measure(s, a.rounds):
            print(f"| {r['seed']} | {r['mode']} | {r['stats']:.4f} | {r['params']:.2e} | {r['sum_before']:.2f} -> "
                  f"{r['sum_after']:.2f} | {r['two_before']:.2f} -> {r['two_after']:.2f} |")


if __name__ == "__main__":
    main()
