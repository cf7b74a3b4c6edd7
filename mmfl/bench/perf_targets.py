"""Workloads the perf grids time (``call = "mmfl.bench.perf_targets:<factory>"``): each factory does
its setup (data loaded, experiment trained) outside the timing and returns the callable timed.
Inputs come from real data sets through mmfl's loaders, never random tensors."""

from __future__ import annotations

import functools
import hashlib
import json
import tempfile
from pathlib import Path

import torch

from mmfl.bench.timing import Sample, cpu_clock


@functools.lru_cache(maxsize=4)
def _images(name: str, rows: int) -> torch.Tensor:
    """``rows`` training rows of a data set (flattened, centred per column), read through mmfl."""
    from mmfl.config import load_config
    from mmfl.data.federation import build_federation

    fed = build_federation(load_config(None, [f"data.name={name}", "partition.num_clients=1",
                                              f"data.train_limit={rows}"]))
    c = fed.clients[0]
    x = torch.cat([v.reshape(len(v), -1).float() for v in c.features.values()], 1)[:rows]
    return x - x.mean(0)


def real_rows(data: str, rows: int, dim: int) -> torch.Tensor:
    """``rows`` x ``dim`` unit-norm rows of real data (the first ``dim`` centred columns; cycled when
    ``dim`` exceeds the data's width): stand-in representations for arithmetic benchmarks."""
    x = _images(data, rows)
    x = x.repeat(1, -(-dim // x.shape[1]))[:, :dim] if dim > x.shape[1] else x[:, :dim]
    return torch.nn.functional.normalize(x, dim=-1)


def _fresh_chunks(local, glob, chunk):
    """eq. 4 chunked as before one buffer was reused: fresh logits and exponentials per chunk."""
    C, P, _ = local.shape
    out = torch.empty(C, P)
    g_t = glob.t()
    for c in range(C):
        for s in range(0, P, chunk):
            e = min(P, s + chunk)
            rows = local[c, s:e]
            out[c, s:e] = (rows * glob[s:e]).sum(-1) - torch.logsumexp(rows @ g_t, dim=1)
    return out


def public_scores(variant: str, public: int, clients: int, dim: int, chunk: int, data: str = "fashion_mnist"):
    """CreamFL's public-set scores (eq. 4) of ``clients`` local and one global representation
    set: real images of ``data`` (their first ``dim`` centred pixels, unit norm) as the rows.
    ``variant``: ``"before"`` (fresh temporaries per chunk) or ``"after"`` (mmfl's, one buffer)."""
    from mmfl.algorithms.public_terms import global_local_contrastive_scores

    x = real_rows(data, public * (clients + 1), dim)
    local, glob = x[:public * clients].reshape(clients, public, dim).contiguous(), x[public * clients:].contiguous()
    fn = _fresh_chunks if variant == "before" else global_local_contrastive_scores
    return lambda: fn(local, glob, chunk)


@functools.lru_cache(maxsize=1)
def _moon_state() -> dict:
    """MOON's CNN on Fashion-MNIST, its seeded initial weights as a client's ``prev/`` state."""
    from mmfl.config import load_config
    from mmfl.data.federation import build_federation
    from mmfl.models.factory import model_factory

    cfg = load_config(None, ["data.name=fashion_mnist", "model.name=simple_cnn", "partition.num_clients=2"])
    sd = model_factory(cfg, build_federation(cfg).meta)().state_dict()
    return {f"prev/{k}": v.detach().clone() for k, v in sd.items()}


def store_checkpoints(store: str, clients: int, per_round: int, every: int, rounds: int = 10):
    """CPU seconds in checkpoint.save + the store's commit over ``rounds`` rounds of ``per_round``
    clients saving MOON's CNN as state, a checkpoint every ``every`` rounds (as the runner does)."""
    from mmfl.engine import checkpoint
    from mmfl.engine.state_store import ClientStateStore, DiskClientStateStore

    state = _moon_state()

    def run() -> Sample:
        spent = Sample(0.0, 0.0)
        with tempfile.TemporaryDirectory(prefix="mmfl-perf-") as tmp:
            root = Path(tmp)
            st = DiskClientStateStore(root / "store") if store == "disk" else ClientStateStore()
            for rnd in range(rounds):
                for cid in range(rnd * per_round, (rnd + 1) * per_round):
                    st.save(cid % clients, state)
                if (rnd + 1) % every == 0 or rnd + 1 == rounds:
                    t = cpu_clock()
                    checkpoint.save(root / "ckpt", rnd + 1, {"w": torch.zeros(1)}, st.write_checkpoint,
                                    {"round": rnd + 1})
                    st.commit()
                    spent.cpu += cpu_clock() - t
            if store == "disk":
                st.close()
        return spent
    return run


def state_size():
    """KB of the state :func:`store_checkpoints` saves per client."""
    return lambda: sum(t.numel() * t.element_size() for t in _moon_state().values()) / 1024


def personal_eval(sets: list[str]):
    """An mmfl run (``sets``), then its personalized evaluation through the clients, as on Flower
    (each client is sent its personalized model and scores it on its own test rows); the call
    returns the evaluation's metrics, a hash of the per-client accuracies and the clients per send."""
    import dataclasses

    from mmfl.config import load_config
    from mmfl.core import evaluation
    from mmfl.engine.runner import Experiment

    tmp = tempfile.mkdtemp(prefix="mmfl-perf-")
    exp = Experiment(load_config(None, [f"output_dir={tmp}", "name=m", *sets]), progress=False)
    exp.run()
    ctx = dataclasses.replace(exp.eval_context(0), personal_rows=None)  # through the clients, as on Flower
    exp.transport.begin_round(1)

    def run() -> dict:
        row = exp.server.evaluate_personalized(ctx)
        acc = json.dumps(row["client_accuracy"], sort_keys=True)
        return {"chunk": evaluation.PERSONAL_CHUNK, "clients_scored": len(row["client_accuracy"]),
                "client_accuracy_sha256": hashlib.sha256(acc.encode()).hexdigest(),
                **{k: row[k] for k in ("accuracy", "uar", "test_loss")}}
    return run


def _ce(m, inputs, labels):
    return torch.nn.functional.cross_entropy(m(inputs)["logits"], labels, reduction="none")


@functools.lru_cache(maxsize=2)
def _federation(config: str):
    from mmfl.config import load_config
    from mmfl.data.federation import build_federation
    from mmfl.models.factory import model_factory

    from mmfl.core.training import state_of

    cfg = load_config(config, ["threads=1"])
    fed = build_federation(cfg)
    model = model_factory(cfg, fed.meta)()
    return cfg, fed, model, state_of(model)  # the model and its initial (seeded) state


def local_round(config: str, dp: bool, clip: float = 1.0, noise: float = 1.0):
    """One round of local training of every client of ``config`` from the initial model: plain
    SGD (mmfl.core.training.local_train) or DP-SGD (mmfl.core.dpsgd.dpsgd_train, clip C, noise z)."""
    from mmfl.core.dpsgd import dpsgd_train
    from mmfl.core.training import load_into, local_train

    cfg, fed, model, init = _federation(config)

    def run():
        for c, data in enumerate(fed.clients):
            g = torch.Generator().manual_seed(c)
            if dp:
                dpsgd_train(load_into(model, init), data, cfg.train, clip, noise, g,
                            torch.Generator().manual_seed(100 + c), _ce)
            else:
                local_train(load_into(model, init), data, cfg.train, g)
    return run


def grad_norms(config: str, clip: float = 1.0):
    """Per-sample gradient norms of every client's rows at the initial model: 10 / 50 / 90 %
    quantiles and the share above ``clip`` (how much DP-SGD's clipping shortens a step)."""
    from mmfl.core.dpsgd import per_sample_gradients
    from mmfl.core.training import load_into

    def run() -> dict:
        cfg, fed, model, init = _federation(config)
        load_into(model, init).train()
        norms = []
        with per_sample_gradients(model):
            for data in fed.clients:
                _ce(model, *data.get()).sum().backward()
                gs = [p.grad_sample for p in model.parameters()]
                norms.append(torch.stack([g.reshape(len(g), -1).norm(dim=1) for g in gs], 1).norm(dim=1))
                for p in model.parameters():
                    p.grad_sample, p.grad = None, None
        n = torch.cat(norms)
        q = torch.quantile(n, torch.tensor([0.1, 0.5, 0.9])).tolist()
        return {"rows": len(n), "q10": q[0], "q50": q[1], "q90": q[2], "above_clip": float((n > clip).double().mean()),
                "client_rows": [len(c) for c in fed.clients]}
    return run


def stacked_drift(optimizer: str, clients: int = 2, images: int = 3000):
    """How far stacked training (``batch_clients``, mmfl.core.batched.train_stacked) drifts from
    one-by-one training, next to float32's own drift: ``clients`` clients of the issue's workload
    (MOON's simple CNN on Fashion-MNIST, ``images`` each, batch 64, 1 epoch) trained from one start
    one by one in float32 and in float64 and stacked in float32; the largest parameter difference of
    each pair, per client."""
    from mmfl.config import TrainConfig, load_config
    from mmfl.core.batched import BatchedClient, BatchedTask, train_stacked
    from mmfl.core.training import local_train
    from mmfl.engine.runner import Experiment

    class CrossEntropy(BatchedClient):
        def batched_loss(self, forward, params, inputs, labels, extras, shared):
            return _ce(lambda x: forward(params, x), inputs, labels)

    class Float64(torch.nn.Module):  # a float64 copy of a model that takes mmfl's float32 inputs
        def __init__(self, model):
            super().__init__()
            self.model = model.double()

        def forward(self, inputs):
            return self.model({k: v.double() for k, v in inputs.items()})

    def diff(a, b):
        return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)

    def run() -> list[dict]:
        sets = ["data.name=fashion_mnist", "partition.name=iid", "partition.num_clients=10", "model.name=simple_cnn",
                f"clients_per_round={clients}", "rounds=1", "output_dir=/tmp/mmfl-perf-drift"]
        exp = Experiment(load_config(None, sets), progress=False)
        datas = [exp.federation.clients[c].subset(torch.arange(images).numpy()) for c in range(clients)]
        train = TrainConfig(optimizer=optimizer, local_epochs=1, batch_size=64, momentum=0.9, weight_decay=1e-5,
                            lr=0.001 if optimizer == "adam" else 0.01)
        start = exp.make_model().state_dict()
        gens = lambda i: torch.Generator().manual_seed(7 + i)  # noqa: E731
        stacked = train_stacked(exp.make_model(), CrossEntropy(), [BatchedTask(start=start) for _ in datas], datas,
                                [gens(i) for i in range(clients)], train)
        rows = []
        for i, d in enumerate(datas):
            f32, f64 = exp.make_model(), exp.make_model()
            f32.load_state_dict(start)
            f64.load_state_dict(start)
            steps = local_train(f32, d, train, gens(i))["steps"]
            local_train(Float64(f64), d, train, gens(i))
            s32, s64, sb = f32.state_dict(), f64.state_dict(), stacked[i][0]
            rows.append({"client": i, "steps": steps, "float32_vs_float64": diff(s32, s64),
                         "stacked_vs_one_by_one": diff(sb, s32), "stacked_vs_float64": diff(sb, s64)})
        return rows
    return run
