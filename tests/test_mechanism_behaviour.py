"""Behavioural mechanism checks (issue 26, item 1): each test trains for real (a short local
round, or a whole federated round) with the mechanism on and compares with the same run with
its coefficient at 0 (or without it), from the same start and the same batches; it fails when
the mechanism is removed from *training*, not only from a function tested by hand. The
mutations each test kills are declared in tests/mutations/behaviour.toml.

Margins: every assertion's measured values at seed 0 are in a comment beside it; the margins
were checked on 5 seeds (0-4) with ``python tests/test_mechanism_behaviour.py`` (the
``__main__`` block prints the values per seed)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.base import ClientContext
from mmfl.config import TrainConfig, resolve
from mmfl.core.message import Message
from mmfl.engine.runner import Experiment

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def client_ctx(exp: Experiment, cid: int, train: TrainConfig, rnd: int = 0) -> ClientContext:
    """Client ``cid`` of an experiment's federation, its model built as the engine builds it
    (one model per key), with the training settings ``train``."""
    fed = exp.federation
    holds = tuple(fed.modalities_of(cid))
    pool: dict = {}

    def model_pool(key):
        if key not in pool:
            pool[key] = exp.make_model(holds)
        return pool[key]

    return ClientContext(cid=cid, rnd=rnd, seed=7, data=fed.clients[cid], test_data=None, meta=fed.meta,
                         train=train, state={}, model_pool=model_pool, init_model=lambda: exp.make_model(holds),
                         modalities=holds, public=fed.public)


# ----------------------------------------------------------------------------- CreamFL: LCR (eq. 1-3)

# mfeat_pair (image [1, 16, 15] + features): a public share of 30 %; clients 0-1 hold both
# modalities, client 2 only the image, client 3 only the features
PAIR = {"name": "pair", "rounds": 1, "seed": 0, "threads": 1,
        "data": {"name": "mfeat_pair", "public_fraction": 0.3}, "partition": {"name": "iid", "num_clients": 4},
        "modalities": {"name": "explicit",
                       "holds": [["image", "features"], ["image", "features"], ["image"], ["features"]]},
        "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
        "algorithm": {"name": "creamfl", "server_batch_size": 64, "server_lr": 0.01,
                      "server_lr_schedule": "constant"},
        "train": {"local_epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.003}}

LCR_TRAIN = TrainConfig(optimizer="adam", local_epochs=3, batch_size=64, lr=0.003, weight_decay=0.0)


SERVER_EPOCHS = 5


def creamfl_exp(tmp_path, seed: int = 0) -> Experiment:
    """PAIR with run seed ``seed``; the server has trained two epochs on the public pairs, so its
    global representations already pair image and features row by row."""
    raw = {**copy.deepcopy(PAIR), "seed": seed, "output_dir": str(tmp_path)}
    exp = Experiment(resolve(raw), progress=False)
    for r in range(SERVER_EPOCHS):
        exp.server.train_public(r)
    return exp


def lcr_client_reps(exp: Experiment, cid: int, **params) -> tuple[dict, dict, dict]:
    """One local round of CreamFL client ``cid`` (``LCR_TRAIN``) from the run's initial weights,
    with the server's global representations of the public set: (the client's public
    representations before, after, the global ones)."""
    from mmfl.algorithms.creamfl_client import CreamFLClient
    from mmfl.algorithms.creamfl_terms import GLOBAL, MODEL, public_reps

    server = exp.server
    glob = public_reps(server.model, server.public, server.pair)
    ctx = client_ctx(exp, cid, LCR_TRAIN)
    client = CreamFLClient(ALGORITHMS.params("creamfl", params), ctx)
    held = [m for m in server.pair if m in ctx.modalities]
    before = public_reps(ctx.init_model(), server.public, held)
    msg = Message(arrays={GLOBAL + m: glob[m] for m in server.needs(ctx.modalities)})
    torch.manual_seed(0)  # as the engine seeds torch before a client's call
    client.handle("train", msg)
    model = ctx.model("local")
    model.load_state_dict({k[len(MODEL):]: v for k, v in ctx.state.items() if k.startswith(MODEL)})
    return before, public_reps(model, server.public, held), glob


def contrast(z: torch.Tensor, target: torch.Tensor) -> float:
    """How much row i of ``z`` is closer (cosine) to row i of ``target`` than to the other rows:
    mean_i [z_i . t_i - mean_{j != i} z_i . t_j] (unit rows)."""
    sim = z @ target.t()
    pos = sim.diagonal()
    return float((pos - (sim.sum(1) - pos) / (sim.shape[0] - 1)).mean())


def rank_fraction(z: torch.Tensor, target: torch.Tensor) -> float:
    """mean_i of the fraction of rows j of ``target`` closer to z_i than t_i (0: every z_i finds
    its own t_i first; about 0.5: unrelated)."""
    sim = z @ target.t()
    return float((sim > sim.diagonal().unsqueeze(1)).float().mean())


def inter_reading(exp: Experiment, cid: int = 2) -> dict[str, float]:
    """Eq. 1 on the image-only client 2: its image representation of public pair i against the
    server's global *features* representations of every pair, after a local round with
    gamma = 0.5 (inter only) and with gamma = 0."""
    out = {}
    for name, gamma in (("on", 0.5), ("off", 0.0)):
        _, after, glob = lcr_client_reps(exp, cid, inter=True, intra=False, gamma=gamma)
        out[name] = contrast(after["image"], glob["features"])
        out[name + "_rank"] = rank_fraction(after["image"], glob["features"])
    return out


def test_creamfl_inter_term_moves_a_clients_image_reps_toward_the_global_reps_of_the_same_pair(tmp_path):
    """Eq. 1 in training: after a local round with the inter-modal term, the image-only client's
    representation of public pair i is closer to the server's global features representation
    of pair i, relative to the other pairs', than after the same round with gamma = 0."""
    r = inter_reading(creamfl_exp(tmp_path))
    # seed 0: contrast 0.132 vs 0.008, rank fraction 0.335 vs 0.486; seeds 0-4: contrast +0.11 to
    # +0.23 over gamma = 0, rank fraction 0.11 to 0.21 lower
    assert r["on"] > r["off"] + 0.08, r
    assert r["on_rank"] < r["off_rank"] - 0.08, r


