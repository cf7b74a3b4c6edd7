"""U-shaped split learning (``split_learning_u``): the client keeps the head as well as the
encoders, so the labels never leave it; its gradients equal the unsplit model's on one batch, a
session trains like the unsplit model, it runs under private labels where vanilla split learning
is refused, and it needs server-side parameters. Vanilla split learning: tests/test_split.py."""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.algorithms.base import ServerContext
from mmfl.algorithms.split import GRAD_REP, ORDER, REP, ZREP, RoundMeter, SplitParams, SplitServer
from mmfl.algorithms.split_cut import ACT, GRAD, LABELS, batch_schedule, client_keys, is_client_key
from mmfl.config import TrainConfig
from mmfl.data.base import PRESENT
from mmfl.core.training import make_optimizer, model_tensors
from mmfl.errors import ConfigError
from mmfl.models.multimodal import MultimodalModel
from mmfl.report import load_metrics

from helpers import run_config
from split_helpers import HOLDS, META, make_model, raw_config, setup, unsplit_loss


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
        run_config(raw)

    raw = raw_config(tmp_path / "u", algo="split_learning_u", privacy=privacy, model={
        "name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16], "dropout": 0.0})
    exp = run_config(raw)
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
