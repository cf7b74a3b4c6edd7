"""DP-SGD's cost on the demo (docs/dp.md, "Measured: DP-SGD on the demo"): seconds of one round of local
training of all 10 demo clients (2 epochs, B = 32, the initial model) with plain SGD (local_train) and
with DP-SGD (dpsgd_train, C = 1, z = 1), interleaved after one warm-up: CPU-time median and quartiles
over the repeats, the ratio of medians, wall time beside it and the load average (benchmarks/perf/timing.py:
CPU time holds on a shared machine, wall time does not); and the per-sample gradient norms at the
initial model, which set how much C = 1 clips. Run: .venv/bin/python benchmarks/dpsgd_overhead.py [repeats]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mmfl, not the installed one
sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from timing import fmt_spread, interleave  # noqa: E402
torch.set_num_threads(1)
from mmfl.config import load_config  # noqa: E402
from mmfl.core.dpsgd import dpsgd_train, per_sample_gradients  # noqa: E402
from mmfl.core.training import load_into, local_train, state_of  # noqa: E402
from mmfl.data.federation import build_federation  # noqa: E402
from mmfl.models.factory import model_factory  # noqa: E402
import torch.nn.functional as F  # noqa: E402

repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
cfg = load_config("mmfl/configs/demo.toml", ["threads=1"])
fed = build_federation(cfg)
make = model_factory(cfg, fed.meta)
model = make()
init = state_of(model)


def ce(m, inputs, labels):
    return F.cross_entropy(m(inputs)["logits"], labels, reduction="none")


def plain():
    for c, data in enumerate(fed.clients):
        local_train(load_into(model, init), data, cfg.train, torch.Generator().manual_seed(c))


def dpsgd():
    for c, data in enumerate(fed.clients):
        dpsgd_train(load_into(model, init), data, cfg.train, 1.0, 1.0, torch.Generator().manual_seed(c),
                    torch.Generator().manual_seed(100 + c), ce)


res = interleave({"sgd": plain, "dpsgd": dpsgd}, repeats=repeats, warmup=1, log=None)
for name in ("sgd", "dpsgd"):
    print(f"{name}: CPU {fmt_spread(res.cpu(name), 3)} s (median, q1-q3), wall median {res.wall(name)['median']:.3f} s "
          f"per round of 10 clients ({repeats} interleaved repeats)")
print(f"ratio of CPU medians: {res.ratio('dpsgd', 'sgd'):.1f}x (wall: {res.ratio('dpsgd', 'sgd', 'wall'):.1f}x); "
      f"load average {res.load_start:.1f} at start, {res.load_end:.1f} at end")

load_into(model, init).train()
norms = []
with per_sample_gradients(model):
    for data in fed.clients:
        inputs, labels = data.get()
        ce(model, inputs, labels).sum().backward()
        gs = [p.grad_sample for p in model.parameters()]
        norms.append(torch.stack([g.reshape(len(g), -1).norm(dim=1) for g in gs], 1).norm(dim=1))
        for p in model.parameters():
            p.grad_sample, p.grad = None, None
n = torch.cat(norms)
q = torch.quantile(n, torch.tensor([0.1, 0.5, 0.9]))
print(f"per-sample gradient norm at the initial model over {len(n)} rows: 10% {q[0]:.2f}, median {q[1]:.2f}, "
      f"90% {q[2]:.2f}; share above C = 1: {float((n > 1).double().mean()):.3f}")
print("client sizes:", [len(c) for c in fed.clients])
