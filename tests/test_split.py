"""Split learning: the split model's gradients equal the unsplit model's on one batch (through the
real messages, with a client missing a modality and per-sample masks), a session of several
batches trains like the unsplit model, the bytes it moves, the sequential hand-off, resume.

U-shaped split learning (the labels stay on the client) is tests/test_split_u.py; the toy problem
and transport both use are tests/split_helpers.py."""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.base import ServerContext
from mmfl.algorithms.split import ORDER, RoundMeter, SplitParams, SplitServer
from mmfl.algorithms.split_cut import ACT, GRAD, LABELS, batch_schedule, client_keys, is_client_key
from mmfl.config import TrainConfig
from mmfl.data.base import PRESENT
from mmfl.core.training import make_optimizer, model_tensors, seed_torch
from mmfl.errors import ConfigError
from mmfl.report import load_metrics

from helpers import experiment, run_config
from split_helpers import HOLDS, META, make_model, raw_config, setup, unsplit_loss


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


# ----------------------------------------------------------------------------- through the engine


def test_end_to_end_bytes_are_activations_labels_gradients_and_weights(tmp_path):
    raw = raw_config(tmp_path)
    raw["modalities"]["missing_rate"] = {"features": 0.25}  # client 0's samples: some lack 'features'
    exp = run_config(raw)
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
    exp = experiment(raw_config(tmp_path, train={"local_epochs": 1, "batch_size": 64}))
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
    full = run_config(raw_a)
    assert any(k.startswith("opt/") for k in full.server.state_dict())
    raw_b = raw_config(tmp_path / "b", rounds=2, algorithm=algo, train=train)
    run_config({**raw_b, "rounds": 1})
    run_config(raw_b, resume=True)
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
        experiment(raw)
