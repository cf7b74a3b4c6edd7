"""Behavioural mechanism checks (issue 26, item 1) of CreamFL: each test trains for real (a
short local round, or a whole federated round) with the mechanism on and compares with the same
run with its coefficient at 0 (or without it), from the same start and the same batches; it
fails when the mechanism is removed from *training*, not only from a function tested by hand.
FedCMI's and PartialFL's checks of the same kind are in tests/test_fedcmi.py and
tests/test_partialfl.py. The mutations each test kills are declared in
tests/mutations/behaviour.toml.

Margins: every assertion's measured values at seed 0 are in a comment beside it; the margins
were checked on 5 seeds (0-4) with ``python tests/test_mechanism_behaviour.py`` (the
``__main__`` block prints the values per seed)."""

from __future__ import annotations

import copy

import pytest
import torch

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.base import ClientContext
from mmfl.config import TrainConfig
from mmfl.core.message import Message
from mmfl.engine.runner import Experiment

from helpers import experiment

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
    """PAIR with run seed ``seed``; the server has trained ``SERVER_EPOCHS`` epochs on the public pairs, so
    its global representations pair image and features row by row better than chance."""
    raw = {**copy.deepcopy(PAIR), "seed": seed, "output_dir": str(tmp_path)}
    exp = experiment(raw)
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


# ----------------------------------------------------------------------------- CreamFL: GCA (eq. 4-6)


GCA_ROUNDS, GCA_SERVER_EPOCHS, GCA_LOCAL_EPOCHS = 2, 5, 3


def gca_round(tmp_path, seed: int = 0, aggregation: str = "gca") -> dict:
    """A real CreamFL run (PAIR, 2 rounds) in which one client (of 4, seeded) sends its public
    representations with the rows shuffled (``[attack] kind = "shuffle_reps"``). Records, through
    a wrapper around eq. 6's weighted sum, the per-sample weights ``[C, P]`` the server actually
    used for each modality in the last round: the malicious client's mean weight and the honest
    clients' mean weight over that modality's holders."""
    import mmfl.core.aggregation as core_aggregation

    raw = {**copy.deepcopy(PAIR), "seed": seed, "rounds": GCA_ROUNDS, "output_dir": str(tmp_path),
           "attack": {"kind": "shuffle_reps", "fraction": 0.25}}
    raw["algorithm"].update(aggregation=aggregation, server_public_epochs=GCA_SERVER_EPOCHS)
    raw["train"]["local_epochs"] = GCA_LOCAL_EPOCHS
    exp = experiment(raw)
    bad = exp.attack.clients
    fed = exp.federation
    used: list[torch.Tensor] = []
    orig = core_aggregation.per_sample_mean

    def weighted_sum(local, w, chunk=8192):
        used.append((local.clone(), w.detach().clone()))
        return orig(local, w, chunk)

    seen = []
    send = exp.transport.send

    def spy(route, messages):
        replies = send(route, messages)
        seen.append(replies)
        return replies

    exp.transport.send = spy
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core_aggregation, "per_sample_mean", weighted_sum)
        exp.run()
    replies = seen[-1]
    out = {"bad": bad}
    for local, w in used[-2:]:  # the last round: one call per modality
        m = next(m for m in exp.server.pair if any(
            torch.equal(local[0], replies[c].arrays.get("rep/" + m, torch.empty(0))) for c in replies))
        holders = [c for c in sorted(replies) if m in fed.modalities_of(c)]
        mean = w.mean(1)
        out[m] = {"bad": [float(mean[i]) for i, c in enumerate(holders) if c in bad],
                  "honest": [float(mean[i]) for i, c in enumerate(holders) if c not in bad]}
    return out


def test_creamfl_gca_gives_a_client_with_shuffled_public_reps_a_lower_weight_in_a_real_round(tmp_path):
    """Eq. 4-6 in the server: in a real round, the per-sample weights the server used to combine
    the clients' representations give the client whose rows are shuffled (right representations
    of the wrong samples) a lower mean weight than every honest client holding that modality."""
    r = gca_round(tmp_path)
    assert r["bad"] == [0]  # seed 0: the image+features client 0 is the malicious one
    for m in ("image", "features"):
        bad, honest = r[m]["bad"], r[m]["honest"]
        # seed 0: image 0.315 vs 0.352, 0.334; features 0.285 vs 0.354, 0.361 (uniform: 1/3);
        # seeds 0-4: the malicious client 0.019 to 0.10 below the lowest honest one
        assert bad and bad[0] < min(honest) - 0.01, r


