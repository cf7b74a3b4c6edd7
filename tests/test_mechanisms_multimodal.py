"""Mechanism checks (docs/mechanisms.md) of the multimodal FedAvg family: MFedAvg's per-module
weights, MFedProx's proximal term, FedIoT's multimodal weight, MFedProto's prototypes (FedProto,
Tan et al. 2022) and FedPMR's prototype rebalancing (PMR, Fan et al. 2023)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mmfl.algorithms.base import ServerContext
from mmfl.config import TrainConfig
from mmfl.data.base import PRESENT
from mmfl.core.message import Message
from mmfl.core.training import load_into, state_of
from mmfl.models.multimodal import branch_of

from helpers import experiment, run_config
from mechanism_helpers import META, SGD, ctx_for, float_keys, hand_weighted_mean, spy_replies, tiny_mm, tiny_mm_data


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- MFedAvg / MFedProx / FedIoT


def mm_raw(tmp_path, algorithm="mfedavg", rounds=1, **algo):
    """mfeat pix + fou, case D: 4 clients holding fou / pix+fou / pix+fou / pix, 20 % of fou missing."""
    return {"name": algorithm, "rounds": rounds, "output_dir": str(tmp_path), "threads": 1, "case": "D",
            "data": {"name": "mfeat", "views": ["pix", "fou"]}, "partition": {"num_clients": 4},
            "modalities": {"missing_rate": {"fou": 0.2}},
            "model": {"name": "multimodal", "feat_dim": 8, "mlp_hidden": [16]},
            "algorithm": {"name": algorithm, **algo}, "train": {"local_epochs": 1, "batch_size": 64}}


def test_mfedavg_a_unimodal_client_never_changes_the_other_modalitys_modules(tmp_path):
    exp = experiment(mm_raw(tmp_path))
    holds = exp.federation.client_modalities
    pix_only = holds.index(("pix",))
    before = {k: v.clone() for k, v in exp.server.model.state_dict().items()}
    exp.transport.begin_round(0)
    exp.server.round(0, [pix_only], exp.transport)
    after = exp.server.model.state_dict()
    fou = [k for k in after if branch_of(k) == "fou"]
    pix = [k for k in float_keys(after) if branch_of(k) == "pix" and not k.startswith("heads.")]
    assert fou and pix
    assert all(torch.equal(after[k], before[k]) for k in fou)  # exactly: nobody sent them
    assert all(not torch.equal(after[k], before[k]) for k in pix)  # the client's own modality moved
    assert not torch.equal(after["classifier.weight"], before["classifier.weight"])


def test_mfedavg_module_is_averaged_over_its_holders_weighted_by_their_samples_with_that_modality(tmp_path):
    exp = experiment(mm_raw(tmp_path))
    fed = exp.federation
    seen = spy_replies(exp)
    exp.run()
    (_, _, replies), = seen
    cids = sorted(replies)
    assert len(cids) == 4

    def count(c, m):  # samples of client c holding modality m (its per-sample mask, else all)
        feats, _ = fed.clients[c].get()
        if m not in fed.modalities_of(c):
            return 0
        return int(feats[PRESENT + m].sum()) if PRESENT + m in feats else len(fed.clients[c])

    for c in cids:
        assert replies[c].scalars["num_modalities"] == len(fed.modalities_of(c))
    new = exp.server.model.state_dict()
    checked = 0
    for k in float_keys(new):
        m = branch_of(k)
        holders = [c for c in cids if k in replies[c].arrays]
        weights = [count(c, m) if m is not None else len(fed.clients[c]) for c in holders]
        assert holders == [c for c in cids if m is None or m in fed.modalities_of(c)]
        hand = hand_weighted_mean([replies[c].arrays[k] for c in holders], weights)
        assert torch.allclose(new[k].double(), hand, atol=1e-6), k
        checked += m == "fou"
    assert checked > 0
    # fou is missing on some samples of the multimodal clients: the fou weights are not the data sizes
    assert any(0 < count(c, "fou") < len(fed.clients[c]) for c in cids)


def test_mfedprox_proximal_gradient_is_mu_times_the_distance_and_skips_the_probe_heads():
    from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams, MFedProxClient, MFedProxParams

    model = tiny_mm()
    data = tiny_mm_data(12)
    inputs, labels = data.get()
    g = torch.Generator().manual_seed(3)
    anchor = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in state_of(model).items()}
    msg = Message(arrays=anchor)

    def grads(client):
        model.zero_grad()
        client.loss(model, inputs, labels, msg).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    mu = 0.7
    plain = grads(MFedAvgClient(MFedAvgParams(), SimpleNamespace()))
    prox = grads(MFedProxClient(MFedProxParams(mu=mu), SimpleNamespace()))
    for n, p in model.named_parameters():
        want = torch.zeros_like(p) if n.startswith("heads.") else mu * (p.detach() - anchor[n])
        assert torch.allclose(prox[n] - plain[n], want, atol=1e-5), n


def test_mfedprox_with_mu_zero_equals_mfedavg(tmp_path):
    avg = run_config(mm_raw(tmp_path / "a"))
    prox = experiment(mm_raw(tmp_path / "p", "mfedprox", mu=0.0))
    prox.run()
    a, b = avg.server.model.state_dict(), prox.server.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _mm_replies(model_a_b, model_a):
    """A multimodal client (3 samples, b missing on one) and a uni-modal one (5 samples)."""
    both = Message(arrays=state_of(model_a_b),
                   scalars={"num_examples": 3, "num_modalities": 2, **{f"examples/{mod}.a.": 3 for mod in
                                                                       ("encoders", "proj", "heads", "infil")},
                            **{f"examples/{mod}.b.": 2 for mod in ("encoders", "proj", "heads", "infil")}})
    one = Message(arrays=state_of(model_a),
                  scalars={"num_examples": 5, "num_modalities": 1,
                           **{f"examples/{mod}.a.": 5 for mod in ("encoders", "proj", "heads", "infil")}})
    return {0: both, 1: one}


def test_fediot_multimodal_client_weighs_multimodal_weight_times_a_unimodal_one_by_hand():
    from mmfl.algorithms.multimodal import FedIoTParams, FedIoTServer, MFedAvgParams, MFedAvgServer

    g = torch.Generator().manual_seed(0)
    m_ab, m_a = tiny_mm(), tiny_mm(("a",))
    with torch.no_grad():  # two different client models
        for p in list(m_ab.parameters()) + list(m_a.parameters()):
            p.add_(torch.randn(p.shape, generator=g))
    replies = _mm_replies(m_ab, m_a)
    ctx = ServerContext(META, TrainConfig(), 0, 2, make_model=tiny_mm, client_modalities=[("a", "b"), ("a",)])
    ab, a = replies[0].arrays, replies[1].arrays
    out = FedIoTServer(FedIoTParams(), ctx).aggregate(0, replies)  # multimodal_weight = 100
    k_cls, k_a, k_b = "classifier.weight", "encoders.a.net.1.weight", "encoders.b.net.1.weight"
    assert torch.allclose(out[k_cls].double(), (100 * 3 * ab[k_cls].double() + 5 * a[k_cls].double()) / 305)
    assert torch.allclose(out[k_a].double(), (100 * 3 * ab[k_a].double() + 5 * a[k_a].double()) / 305)
    assert torch.equal(out[k_b], ab[k_b])  # only the multimodal client holds b
    # multimodal_weight = 1 is MFedAvg exactly; MFedAvg weighs by samples: 3 against 5
    one = FedIoTServer(FedIoTParams(multimodal_weight=1.0), ctx).aggregate(0, replies)
    avg = MFedAvgServer(MFedAvgParams(), ctx).aggregate(0, replies)
    assert all(torch.equal(one[k], avg[k]) for k in avg)
    assert torch.allclose(avg[k_cls].double(), (3 * ab[k_cls].double() + 5 * a[k_cls].double()) / 8)


# ----------------------------------------------------------------------------- MFedProto / FedPMR


def test_mfedproto_prototype_term_pulls_representations_toward_the_global_prototypes():
    from mmfl.algorithms.prototypes import PROTO, PROTO_COUNT, MFedProtoClient, MFedProtoParams, fedproto_term

    data = tiny_mm_data(48)
    start = state_of(tiny_mm())
    # global prototypes far from where the initial model puts each class (FedProto eq. 8's output)
    g = torch.Generator().manual_seed(5)
    protos = {m: 2.0 * torch.randn(3, 4, generator=g) for m in ("a", "b")}
    arrays = {**start, **{PROTO + m: p for m, p in protos.items()},
              **{PROTO_COUNT + m: torch.ones(3) for m in protos}}

    def distance(state):  # FedProto eq. 6's regulariser of the trained model on the client's data
        model = load_into(tiny_mm(), state)
        model.eval()
        inputs, labels = data.get()
        with torch.no_grad():
            out = model(inputs)
        return float(fedproto_term(out["mod_reps"], out["present"], labels, arrays))

    after = {}
    for lam in (0.0, 1.0):
        ctx = ctx_for(0, data, META, SGD, tiny_mm)
        reply = MFedProtoClient(MFedProtoParams(lam=lam), ctx).handle("train", Message(arrays=dict(arrays)))
        after[lam] = distance({k: reply.arrays[k] for k in start})
        # the reply carries the local prototypes of z_m (eq. 8's input) with their counts
        assert reply.arrays[PROTO_COUNT + "a"].tolist() == [16.0, 16.0, 16.0]
    before = distance(start)
    # measured: 6.77 at the start; 7.27 after CE alone, 4.31 with lam = 1
    assert after[1.0] < 0.7 * before and after[1.0] < 0.7 * after[0.0]


def test_mfedproto_server_prototypes_are_the_count_weighted_mean_of_the_clients_in_a_real_round(tmp_path):
    # FedProto eq. 8 in the server of a real case-D round: each class's global prototype is the
    # clients' local prototypes weighted by their counts of that class (the clients hold the
    # classes in different proportions, so the uniform mean over the reporting clients differs)
    from mmfl.algorithms.prototypes import PROTO, PROTO_COUNT

    exp = experiment(mm_raw(tmp_path, "mfedproto"))
    seen = spy_replies(exp)
    exp.run()
    (_, _, replies), = seen
    for m in ("pix", "fou"):
        got = [(r.arrays[PROTO + m].double(), r.arrays[PROTO_COUNT + m].double()) for r in replies.values()
               if PROTO + m in r.arrays]
        assert len(got) >= 2
        counts = torch.stack([n for _, n in got])  # [clients, classes]
        held = counts.sum(0) > 0
        hand = sum(n[:, None] * p for p, n in got) / counts.sum(0).clamp(min=1)[:, None]
        assert torch.allclose(exp.server.protos[m].double()[held], hand[held], rtol=0, atol=1e-6), m
        assert torch.equal(exp.server.counts[m].double(), counts.sum(0))
        uniform = sum((n > 0).double()[:, None] * p for p, n in got) / (counts > 0).sum(0).clamp(min=1)[:, None]
        assert float((uniform - hand)[held].abs().max()) > 1e-3, m  # the check can fail


def test_pmr_step_moves_the_weak_modality_toward_its_class_prototype_and_leaves_the_dominant():
    from mmfl.algorithms.prototypes import pmr_terms, prototype_logits

    # modality a sits on its prototypes (dominant); b halfway between its two (weak)
    protos = {"a": (torch.tensor([[0.0, 0.0], [4.0, 0.0]]), torch.ones(2)),
              "b": (torch.tensor([[0.0, 0.0], [2.0, 0.0]]), torch.ones(2))}
    feats = {"a": torch.tensor([[0.0, 0.0], [4.0, 0.0]], requires_grad=True),
             "b": torch.tensor([[1.0, 0.0], [1.0, 0.0]], requires_grad=True)}
    present = {m: torch.tensor([True, True]) for m in feats}
    labels = torch.tensor([0, 1])

    def p_true(m, f):
        return prototype_logits(f, protos[m][0]).softmax(1).gather(1, labels[:, None]).squeeze(1)

    step = pmr_terms(feats, present, labels, protos, alpha=1.0)
    assert step.dominant == "a" and step.weak == ["b"]
    assert p_true("b", feats["b"].detach()).tolist() == pytest.approx([0.5, 0.5])
    step.loss.backward()
    assert float(feats["a"].grad.abs().max()) == 0.0
    with torch.no_grad():
        moved = feats["b"] - 0.1 * feats["b"].grad  # one SGD step on the weak features
    # each sample moved toward its own class's prototype: distance to it falls, p(true class) rises
    own = protos["b"][0][labels]
    assert ((moved - own).norm(dim=1) < (feats["b"].detach() - own).norm(dim=1)).all()
    # f = 1 -> 0.9 (class 0) and 1.1 (class 1): p = 1 / (1 + e^{-(1.21 - 0.81)})
    assert p_true("b", moved).tolist() == pytest.approx([1 / (1 + math.exp(-0.4))] * 2, rel=1e-5)


def test_fedpmr_client_adds_the_weak_modalitys_prototype_cross_entropy_to_the_mfedavg_loss():
    from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams
    from mmfl.algorithms.prototypes import FedPMRClient, FedPMRParams, class_means, prototype_logits

    model = tiny_mm()
    data = tiny_mm_data(24)
    inputs, labels = data.get()
    ctx = SimpleNamespace(modalities=("a", "b"), data=data, meta=META)
    client = FedPMRClient(FedPMRParams(alpha=0.7, distance="squared"), ctx)
    client.begin(model, Message())
    client.on_epoch(0)  # prototypes of the encoder outputs f_m from the client's data
    means = class_means(model, data, "mod_feats", 3)
    assert all(torch.equal(client.protos[m][0], means[m][0]) for m in ("a", "b"))
    msg = Message()
    extra = float((client.loss(model, inputs, labels, msg)
                   - MFedAvgClient(MFedAvgParams(), SimpleNamespace()).loss(model, inputs, labels, msg)).detach())
    with torch.no_grad():  # by hand: s_m = sum_i p_m,i[y_i]; the lower one is weak, alpha * its CE
        feats = model(inputs)["mod_feats"]
        logits = {m: prototype_logits(feats[m], means[m][0]) for m in ("a", "b")}
        s = {m: float(logits[m].softmax(1).gather(1, labels[:, None]).sum()) for m in logits}
        weak = min(s, key=s.get)
        hand = 0.7 * float(F.cross_entropy(logits[weak], labels))
    assert s["a"] != s["b"] and extra == pytest.approx(hand, rel=1e-5)
    assert client.weak_steps[weak] == 1
