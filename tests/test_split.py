"""Split learning: the split model's gradients equal the unsplit model's on one batch (through the
real messages, with a client missing a modality and per-sample masks), a session of several
batches trains like the unsplit model, the bytes it moves, the sequential hand-off, resume."""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.base import ClientContext, ServerContext
from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams
from mmfl.algorithms.split import GRAD_REP, ORDER, REP, ZREP, RoundMeter, SplitClient, SplitParams, SplitServer
from mmfl.algorithms.split_cut import ACT, GRAD, LABELS, batch_schedule, client_keys, is_client_key
from mmfl.config import TrainConfig, resolve
from mmfl.data.base import PRESENT, ArrayDataset, DatasetMeta
from mmfl.engine.runner import Experiment
from mmfl.core.training import make_optimizer, model_tensors, seed_torch
from mmfl.errors import ConfigError
from mmfl.models.multimodal import MultimodalModel
from mmfl.report import load_metrics

META = DatasetMeta("toy", 3, {"features": (10,), "image": (1, 8, 8)})
HOLDS = [("features", "image"), ("image",)]


def make_model(dropout=0.3, two_projector=False):
    torch.manual_seed(0)
    return MultimodalModel(dict(META.modalities), META.num_classes, feat_dim=6, cnn_channels=[4], mlp_hidden=[8],
                           dropout=dropout, two_projector=two_projector)


