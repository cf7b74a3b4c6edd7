"""Mechanism checks (issue 13, item 3): for each method, a fast test on tiny constructed or
real data that fails if what distinguishes the method from its parent is broken. The
inventory of which test checks which method is docs/mechanisms.md; methods whose check
lives elsewhere (SCAFFOLD, MOON, FedCMI, FedOGM, FedMSplit, CreamFL's GCA and server
optimizer, split learning, SOLO, FedFomo, ...) are listed there with their test."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.base import ClientContext, ServerContext
from mmfl.algorithms.fedavg import FedAvgClient
from mmfl.algorithms.fedprox import FedProxClient, FedProxParams
from mmfl.config import TrainConfig, load_config, resolve
from mmfl.data.base import PRESENT, ArrayDataset, DatasetMeta
from mmfl.core.message import Message
from mmfl.engine.runner import Experiment
from mmfl.core.training import load_into, state_of
from mmfl.models.multimodal import MultimodalModel, MultimodalParams, branch_of, multimodal


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- helpers


def spy_replies(exp: Experiment) -> list[tuple[str, dict[int, Message], dict[int, Message]]]:
    """Record every ``(route, messages, replies)`` the server exchanges through the transport."""
    seen = []
    send = exp.transport.send

    def spy(route, messages):
        replies = send(route, messages)
        seen.append((route, messages, replies))
        return replies

    exp.transport.send = spy
    return seen


def hand_weighted_mean(values: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """sum_c w_c v_c / sum_c w_c in float64, written out."""
    total = sum(weights)
    acc = torch.zeros_like(values[0], dtype=torch.float64)
    for v, w in zip(values, weights):
        acc = acc + v.double() * (w / total)
    return acc


def ctx_for(cid, data, meta, train, make_model, holds=None, state=None, public=None, rnd=0, seed=7) -> ClientContext:
    """A client context over ``data``; ``ctx.model(key)`` is one model per key (built by ``make_model``)."""
    pool: dict = {}

    def model_pool(key):
        if key not in pool:
            pool[key] = make_model()
        return pool[key]

    return ClientContext(cid=cid, rnd=rnd, seed=seed, data=data, test_data=None, meta=meta, train=train,
                         state={} if state is None else state, model_pool=model_pool, init_model=make_model,
                         modalities=tuple(holds or meta.modalities), public=public)


def exp_client_ctx(exp: Experiment, cid: int, rnd: int = 0) -> ClientContext:
    """Client ``cid`` of an experiment's federation, its model built as the engine builds it."""
    fed = exp.federation
    holds = tuple(fed.modalities_of(cid))
    return ctx_for(cid, fed.clients[cid], fed.meta, exp.cfg.train, lambda: exp.make_model(holds), holds=holds,
                   public=fed.public, rnd=rnd)


def float_keys(sd: dict) -> list[str]:
    return [k for k, v in sd.items() if v.is_floating_point()]


SGD = TrainConfig(optimizer="sgd", local_epochs=2, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)

# a tiny two-modality, three-class problem: the class shifts the mean of both modalities
META = DatasetMeta("tiny", 3, {"a": (4,), "b": (3,)})


def tiny_mm(holds=("a", "b"), feat_dim=4) -> MultimodalModel:
    torch.manual_seed(0)
    return multimodal(MultimodalParams(feat_dim=feat_dim, mlp_hidden=[8]), META, list(holds))


def tiny_mm_data(n=48, holds=("a", "b"), seed=1) -> ArrayDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    feats = {m: 1.5 * F.one_hot(y, META.modalities[m][0]).float() + torch.randn(n, *META.modalities[m], generator=g)
             for m in holds}
    return ArrayDataset(feats, y)


# ----------------------------------------------------------------------------- FedAvg / FedProx

DIGITS = ["data.name=digits", "partition.name=quantity_skew", "partition.beta=1.0", "partition.num_clients=3",
          "model.name=mlp", "model.hidden=[16]", "train.local_epochs=1", "train.batch_size=128",
          "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"]