# ----------------------------------------------------------------------------- CreamFL: a public set missing modalities


def filled_encode_present(orig):
    """``MultimodalModel.encode_present`` whose absent rows hold, instead of zeros, a
    representation that depends on the model and carries its gradient (the mean of the present
    rows' outputs plus a fixed offset per row): a term that reads an absent row then both changes
    in value and trains the model through it."""

    def encode_present(self, m, inputs, then=None):
        out = orig(self, m, inputs, then)
        rows = self.present_rows(m, inputs)
        if rows is None or int(rows.numel()) == 0:
            return out
        present = torch.zeros(out.shape[0], dtype=torch.bool, device=out.device)
        present[rows] = True
        idx = torch.arange(out.shape[0], dtype=out.dtype, device=out.device).unsqueeze(1)
        offset = torch.sin(0.7 * idx + torch.arange(out.shape[1], dtype=out.dtype, device=out.device))
        return torch.where(present.unsqueeze(1), out, out[rows].mean(0, keepdim=True) + offset)

    return encode_present


def masked_public_run(tmp_path, fill: bool) -> tuple[dict, list[dict]]:
    """A 1-round CreamFL run on mfeat_pair whose public set (and test set) lacks the first
    modality on ~20 % of its rows and the second on ~15 % (tests/test_missing_algos.py's
    ``mask_rows``), and whose clients lack features on 30 % of their rows and the image on 20 %.
    ``fill``: absent rows' representations from :func:`filled_encode_present`. Returns the
    server's final weights and the metric rows."""
    from test_missing_algos import CREAM, mask_rows, raw_config

    from mmfl.models.multimodal import MultimodalModel as Model
    from mmfl.report import load_metrics

    raw = raw_config(tmp_path / ("filled" if fill else "zeros"), "creamfl", **copy.deepcopy(CREAM))
    raw["algorithm"] = {"name": "creamfl", "server_batch_size": 64}
    raw["rounds"] = 1  # one round has every term: the clients' LCR, GCA, the distillation
    exp = experiment(raw)
    for i, name in enumerate(("test", "public")):
        mask_rows(getattr(exp.federation, name), seed=17 + i)
    with pytest.MonkeyPatch.context() as mp:
        if fill:
            mp.setattr(Model, "encode_present", filled_encode_present(Model.encode_present))
        exp.run()
    return {k: v.detach().clone() for k, v in exp.server.model.state_dict().items()}, load_metrics(exp.run_dir)


def test_creamfl_absent_public_rows_never_enter_lcr_gca_or_distillation(tmp_path):
    """A public set missing a modality on some rows: whatever representation an absent row holds
    (zeros, or a value that depends on the model and carries its gradient), the run trains
    bit for bit the same. The LCR terms (eq. 1-2: anchors and candidates holding the modality),
    GCA's candidates (eq. 4) and the distillation MSE (eq. 7) read present rows only."""
    a, rows_a = masked_public_run(tmp_path, fill=False)
    b, rows_b = masked_public_run(tmp_path, fill=True)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    keep = lambda rs: [{k: v for k, v in r.items() if "time" not in k and "bytes" not in k}  # noqa: E731
                       for r in rs]
    assert keep(rows_a) == keep(rows_b)


if __name__ == "__main__":  # the margins on 5 seeds
    import sys
    import tempfile

    torch.set_num_threads(1)
    from test_fedcmi import cmi_reading
    from test_partialfl import pfl_exp, pfl_reading

    which = sys.argv[1:] or ["inter", "intra", "cmi", "gca", "pfl"]
    for seed in range(5):
        if "pfl" in which:
            with tempfile.TemporaryDirectory() as d:
                r = pfl_reading(pfl_exp(d, seed))
                print(seed, "pfl", {k: {a: round(b, 3) for a, b in v.items()} for k, v in r.items()}, flush=True)
        if "gca" in which:
            with tempfile.TemporaryDirectory() as d:
                print(seed, "gca", gca_round(d, seed), flush=True)
        if "cmi" in which:
            r = cmi_reading(seed)
            print(seed, "cmi", r["weak"], [round(t, 3) for t in r["t_class"]], [round(x, 4) for x in r["ratio"]])
        if not set(which) & {"inter", "intra"}:
            continue
        with tempfile.TemporaryDirectory() as d:
            exp = creamfl_exp(d, seed)
            for w in (w for w in which if w in ("inter", "intra")):
                print(seed, w, {k: round(v, 3) for k, v in globals()[w + "_reading"](exp).items()}, flush=True)