def toy_data(n=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    present = torch.ones(n, dtype=torch.bool)
    present[[1, 4, 5]] = False  # three samples lack 'features'
    feats = {"image": torch.randn(n, 1, 8, 8, generator=g), "features": torch.randn(n, 10, generator=g),
             PRESENT + "features": present}
    return ArrayDataset(feats, torch.randint(0, 3, (n,), generator=g))


class DirectTransport:
    """Delivers each message to the client's handler in this process, with a persistent state per
    client (what the engine's store does), and records every (route, message, reply)."""

    def __init__(self, data, train, pools, params=None):
        self.num_clients = len(data)
        self.params = params
        self.data, self.train, self.pools = data, train, pools
        self.states = {cid: {} for cid in data}
        self.log = []

    def send(self, route, messages):
        out = {}
        for cid, msg in messages.items():
            ctx = ClientContext(cid=cid, rnd=0, seed=1000 + len(self.log), data=self.data[cid], test_data=None,
                                meta=META, train=self.train, state=dict(self.states[cid]),
                                model_pool=lambda key, c=cid: self.pools[c], modalities=HOLDS[cid])
            seed_torch(ctx.seed)
            reply = SplitClient(self.params, ctx).handle(route, msg)
            self.log.append((cid, route, msg, reply, dict(ctx.state)))
            self.states[cid] = ctx.state
            out[cid] = reply
        return out


def setup(train, data=None, dropout=0.3, **params):
    data = data or toy_data()
    datas = {0: data, 1: data.with_features(["image"])}
    params = SplitParams(**params)
    server = SplitServer(params, ServerContext(META, train, seed=0, num_clients=2,
                                               make_model=lambda: make_model(dropout), client_modalities=HOLDS))
    pools = {c: make_model(dropout).keep_only(HOLDS[c]) for c in (0, 1)}
    for p in pools.values():  # the pooled models start from other weights: the session must load them
        with torch.no_grad():
            for t in p.parameters():
                t.add_(1.0)
    return server, DirectTransport(datas, train, pools, params), datas


def unsplit_loss(model, out, labels):
    """MFedAvg's local objective (``MultimodalClient.loss``: joint cross-entropy + linear probes)
    on the unsplit model's output ``out = model(inputs)``."""
    client = MFedAvgClient(MFedAvgParams(), None)
    return client.task_loss(model, out, labels) + client.probe_loss(model, out, labels)


# ----------------------------------------------------------------------------- gradients, one batch


@pytest.mark.parametrize("cid", [0, 1], ids=["both-modalities-with-masks", "image-only"])
def test_split_gradients_equal_the_unsplit_model_on_one_batch(cid):
    train = TrainConfig(optimizer="sgd", local_epochs=1, batch_size=64, lr=0.05, momentum=0.9, weight_decay=1e-4)
    server, transport, datas = setup(train)
    ref = make_model().keep_only(HOLDS[cid])  # the unsplit model this client would train
    ref.load_state_dict({k: v for k, v in server.model.state_dict().items() if k in ref.state_dict()})
    server.session(0, cid, transport, RoundMeter(), [])

    routes = [r for _, r, *_ in transport.log]
    assert routes == ["sl_begin", "sl_forward", "sl_backward", "sl_end"]
    _, _, begin, _, state = transport.log[0]
    assert sorted(begin.arrays) == sorted(client_keys(model_tensors(ref), HOLDS[cid]))  # only its modules
    inputs, labels = datas[cid].get(state[ORDER][0])
    fwd, grads = transport.log[1][3], transport.log[2][2]
    assert torch.equal(fwd.arrays[LABELS], labels)

    ref.train()
    seed_torch(server.batch_seed(0, cid, 0))  # the server's dropout draw
    out = ref(inputs)
    loss = unsplit_loss(ref, out, labels)
    loss.backward()

    # what crossed the cut: the activations of the rows holding each modality, and their gradients
    for m in HOLDS[cid]:
        mask = inputs.get(PRESENT + m)
        rows = mask if mask is not None else torch.ones(labels.shape[0], dtype=torch.bool)
        assert torch.allclose(fwd.arrays[ACT + m], out["mod_reps"][m][rows], atol=1e-6)
        assert (PRESENT + m in fwd.arrays) == (mask is not None)
        assert grads.arrays[GRAD + m].shape == (int(rows.sum()), 6)
    if cid == 0:
        assert int(fwd.arrays[PRESENT + "features"].sum()) < labels.shape[0]

    # every parameter's gradient: client side on the pooled model, server side on the server's model
    client_grads = dict(transport.pools[cid].named_parameters())
    server_grads = dict(server.model.named_parameters())
    checked = 0
    for name, p in ref.named_parameters():
        got = (client_grads if is_client_key(name) else server_grads)[name].grad
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        assert got is not None and torch.allclose(got, want, atol=1e-6), name
        checked += 1
    assert checked == len(list(ref.parameters()))
    if cid == 1:  # the branch it lacks got no gradient on the server
        assert server_grads["heads.features.weight"].grad is None

    # after the step: the uploaded client-side weights (BatchNorm statistics updated once) and the
    # server's side equal one optimizer step of the unsplit model
    opt = make_optimizer(ref.parameters(), train)
    opt.step()
    end = transport.log[3][3]
    for k, v in ref.state_dict().items():
        got = end.arrays[k] if is_client_key(k) else server.model.state_dict()[k]
        assert torch.allclose(got.to(v.dtype), v, atol=1e-6), k
    assert transport.states[cid] == {}  # the session leaves nothing behind


# ----------------------------------------------------------------------------- several batches


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_session_trains_like_the_unsplit_model(optimizer):
    """Several batches (2 epochs of 3): optimizer state and BatchNorm statistics carried between
    messages in ctx.state; the result equals local training of the unsplit model on those batches."""
    train = TrainConfig(local_epochs=2, batch_size=5, lr=0.05, momentum=0.9, weight_decay=1e-4, optimizer=optimizer)
    server, transport, datas = setup(train)
    ref = make_model()
    ref.load_state_dict(server.model.state_dict())
    losses = []
    server.session(0, 0, transport, RoundMeter(), losses)
    order = transport.log[0][4][ORDER]
    sched = batch_schedule(12, 5, 2)
    assert [b[2] - b[1] for b in sched] == [5, 5, 2, 5, 5, 2] and len(losses) == 6

    ref.train()
    opt = make_optimizer(ref.parameters(), train)
    ref_losses = []
    for i, (e, s, stop) in enumerate(sched):
        inputs, labels = datas[0].get(order[e, s:stop])
        opt.zero_grad(set_to_none=True)
        seed_torch(server.batch_seed(0, 0, i))
        loss = unsplit_loss(ref, ref(inputs), labels)
        loss.backward()
        opt.step()
        ref_losses.append(float(loss.detach()))
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    for k, v in ref.state_dict().items():
        assert torch.allclose(server.model.state_dict()[k].to(v.dtype), v, atol=1e-5), k


# ----------------------------------------------------------------------------- U-shaped


@pytest.mark.parametrize("cid", [0, 1], ids=["both-modalities-with-masks", "image-only"])
def test_u_shaped_gradients_equal_the_unsplit_model_and_labels_stay(cid):
    """U-shaped: the encoders' outputs go up without labels, the fusion output comes down, the
    client's d loss / d rep goes up, the encoder gradients come down; every parameter's
    gradient and the step equal the unsplit model's (dropout 0: the client draws it)."""
    train = TrainConfig(optimizer="sgd", local_epochs=1, batch_size=64, lr=0.05, momentum=0.9, weight_decay=1e-4)
    server, transport, datas = setup(train, dropout=0.0, u_shaped=True)
    ref = make_model(0.0).keep_only(HOLDS[cid])
    ref.load_state_dict({k: v for k, v in server.model.state_dict().items() if k in ref.state_dict()})
    losses = []
    server.session(0, cid, transport, RoundMeter(), losses)

    routes = [r for _, r, *_ in transport.log]
    assert routes == ["sl_begin", "sl_forward", "sl_tail", "sl_backward", "sl_end"]
    begin = transport.log[0][2]
    assert sorted(begin.arrays) == sorted(client_keys(model_tensors(ref), HOLDS[cid], u_shaped=True))
    assert {k.split(".")[0] for k in begin.arrays} == {"encoders", "classifier", "heads"}
    state = transport.log[0][4]
    inputs, labels = datas[cid].get(state[ORDER][0])
    fwd, tail_down, tail_up, grads = (transport.log[1][3], transport.log[2][2], transport.log[2][3],
                                      transport.log[3][2])
    for _, _, _, reply, _ in transport.log:  # no reply carries the labels
        assert LABELS not in reply.arrays
        assert all(not torch.equal(v.reshape(-1).to(labels.dtype), labels) for v in reply.arrays.values()
                   if v.numel() == labels.numel())

    ref.train()
    out = ref(inputs)
    loss = unsplit_loss(ref, out, labels)
    loss.backward()
    assert losses == pytest.approx([float(loss.detach())], abs=1e-6)
    for m in HOLDS[cid]:
        mask = inputs.get(PRESENT + m)
        rows = mask if mask is not None else torch.ones(labels.shape[0], dtype=torch.bool)
        assert torch.allclose(fwd.arrays[ACT + m], out["mod_feats"][m][rows], atol=1e-6)
        assert torch.allclose(tail_down.arrays[ZREP + m], out["mod_reps"][m][rows], atol=1e-6)
        assert grads.arrays[GRAD + m].shape == fwd.arrays[ACT + m].shape
    assert torch.allclose(tail_down.arrays[REP], out["rep"], atol=1e-6)
    assert tail_up.arrays[GRAD_REP].shape == out["rep"].shape

    client_grads = dict(transport.pools[cid].named_parameters())
    server_grads = dict(server.model.named_parameters())
    for name, p in ref.named_parameters():
        side = client_grads if is_client_key(name, u_shaped=True) else server_grads
        assert (side is server_grads) == (name.split(".")[0] in ("proj", "fusion")), name
        got, want = side[name].grad, (p.grad if p.grad is not None else torch.zeros_like(p))
        assert got is not None and torch.allclose(got, want, atol=1e-6), name

    opt = make_optimizer(ref.parameters(), train)
    opt.step()
    end = transport.log[4][3]
    for k, v in ref.state_dict().items():
        got = end.arrays[k] if is_client_key(k, u_shaped=True) else server.model.state_dict()[k]
        assert torch.allclose(got.to(v.dtype), v, atol=1e-6), k
    assert transport.states[cid] == {}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_u_shaped_session_trains_like_the_unsplit_model(optimizer):
    train = TrainConfig(local_epochs=2, batch_size=5, lr=0.05, momentum=0.9, weight_decay=1e-4, optimizer=optimizer)
    server, transport, datas = setup(train, dropout=0.0, u_shaped=True)
    ref = make_model(0.0)
    ref.load_state_dict(server.model.state_dict())
    losses = []
    server.session(0, 0, transport, RoundMeter(), losses)
    order = transport.log[0][4][ORDER]
    ref.train()
    opt = make_optimizer(ref.parameters(), train)
    ref_losses = []
    for e, s, stop in batch_schedule(12, 5, 2):
        inputs, labels = datas[0].get(order[e, s:stop])
        opt.zero_grad(set_to_none=True)
        loss = unsplit_loss(ref, ref(inputs), labels)
        loss.backward()
        opt.step()
        ref_losses.append(float(loss.detach()))
    assert len(losses) == 6 and losses == pytest.approx(ref_losses, abs=1e-5)
    for k, v in ref.state_dict().items():
        assert torch.allclose(server.model.state_dict()[k].to(v.dtype), v, atol=1e-5), k


def test_u_shaped_runs_under_private_labels_where_vanilla_is_refused(tmp_path):
    """With ``[privacy] labels = "private"`` the engine refuses vanilla split learning's first
    labelled upload; the U-shaped variant trains, and its bytes are the cut tensors both ways."""
    privacy = {"default": "shareable", "labels": "private"}
    raw = raw_config(tmp_path / "v", privacy=privacy)
    with pytest.raises(Exception, match="label"):
        Experiment(resolve(raw), progress=False).run()

    raw = raw_config(tmp_path / "u", algo="split_learning_u", privacy=privacy, model={
        "name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16], "dropout": 0.0})
    exp = Experiment(resolve(raw), progress=False)
    exp.run()
    row = load_metrics(tmp_path / "u" / "split_learning_u")[-1]
    assert math.isfinite(row["accuracy"]) and row["accuracy"] > 0.2
    batches = up_acts = 0
    for cid, data in enumerate(exp.federation.clients):
        sched = batch_schedule(len(data), 64, 2)
        batches += len(sched)
        for m in exp.federation.modalities_of(cid):
            up_acts += exp.server.model.encoders[m](data.get()[0][m][:2]).shape[1] * len(data) * 2 * 4
    by_route = row["bytes_by_route"]
    assert by_route["sl_forward"] == {"down": 8 * batches, "up": up_acts + 8 * batches}  # + the batch size
    assert by_route["sl_backward"] == {"down": up_acts, "up": 0}
    n_rows = sum(len(d) for d in exp.federation.clients) * 2
    assert by_route["sl_tail"]["up"] == n_rows * exp.server.model.fusion_out_dim * 4 + 8 * batches  # + the loss
    assert row["messages"] == 2 * (3 * 2 + 3 * batches) and row["steps"] == batches


def test_u_shaped_needs_server_side_parameters():
    ctx = ServerContext(META, TrainConfig(), 0, 1, lambda: MultimodalModel(
        dict(META.modalities), 3, feat_dim=6, cnn_channels=[4], mlp_hidden=[8], projector="none"))
    with pytest.raises(ConfigError, match="no parameters"):
        SplitServer(SplitParams(u_shaped=True), ctx)
    SplitServer(SplitParams(), ctx)  # vanilla: the classifier is the server's


# ----------------------------------------------------------------------------- through the engine


def raw_config(tmp_path, algo="split_learning", **over):
    """mfeat_pair (image [1,16,15] + features): client 0 holds both, 1 the image, 2 the features."""
    raw = {"name": algo, "rounds": 1, "seed": 0, "output_dir": str(tmp_path), "threads": 1,
           "data": {"name": "mfeat_pair"},
           "partition": {"name": "iid", "num_clients": 3},
           "modalities": {"name": "explicit", "holds": [["image", "features"], ["image"], ["features"]]},
           "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
           "algorithm": {"name": algo},
           "train": {"optimizer": "sgd", "lr": 0.01, "local_epochs": 2, "batch_size": 64}}
    raw.update(over)
    return raw


def test_end_to_end_bytes_are_activations_labels_gradients_and_weights(tmp_path):
    raw = raw_config(tmp_path)
    raw["modalities"]["missing_rate"] = {"features": 0.25}  # client 0's samples: some lack 'features'
    exp = Experiment(resolve(raw), progress=False)
    exp.run()
    row = load_metrics(tmp_path / "split_learning")[-1]
    assert math.isfinite(row["accuracy"]) and row["accuracy"] > 0.2
    assert math.isfinite(row["accuracy/image"]) and math.isfinite(row["accuracy/features"])
    assert row["bytes_per_epoch"] > 0 and row["bytes_per_epoch"] * 2 == row["bytes_up"] + row["bytes_down"]

    d, epochs, bs = 8, 2, 64
    act_up = label_up = mask_up = batches = weights = 0
    own = model_tensors(exp.server.model)
    for cid, data in enumerate(exp.federation.clients):
        n = len(data)
        sched = batch_schedule(n, bs, epochs)
        assert sum(stop - s for _, s, stop in sched) == n * epochs  # no batch of one skipped here
        inputs, _ = data.get()
        for m in exp.federation.modalities_of(cid):
            mask = inputs.get(PRESENT + m)
            act_up += (n if mask is None else int(mask.sum())) * epochs * d * 4  # rows holding m
            mask_up += 0 if mask is None else n * epochs  # one bool per sample
        label_up += n * epochs * 8  # int64 labels
        batches += len(sched)
        weights += sum(own[k].numel() * own[k].element_size()
                       for k in client_keys(own, exp.federation.modalities_of(cid)))
    assert mask_up > 0  # the masks of client 0's data crossed too
    by_route = row["bytes_by_route"]
    assert by_route["sl_forward"] == {"down": 8 * batches, "up": act_up + label_up + mask_up}
    assert by_route["sl_backward"] == {"down": act_up, "up": 0}  # a gradient per activation
    assert by_route["sl_begin"] == {"down": weights, "up": 16 * 3}
    assert by_route["sl_end"] == {"down": 0, "up": weights}
    assert row["messages"] == 2 * (3 * 2 + 2 * batches) and row["steps"] == batches


def test_sequential_hand_off(tmp_path):
    exp = Experiment(resolve(raw_config(tmp_path, train={"local_epochs": 1, "batch_size": 64})), progress=False)
    sent = []
    send = exp.transport.send

    def spy(route, messages):
        replies = send(route, messages)
        for cid in messages:
            sent.append((route, cid, messages[cid], replies.get(cid)))
        return replies

    exp.transport.send = spy
    exp.run()
    cohort_order = [cid for route, cid, *_ in sent if route == "sl_begin"]
    assert len(cohort_order) == 3
    ends = [(cid, reply) for route, cid, _, reply in sent if route == "sl_end"]
    begins = {cid: msg for route, cid, msg, _ in sent if route == "sl_begin"}
    # each client receives only its own modalities' encoders and projectors
    for cid, msg in begins.items():
        holds = exp.federation.modalities_of(cid)
        assert {k.split(".")[1] for k in msg.arrays} == set(holds)
        assert all(k.split(".")[0] in ("encoders", "proj") for k in msg.arrays)
    # the server's client-side weights are the last upload of each module; a client receives what
    # the previous holder of its modality uploaded
    last = {}
    for i, (cid, reply) in enumerate(ends):
        for k, v in begins[cid].arrays.items():
            if k in last:
                assert torch.equal(v, last[k])
        last.update(reply.arrays)
    own = exp.server.model.state_dict()
    assert set(last) == {k for k in own if is_client_key(k)}
    for k, v in last.items():
        assert torch.equal(own[k], v), k


def test_resume_continues_exactly(tmp_path):
    algo = {"name": "split_learning", "persistent_server_optimizer": True}
    train = {"local_epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.001}
    raw_a = raw_config(tmp_path / "a", rounds=2, algorithm=algo, train=train)
    full = Experiment(resolve(raw_a), progress=False)
    full.run()
    assert any(k.startswith("opt/") for k in full.server.state_dict())
    raw_b = raw_config(tmp_path / "b", rounds=2, algorithm=algo, train=train)
    Experiment(resolve({**raw_b, "rounds": 1}), progress=False).run()
    Experiment(resolve(raw_b), progress=False).run(resume=True)
    a, b = load_metrics(tmp_path / "a" / "split_learning"), load_metrics(tmp_path / "b" / "split_learning")
    keys = ("accuracy", "train_loss", "bytes_up", "bytes_per_epoch")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


# ----------------------------------------------------------------------------- config


def test_params_and_model_are_checked(tmp_path):
    assert "split_learning" in ALGORITHMS
    with pytest.raises(ConfigError, match="algorithm.probe"):
        SplitParams(probe="yes")
    ctx = ServerContext(META, TrainConfig(), 0, 1, lambda: make_model(two_projector=True))
    with pytest.raises(ConfigError, match="model.two_projector"):
        SplitServer(SplitParams(), ctx)
    raw = raw_config(tmp_path, model={"name": "mlp"}, modalities={"name": "all"})
    with pytest.raises(ConfigError, match="multimodal"):
        Experiment(resolve(raw), progress=False)