def test_fedavg_global_model_is_the_data_size_weighted_mean_of_the_replies(tmp_path):
    cfg = load_config(None, [*DIGITS, f"output_dir={tmp_path}", "name=avg", "rounds=1"])
    exp = Experiment(cfg, progress=False)
    seen = spy_replies(exp)
    exp.run()
    (route, _, replies), = seen
    sizes = {c: len(exp.federation.clients[c]) for c in replies}
    assert route == "train" and len(replies) == 3 and max(sizes.values()) > 1.5 * min(sizes.values())
    cids = sorted(replies)
    new = exp.server.model.state_dict()
    for k in float_keys(new):  # MOON Alg. 1 line 7: sum_k |D^k| / |D| w_k
        hand = hand_weighted_mean([replies[c].arrays[k] for c in cids], [sizes[c] for c in cids])
        assert torch.allclose(new[k].double(), hand, atol=1e-6), k
    # the unweighted mean is a different model (the sizes matter)
    k = float_keys(new)[0]
    plain = hand_weighted_mean([replies[c].arrays[k] for c in cids], [1.0] * 3)
    assert float((plain - new[k].double()).abs().max()) > 1e-4


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 2)

    def forward(self, inputs):
        return {"logits": self.fc(inputs["x"])}


def test_fedprox_proximal_gradient_is_mu_times_the_distance_to_the_global_model():
    model = Linear()
    anchor = {k: v + 0.25 * torch.arange(v.numel()).reshape(v.shape) for k, v in state_of(model).items()}
    x, y = {"x": torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])}, torch.tensor([0, 1])

    def grads(loss_fn):
        model.zero_grad()
        loss_fn(model, x, y).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads(FedAvgClient(None, SimpleNamespace()).loss_fn(anchor))
    mu = 0.3
    prox = grads(FedProxClient(FedProxParams(mu=mu), SimpleNamespace()).loss_fn(anchor))
    for n, p in model.named_parameters():  # d/dw mu/2 ||w - w^t||^2 = mu (w - w^t) (FedProx eq. 2)
        assert torch.allclose(prox[n] - plain[n], mu * (p.detach() - anchor[n]), atol=1e-6), n
    # the batched path's penalty has the same value
    client = FedProxClient(FedProxParams(mu=mu), SimpleNamespace())
    params = dict(model.named_parameters())
    value = client.batched_penalty(params, None, {"anchor": anchor})
    hand = mu / 2 * sum(float(((p.detach() - anchor[n]) ** 2).sum()) for n, p in params.items())
    assert float(value.detach()) == pytest.approx(hand, rel=1e-6)


def test_fedprox_larger_mu_keeps_the_local_model_closer_to_the_global_one():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    data = ArrayDataset({"x": x}, (x[:, 0] + 0.5 * x[:, 1] > 0).long())
    meta = DatasetMeta("lin", 2, {"x": (3,)})
    glob = state_of(Linear())
    dist = {}
    for mu in (0.0, 0.5, 5.0):
        ctx = ctx_for(0, data, meta, SGD, Linear)
        reply = FedProxClient(FedProxParams(mu=mu), ctx).handle("train", Message(arrays=dict(glob)))
        dist[mu] = math.sqrt(sum(float(((reply.arrays[k] - glob[k]) ** 2).sum()) for k in glob))
    assert dist[0.0] > 0.05
    assert dist[0.0] > dist[0.5] > dist[5.0]
    assert dist[5.0] < 0.5 * dist[0.0]


# ----------------------------------------------------------------------------- MFedAvg / MFedProx / FedIoT


def mm_raw(tmp_path, algorithm="mfedavg", rounds=1, **algo):
    """mfeat pix + fou, case D: 4 clients holding fou / pix+fou / pix+fou / pix, 20 % of fou missing."""
    return {"name": algorithm, "rounds": rounds, "output_dir": str(tmp_path), "threads": 1, "case": "D",
            "data": {"name": "mfeat", "views": ["pix", "fou"]}, "partition": {"num_clients": 4},
            "modalities": {"missing_rate": {"fou": 0.2}},
            "model": {"name": "multimodal", "feat_dim": 8, "mlp_hidden": [16]},
            "algorithm": {"name": algorithm, **algo}, "train": {"local_epochs": 1, "batch_size": 64}}


def test_mfedavg_a_unimodal_client_never_changes_the_other_modalitys_modules(tmp_path):
    exp = Experiment(resolve(mm_raw(tmp_path)), progress=False)
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
    exp = Experiment(resolve(mm_raw(tmp_path)), progress=False)
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
    avg = Experiment(resolve(mm_raw(tmp_path / "a")), progress=False)
    avg.run()
    prox = Experiment(resolve(mm_raw(tmp_path / "p", "mfedprox", mu=0.0)), progress=False)
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

    exp = Experiment(resolve(mm_raw(tmp_path, "mfedproto")), progress=False)
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