def intra_reading(exp: Experiment, cid: int = 2) -> dict[str, float]:
    """Eq. 2 on client 2: mean_i cos(z_i, g_i) - cos(z_i, p_i), g_i the server's global image
    representation of public sample i, p_i the client's own at the start of the round, after a
    local round with gamma = 0.5 (intra only) and with gamma = 0."""
    out = {}
    for name, gamma in (("on", 0.5), ("off", 0.0)):
        before, after, glob = lcr_client_reps(exp, cid, inter=False, intra=True, gamma=gamma)
        z = after["image"]
        out[name] = float(((z * glob["image"]).sum(-1) - (z * before["image"]).sum(-1)).mean())
    return out


def test_creamfl_intra_term_moves_a_clients_reps_toward_the_global_reps_away_from_its_own(tmp_path):
    """Eq. 2 in training: after a local round with the intra-modal term, the image-only client's
    representation of public sample i is closer to the server's global image representation of
    i than to its own representation at the start of the round, by more than with gamma = 0.
    (Eq. 2 contrasts g_i with p_i only, not with the other samples: the reading is its own.)"""
    r = intra_reading(creamfl_exp(tmp_path))
    # seed 0: 0.535 vs -0.146; seeds 0-4: +0.36 to +1.13 over gamma = 0
    assert r["on"] > r["off"] + 0.2, r


def test_creamfl_gamma_zero_trains_exactly_as_no_lcr(tmp_path):
    """Eq. 3 with gamma = 0 is the private task alone: the client trains exactly as with both LCR
    terms off (before, gamma = 0 still ran a public pass of zero-gradient Adam steps after each
    epoch, which moved the model along the private task's momentum)."""
    exp = creamfl_exp(tmp_path)
    _, zero, _ = lcr_client_reps(exp, 2, gamma=0.0)
    _, off, _ = lcr_client_reps(exp, 2, inter=False, intra=False)
    assert torch.equal(zero["image"], off["image"])


if __name__ == "__main__":  # the margins on 5 seeds
    import sys
    import tempfile

    torch.set_num_threads(1)
    which = sys.argv[1:] or ["inter", "intra"]
    for seed in range(5):
        with tempfile.TemporaryDirectory() as d:
            exp = creamfl_exp(d, seed)
            for w in which:
                print(seed, w, {k: round(v, 3) for k, v in globals()[w + "_reading"](exp).items()}, flush=True)