# ----------------------------------------------------------------------------- reamFL, FedMD, FedET, FedGEMS


def test_representation_aggregation_rules_in_the_server_by_hand():
    """reamFL+Mean / +Avg / +IoT, FedET (variance), FedGEMS (entropy): CreamFLServer.aggregate_reps
    on three clients' image representations (P = 2, d = 3); client 0 holds image and text."""
    from mmfl.algorithms.creamfl import CreamFLParams, CreamFLServer

    reps = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]],
                         [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
                         [[3.0, 0.0, 0.0], [0.0, 0.0, 0.5]]])
    sizes, holds = [2, 3, 5], [("image", "text"), ("image",), ("image",)]
    replies = {c: Message(arrays={"rep/image": reps[c]}, scalars={"num_examples": sizes[c]}) for c in range(3)}
    server = CreamFLServer.__new__(CreamFLServer)
    server.pair = ("image", "text")
    server.ctx = SimpleNamespace(modalities_of=lambda c: holds[c])
    glob = {"image": torch.zeros(2, 3), "text": torch.zeros(2, 3)}

    def agg(rule):
        server.params = ALGORITHMS.params(rule, {}) if rule in ALGORITHMS else CreamFLParams(aggregation=rule)
        return server.aggregate_reps(replies, glob)[0]["image"]

    assert torch.allclose(agg("reamfl_mean"), reps.mean(0))
    assert torch.allclose(agg("reamfl_avg"), (2 * reps[0] + 3 * reps[1] + 5 * reps[2]) / 10)
    assert torch.allclose(agg("reamfl_iot"), (100 * 2 * reps[0] + 3 * reps[1] + 5 * reps[2]) / 208)
    # FedET: per sample, each client's share of the representation variance (unbiased, over d)
    var = torch.tensor([[1 / 3, 4 / 3], [1 / 3, 0.0], [3.0, 1 / 12]])
    w = var / var.sum(0)
    assert torch.allclose(agg("fedet"), (w[:, :, None] * reps).sum(0), atol=1e-6)
    assert float(w[2, 0]) > 0.8  # the most confident (highest-variance) client dominates sample 0
    # FedGEMS: per sample, the clients at or below the mean entropy of softmax(rep), uniformly
    h = -(reps.softmax(-1) * reps.softmax(-1).log()).sum(-1)  # [3, 2]
    keep = (h <= h.mean(0)).double()
    assert keep[:, 0].tolist() == [0.0, 0.0, 1.0] and keep[:, 1].tolist() == [1.0, 0.0, 0.0]
    assert torch.allclose(agg("fedgems"), torch.stack([reps[2, 0], reps[0, 1]]))
    assert torch.equal(agg("fedmd"), agg("reamfl_mean"))  # FedMD's consensus is the mean


PAIR = {"name": "pair", "rounds": 1, "seed": 0, "threads": 1,
        "data": {"name": "mfeat_pair", "public_fraction": 0.3}, "partition": {"name": "iid", "num_clients": 4},
        "modalities": {"name": "explicit",
                       "holds": [["image", "features"], ["image", "features"], ["image"], ["features"]]},
        "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
        "train": {"local_epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.003}}


def pair_model(meta, seed: int) -> MultimodalModel:
    """A model of PAIR's architecture, initialised from torch seed ``seed``."""
    torch.manual_seed(seed)
    return multimodal(MultimodalParams(**{k: PAIR["model"][k] for k in ("feat_dim", "cnn_channels", "mlp_hidden")}),
                      meta)


@pytest.fixture(scope="module")
def pair_exp(tmp_path_factory):
    """mfeat_pair with a public share (CreamFL's family); clients 0-1 image+features, 2 image, 3 features."""
    raw = {**PAIR, "output_dir": str(tmp_path_factory.mktemp("pair")), "algorithm": {"name": "fedmd"}}
    return Experiment(resolve(raw), progress=False)


@pytest.mark.parametrize("name, route", [("fedmd", "consensus/"), ("fedet", "global/"), ("fedgems", "global/")])
def test_local_distillation_pulls_the_clients_public_representations_toward_the_target(pair_exp, name, route):
    """FedMD's digest (toward last round's consensus) and FedET/FedGEMS's local distillation
    (toward the server's global representations) before private training: the client's
    representations of the public set end closer (MSE) to the target than without it."""
    from mmfl.algorithms.creamfl_terms import public_reps

    public = pair_exp.federation.public
    cid = 0
    start = public_reps(exp_client_ctx(pair_exp, cid).init_model(), public, ["image", "features"])
    # the target: what another model of the same architecture represents
    target = public_reps(pair_model(pair_exp.federation.meta, 123), public, ["image", "features"])
    mse = {}
    for weight in (0.0, 1.0):
        params = ALGORITHMS.params(name, {"local_distill_weight": weight})
        ctx = exp_client_ctx(pair_exp, cid)
        reply = ALGORITHMS.get(name).factory.client(params, ctx).handle(
            "train", Message(arrays={route + m: t for m, t in target.items()}))
        mse[weight] = sum(float(F.mse_loss(reply.arrays["rep/" + m], target[m])) for m in target)
    before = sum(float(F.mse_loss(start[m], target[m])) for m in target)
    # measured (all three): 0.413 at the start, 0.426 after private training alone, 0.218 with it
    assert mse[1.0] < 0.7 * mse[0.0] and mse[1.0] < 0.7 * before


@pytest.mark.parametrize("name, iot", [("creamfl_fedavg", 1.0), ("creamfl_fediot", 100.0)])
def test_weight_sharing_server_model_is_the_iot_weighted_average_of_the_held_modules(tmp_path, name, iot):
    raw = {**PAIR, "name": name, "output_dir": str(tmp_path), "algorithm": {"name": name}}
    exp = Experiment(resolve(raw), progress=False)
    fed = exp.federation
    before = {k: v.clone() for k, v in exp.server.model.state_dict().items()}
    seen = spy_replies(exp)
    exp.run()
    (_, _, replies), = seen
    cids = sorted(replies)
    new = exp.server.model.state_dict()
    multimodal_clients = [c for c in cids if set(fed.modalities_of(c)) == {"image", "features"}]
    assert multimodal_clients == [0, 1]
    for k in float_keys(new):
        holders = [c for c in cids if k in replies[c].arrays]
        if not k.startswith(("encoders.", "proj.")):  # heads, ...: stay on the clients
            assert not holders and torch.equal(new[k], before[k]), k
            continue
        assert holders == [c for c in cids if branch_of(k) in fed.modalities_of(c)], k
        weights = [len(fed.clients[c]) * (iot if c in multimodal_clients else 1.0) for c in holders]
        hand = hand_weighted_mean([replies[c].arrays[k] for c in holders], weights)
        assert torch.allclose(new[k].double(), hand, atol=1e-6), k


# ----------------------------------------------------------------------------- PartialFL


@pytest.fixture(scope="module")
def pfl_exp(tmp_path_factory):
    """mfeat_pair: the image private, the features shareable; 3 clients holding both."""
    raw = {**PAIR, "name": "pfl", "output_dir": str(tmp_path_factory.mktemp("pfl")),
           "partition": {"name": "iid", "num_clients": 3}, "modalities": {"name": "all"},
           "algorithm": {"name": "partialfl", "shareable": "features"}}
    return Experiment(resolve(raw), progress=False)


def _pfl_train(exp, name, **params):
    """One PartialFL client round of client 0 from the server's initial F_g and F_s, and a local
    model F_k initialised apart from F_s (another seed): the reply, the message (z_T = F_s's
    normalised embeddings of the client's shareable rows) and the client's data."""
    from mmfl.algorithms.partialfl import LOCAL, ZT, PartialFLClient, global_keys

    server, fed = exp.server, exp.federation
    ctx = exp_client_ctx(exp, 0)
    ctx.state.update({LOCAL + k: v for k, v in state_of(pair_model(fed.meta, 321)).items()})
    feats, _ = ctx.data.get()
    p = ALGORITHMS.params(name, {"shareable": "features", **params})
    arrays = {k: server.model.state_dict()[k] for k in global_keys(server.model, "image", "private",
                                                                     fed.modalities_of(0))}
    if p.align:
        arrays[ZT] = server.server_embeddings(feats["features"])
    msg = Message(arrays=arrays)
    return PartialFLClient(p, ctx).handle("train", msg), msg, feats


def test_partialfl_alignment_pulls_private_and_local_embeddings_toward_the_servers(pfl_exp):
    """Eq. 3 (F_g's private embedding z_A against the server's z_T of the same sample) and eq. 4
    (the local model's z'_T against z_T): with beta > 0 both end closer (cosine) to z_T."""
    from mmfl.algorithms.partialfl import ZPRIME, ZT, branch_embed

    cos_a, cos_l = {}, {}
    for beta in (0.0, 1.0):
        reply, msg, feats = _pfl_train(pfl_exp, "partialfl", beta=beta)
        zt = msg.arrays[ZT]
        gmodel = load_into(pfl_exp.make_model(("image", "features")), {
            **pfl_exp.server.model.state_dict(), **{k: v for k, v in reply.arrays.items() if k != ZPRIME}})
        gmodel.eval()
        with torch.no_grad():
            za = F.normalize(branch_embed(gmodel, "image", feats["image"]), dim=-1)
        cos_a[beta] = float((za * zt).sum(-1).mean())
        cos_l[beta] = float((reply.arrays[ZPRIME] * zt).sum(-1).mean())
    # measured: z_A . z_T 0.20 -> 0.47, z'_T . z_T 0.18 -> 0.39
    assert cos_a[1.0] > cos_a[0.0] + 0.1
    assert cos_l[1.0] > cos_l[0.0] + 0.1


def test_partialfl_with_beta_zero_trains_the_global_model_as_pfl_fedavg(pfl_exp):
    """beta = 0: the alignment terms vanish and F_g is exactly the FedAvg baseline's (pfl_fedavg,
    whose clients get no z_T and send nothing of the shareable modality)."""
    from mmfl.algorithms.partialfl import ZPRIME

    base, msg, _ = _pfl_train(pfl_exp, "pfl_fedavg")
    assert "zt" not in msg.arrays and ZPRIME not in base.arrays
    assert not any(branch_of(k) == "features" for k in base.arrays)
    zero, _, _ = _pfl_train(pfl_exp, "partialfl", beta=0.0)
    keys = [k for k in zero.arrays if k != ZPRIME]
    assert sorted(keys) == sorted(base.arrays)
    assert all(torch.equal(zero.arrays[k], base.arrays[k]) for k in keys)
    aligned, _, _ = _pfl_train(pfl_exp, "partialfl", beta=1.0)
    assert any(not torch.equal(aligned.arrays[k], base.arrays[k]) for k in keys)


def test_partialfl_prox_keeps_the_global_model_closer_to_the_servers(pfl_exp):
    from mmfl.algorithms.partialfl import ZPRIME

    params = {n for n, _ in pfl_exp.server.model.named_parameters()}  # not BatchNorm's running statistics
    dist = {}
    for name, mu in (("pfl_fedavg", 0.0), ("pfl_fedprox", 1.0), ("partialfl_prox", 1.0)):
        reply, msg, _ = _pfl_train(pfl_exp, name, mu=mu)
        dist[name] = math.sqrt(sum(float(((reply.arrays[k] - msg.arrays[k]) ** 2).sum())
                                   for k in reply.arrays if k in params))
    # measured: 0.377 (mu = 0), 0.153 (pfl_fedprox), 0.190 (partialfl_prox: with the alignment terms)
    assert dist["pfl_fedprox"] < 0.6 * dist["pfl_fedavg"] and dist["partialfl_prox"] < 0.6 * dist["pfl_fedavg"]


def test_pfl_centralized_trains_the_global_model_on_every_clients_data_pooled(pfl_exp, tmp_path):
    raw = {**PAIR, "name": "pooled", "output_dir": str(tmp_path), "partition": {"name": "iid", "num_clients": 3},
           "modalities": {"name": "all"}, "algorithm": {"name": "pfl_centralized", "shareable": "features"}}
    pooled = Experiment(resolve(raw), progress=False)
    fed, parts = pooled.federation, pfl_exp.federation
    assert fed.num_clients == 1 and pooled.server.fs is None  # no server model, no alignment
    assert len(fed.clients[0]) == sum(len(c) for c in parts.clients)
    labels = torch.cat([torch.as_tensor(c.label_array()) for c in parts.clients]).sort().values
    assert torch.equal(torch.as_tensor(fed.clients[0].label_array()).sort().values, labels)


# ----------------------------------------------------------------------------- pfedwireless


class LoopTransport:
    """Runs each message on its client in this process; the clients' states persist."""

    def __init__(self, client_cls, params, data, train, make_model):
        self.client_cls, self.params, self.data = client_cls, params, data
        self.train, self.make_model = train, make_model
        self.num_clients = len(data)
        self.states = {c: {} for c in range(len(data))}
        self.rnd = 0

    def send(self, route, messages):
        out = {}
        for c, msg in messages.items():
            ctx = ctx_for(c, self.data[c], META, self.train, self.make_model, state=self.states[c], rnd=self.rnd,
                          seed=1000 * self.rnd + c)
            out[c] = self.client_cls(self.params, ctx).handle(route, msg)
        return out


def test_pfedwireless_coefficients_move_toward_devices_with_the_same_label_distribution():
    """Devices 0, 1 hold classes {0, 1}, devices 2, 3 classes {2, 3}. Every device uploads every
    group each round (k_hat = 1); with a large eta_hat, eq. 6-7 raise xi~_{k,k'} for the
    devices k' of k's own group (their updates lower F_k) and lower it for the others."""
    from mmfl.algorithms.pfedwireless import PFedWirelessClient, PFedWirelessParams, PFedWirelessServer
    from mmfl.algorithms.pfedwireless_math import SHARED, softmax_rows

    def data(classes, seed):
        g = torch.Generator().manual_seed(seed)
        centres = 2 * torch.randn(4, 4, generator=torch.Generator().manual_seed(99))
        y = torch.tensor(classes).repeat(24)
        return ArrayDataset({"a": centres[y] + torch.randn(48, 4, generator=g),
                             "b": centres[y, :3] + torch.randn(48, 3, generator=g)}, y)

    meta = DatasetMeta("groups", 4, META.modalities)

    def make_model():
        torch.manual_seed(0)
        return multimodal(MultimodalParams(feat_dim=4, mlp_hidden=[8]), meta)

    train = TrainConfig(optimizer="sgd", local_epochs=1, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)
    params = PFedWirelessParams(eta_hat=100.0, k_hat=1.0, a_th=0)
    server = PFedWirelessServer(params, ServerContext(meta, train, 0, 4, make_model))
    loop = LoopTransport(PFedWirelessClient, params, [data([0, 1], 1), data([0, 1], 2), data([2, 3], 3),
                                                       data([2, 3], 4)], train, make_model)
    for rnd in range(3):
        loop.rnd = rnd
        metrics = server.round(rnd, [0, 1, 2, 3], loop)
    assert metrics["xi_rows_updated"] == 4 * 3  # every row of every group stepped (rounds 1 and 2)
    group = [0, 0, 1, 1]
    margins = {}
    for g in ("a", "b", SHARED):
        xi = softmax_rows(server.xi[g])
        for k in range(4):
            same = sum(float(xi[k, j]) for j in range(4) if group[j] == group[k])
            margins[g, k] = same - (1 - same)
    # measured (own group's share minus the other's): a 0.12-0.40, b 0.26-0.99, shared 0.97-1.0
    assert all(v > 0 for v in margins.values())
    assert min(margins[SHARED, k] for k in range(4)) > 0.2


# ----------------------------------------------------------------------------- FedAMP


def test_fedamp_proximal_step_keeps_the_model_closer_to_its_cloud_model():
    """Eq. 6: the client minimises F_i(w) + lambda / (2 alpha) ||w - u_i||^2 from its own model;
    a larger lambda ends nearer the cloud model u_i it received."""
    from mmfl.algorithms.fedamp import FedAMPClient, FedAMPParams

    data = tiny_mm_data(48)
    own = state_of(tiny_mm())
    g = torch.Generator().manual_seed(2)
    cloud = {k: v + 0.3 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in own.items()}
    names = [n for n, _ in tiny_mm().named_parameters() if not n.startswith("heads.")]
    dist = {}
    for lam in (0.0, 1.0, 10.0):
        ctx = ctx_for(0, data, META, SGD, tiny_mm)
        reply = FedAMPClient(FedAMPParams(lam=lam, alpha=1.0), ctx).handle("train", Message(arrays=dict(cloud)))
        dist[lam] = math.sqrt(sum(float(((reply.arrays[k] - cloud[k]) ** 2).sum()) for k in names))
        assert any(k.startswith("model/") for k in ctx.state)  # start = own: the client keeps its model
    start = math.sqrt(sum(float(((own[k] - cloud[k]) ** 2).sum()) for k in names))
    # measured: 4.55 at the start; 4.56 (lambda 0), 3.35 (1), 0.13 (10)
    assert dist[0.0] > dist[1.0] > dist[10.0] and dist[10.0] < 0.5 * start
