"""Per-sample missing modalities in the models, the algorithms and the evaluation (issue 25).

The main mechanism test: a run whose absent cells hold huge garbage (1e30) instead of zeros
must train *exactly* as with zeros, for every multimodal algorithm: what a sample lacks never
enters an encoder (batch norm included), a loss, a contrastive pair or an upload. Then: a
modality absent on every row of a batch trains nothing of its branch and gives no NaN; the
per-modality head accuracy and the accuracy by missingness pattern match a by-hand count.
"""

from __future__ import annotations

import copy

import pytest
import torch

from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams
from mmfl.algorithms.base import ClientContext
from mmfl.config import TrainConfig
from mmfl.core.message import Message
from mmfl.core.patterns import pattern_name, pool_patterns
from mmfl.core.training import evaluate_model
from mmfl.data.base import PRESENT, ArrayDataset, DatasetMeta
from mmfl.models.multimodal import MultimodalModel
from mmfl.report import compare, load_metrics, pattern_columns

from helpers import experiment

GARBAGE = 1e30


def raw_config(tmp_path, algo: str, **over) -> dict:
    """mfeat_pair (image [1, 16, 15] through a CNN with batch norm + features through an MLP):
    clients 0-1 hold both, 2 the image, 3 the features; 30 % of the multimodal clients' rows
    lack the features, 20 % the image."""
    raw = {"name": algo, "rounds": 2, "seed": 0, "output_dir": str(tmp_path), "threads": 1,
           "data": {"name": "mfeat_pair"}, "partition": {"name": "iid", "num_clients": 4},
           "modalities": {"name": "explicit",
                          "holds": [["image", "features"], ["image", "features"], ["image"], ["features"]],
                          "missing_rate": {"features": 0.3, "image": 0.2}},
           "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
           "algorithm": {"name": algo},
           "train": {"local_epochs": 1, "batch_size": 32, "optimizer": "adam", "lr": 0.001}}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k] = {**raw[k], **v}
        else:
            raw[k] = v
    return raw


def mask_rows(data: ArrayDataset, seed: int) -> None:
    """Give a whole data set (test or public) present/<m> masks: ~20 % of the rows lack the
    first modality, ~15 % the second (never both), absent cells zero."""
    mods = sorted(data.modalities)
    r = torch.rand(data.labels.shape[0], generator=torch.Generator().manual_seed(seed))
    lacks = {mods[0]: r < 0.2, mods[1]: (r >= 0.2) & (r < 0.35)}
    for m, lack in lacks.items():
        data.features[PRESENT + m] = ~lack.to(data.labels.device)
        data.features[m][lack] = 0


def fill_absent(datasets, value: float) -> int:
    """Write ``value`` into every absent cell (present/<m> False) of the data sets' shared tensors."""
    done, cells = set(), 0
    for d in datasets:
        for k, mask in d.features.items():
            m = k[len(PRESENT):]
            if not k.startswith(PRESENT) or m not in d.features or (id(d.features[m]), id(mask)) in done:
                continue
            done.add((id(d.features[m]), id(mask)))
            lack = ~mask.to(torch.bool)
            d.features[m][lack] = value
            cells += int(lack.sum())
    return cells


def run(out_dir, raw, value: float, masked_sets=("test",)):
    raw = {**copy.deepcopy(raw), "output_dir": str(out_dir)}
    exp = experiment(raw)
    fed = exp.federation
    for i, name in enumerate(masked_sets):
        if getattr(fed, name) is not None:
            mask_rows(getattr(fed, name), seed=17 + i)
    sets = [*fed.clients, fed.test] + ([fed.public] if fed.public is not None else [])
    assert fill_absent(sets, value) > 0
    exp.run()
    model = getattr(exp.server, "model", None)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()} if model is not None else {}
    return state, load_metrics(exp.run_dir)


def same_training(tmp_path, raw, masked_sets=("test",)):
    a, rows_a = run(tmp_path / "zeros", raw, 0.0, masked_sets)
    b, rows_b = run(tmp_path / "garbage", raw, GARBAGE, masked_sets)
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k  # bit for bit: absent values never entered the training
        assert not a[k].is_floating_point() or torch.isfinite(a[k]).all(), k
    strip = lambda rs: [{k: v for k, v in r.items() if "time" not in k and "bytes" not in k} for r in rs]  # noqa: E731
    assert strip(rows_a) == strip(rows_b)
    return rows_a


# mutations tried by hand, each made the matching case fail: _branch encoding every row
# (rows = None) -> mfedavg/fedogm/moon/fedcmi differ (batch norm of the CNN sees the garbage,
# the backward of 1e30 rows gives NaN); client_forward with model.encode -> split_learning;
# reps_of with model.encode -> creamfl/pcme; partialfl's upload of every row -> partialfl.
CASES = {
    "mfedavg": {},
    "moon": {"algorithm": {"name": "moon", "mu": 1.0}},
    "fedogm": {},
    "fedcmi": {"model": {"two_projector": True}, "algorithm": {"name": "fedcmi", "cta_from_round": 0}},
    "split_learning": {},
    "fedmsplit": {},
    "mfedproto": {},
    "fedpmr": {},
}


@pytest.mark.parametrize("algo", sorted(CASES))
def test_garbage_in_absent_cells_trains_exactly_as_zeros(tmp_path, algo):
    raw = raw_config(tmp_path, algo, **CASES[algo])
    if algo == "moon":  # MOON exchanges the whole model: every client holds both modalities
        raw["modalities"] = {"name": "all", "missing_rate": {"features": 0.3, "image": 0.2}}
    rows = same_training(tmp_path, raw)
    last = rows[-1]
    if "accuracy" in last:  # the test set has masks: accuracy by missingness pattern is reported
        assert {"pattern/complete/accuracy", "pattern/no_features/accuracy",
                "pattern/no_image/accuracy"} <= set(last)


CREAM = {"data": {"name": "mfeat_pair", "public_fraction": 0.3},
         "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
         "algorithm": {"server_batch_size": 64}}


@pytest.mark.parametrize("loss", ["infonce", "pcme"])
def test_creamfl_contrastive_pairs_use_present_rows_only(tmp_path, loss):
    over = copy.deepcopy(CREAM)
    over["algorithm"] = {"name": "creamfl", "server_batch_size": 64, "multimodal_loss": loss}
    if loss == "pcme":
        over["model"]["uncertainty"] = True
    same_training(tmp_path, raw_config(tmp_path, "creamfl", **over), masked_sets=("test", "public"))


def test_partialfl_alignment_uses_present_rows_only(tmp_path):
    raw = raw_config(tmp_path, "partialfl", algorithm={"name": "partialfl", "shareable": "features"},
                     privacy={"modalities": {"image": "private", "features": "shareable"}, "labels": "private"})
    raw["modalities"] = {"name": "explicit", "holds": [["image", "features"], ["image", "features"], ["image"]],
                         "missing_rate": {"features": 0.3}}
    raw["partition"]["num_clients"] = 3
    same_training(tmp_path, raw)


# ----------------------------------------------------------------------------- one batch

META = DatasetMeta("tiny", 3, {"a": (1, 6, 6), "b": (3,)})


def tiny_client(data) -> MFedAvgClient:
    ctx = ClientContext(cid=0, rnd=0, seed=0, data=data, test_data=None, meta=META, train=TrainConfig(),
                        state={}, model_pool=None, modalities=("a", "b"))
    return MFedAvgClient(MFedAvgParams(), ctx)


def tiny_batch(b_present):
    g = torch.Generator().manual_seed(3)
    x = {"a": torch.randn(4, 1, 6, 6, generator=g), "b": torch.randn(4, 3, generator=g),
         PRESENT + "b": torch.tensor(b_present)}
    return x, torch.tensor([0, 1, 2, 1])


@pytest.mark.parametrize("fusion", ["concat", "sum", "film", "gated"])
def test_a_batch_where_every_row_lacks_a_modality_trains_none_of_its_branch(fusion):
    torch.manual_seed(0)
    model = MultimodalModel(dict(META.modalities), 3, feat_dim=4, cnn_channels=[2], mlp_hidden=[5], fusion=fusion,
                            two_projector=True)
    x, y = tiny_batch([False] * 4)
    x["b"] = torch.full_like(x["b"], GARBAGE)
    client = tiny_client(ArrayDataset(dict(x), y))
    loss = client.loss(model, x, y, Message())
    loss.backward()
    assert torch.isfinite(loss)
    for n, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), n
        if ".b." in n or n.startswith(("encoders.b", "heads.b", "proj.b", "infil.b")):
            # the probe of heads[b] must not train on rows lacking b (a masked_ce without the
            # mask gives heads.b.bias a gradient: tried by hand)
            assert p.grad is None or not p.grad.any(), n


def test_batch_norm_and_outputs_ignore_absent_rows():
    torch.manual_seed(0)
    model = MultimodalModel(dict(META.modalities), 3, feat_dim=4, cnn_channels=[2], mlp_hidden=[5])
    x, _ = tiny_batch([True] * 4)
    x[PRESENT + "a"] = torch.tensor([True, False, True, True])
    outs = []
    for v in (0.0, GARBAGE):
        m = copy.deepcopy(model).train()
        xi = dict(x)
        xi["a"] = x["a"].clone()
        xi["a"][1] = v
        out = m(xi)
        outs.append((out, m.encoders["a"].net[1].running_mean.clone()))
    (o0, bn0), (o1, bn1) = outs
    assert torch.equal(bn0, bn1)  # the BN statistics come from the present rows only
    assert torch.equal(o0["logits"], o1["logits"]) and torch.isfinite(o1["logits"]).all()
    assert not o1["mod_reps"]["a"][1].any()  # an absent row's representation is zero, never garbage


# ----------------------------------------------------------------------------- evaluation


def test_accuracy_by_pattern_and_head_accuracy_over_present_rows_by_hand():
    torch.manual_seed(0)
    model = MultimodalModel({"a": (3,), "b": (2,)}, 2, feat_dim=4, mlp_hidden=[5]).eval()
    n = 40
    g = torch.Generator().manual_seed(1)
    feats = {"a": torch.randn(n, 3, generator=g), "b": torch.randn(n, 2, generator=g)}
    pa = torch.rand(n, generator=g) > 0.3
    pb = (torch.rand(n, generator=g) > 0.3) | ~pa  # no row lacks both... then make two that do
    pb[:2], pa[:2] = False, False
    feats["a"][~pa], feats["b"][~pb] = 0, 0
    feats[PRESENT + "a"], feats[PRESENT + "b"] = pa, pb
    y = torch.randint(0, 2, (n,), generator=g)
    data = ArrayDataset(feats, y)
    row = evaluate_model(model, data, batch_size=7, num_classes=2)
    with torch.no_grad():
        out = model(feats)
    hit = out["logits"].argmax(1) == y
    for name, rows in (("complete", pa & pb), ("no_b", pa & ~pb), ("no_a", ~pa & pb), ("no_a+b", ~pa & ~pb)):
        assert row[f"pattern/{name}/n"] == int(rows.sum()) > 0
        assert row[f"pattern/{name}/accuracy"] == pytest.approx(float(hit[rows].double().mean()))
    for m, rows in (("a", pa), ("b", pb)):  # a head's accuracy: only the rows holding its modality
        head = out["mod_logits"][m].argmax(1) == y
        assert row[f"accuracy/{m}"] == pytest.approx(float(head[rows].double().mean()))
    assert row["accuracy"] == pytest.approx(float(hit.double().mean()))
    # without masks: no pattern keys (results of runs without missing modalities unchanged)
    plain = ArrayDataset({"a": feats["a"], "b": feats["b"]}, y)
    assert not [k for k in evaluate_model(model, plain, num_classes=2) if k.startswith("pattern/")]


def test_pattern_names_pooling_and_report_columns():
    assert pattern_name([]) == "complete" and pattern_name(["b", "a"]) == "no_a+b"
    pooled = pool_patterns([{"pattern/complete/accuracy": 0.5, "pattern/complete/n": 4},
                            {"pattern/complete/accuracy": 1.0, "pattern/complete/n": 4,
                             "pattern/no_a/accuracy": 0.0, "pattern/no_a/n": 2}])
    assert pooled == {"pattern/complete/accuracy": 0.75, "pattern/complete/n": 8,
                      "pattern/no_a/accuracy": 0.0, "pattern/no_a/n": 2}
    assert pattern_columns([{"pattern/no_a+b/accuracy": 1, "pattern/no_b/accuracy": 1,
                             "pattern/complete/accuracy": 1, "pattern/complete/n": 3}]) == ["complete", "no_b", "no_a+b"]


def test_a_branch_aggregation_weight_counts_the_samples_holding_its_modality():
    from mmfl.algorithms.fedavg import MODULE_WEIGHT
    x, y = tiny_batch([True, False, True, False])
    x[PRESENT + "a"] = torch.tensor([True, True, True, False])
    scalars = tiny_client(ArrayDataset(x, y)).reply_scalars(None, {})
    assert scalars["num_examples"] == 4
    for mod in ("encoders", "proj", "heads"):
        assert scalars[f"{MODULE_WEIGHT}{mod}.a."] == 3 and scalars[f"{MODULE_WEIGHT}{mod}.b."] == 2


def test_personalized_patterns_are_the_same_on_the_server_and_through_the_clients(tmp_path):
    import dataclasses

    raw = raw_config(tmp_path, "mfedavg", rounds=1)
    exp = experiment(raw)
    mask_rows(exp.federation.test, seed=5)
    exp.run()
    table = compare([exp.run_dir])  # mmfl report: the pattern accuracies as extra columns
    assert "acc complete" in table and "acc no_features" in table and "acc no_image" in table
    direct = exp.eval_context(0)
    routed = dataclasses.replace(direct, personal_rows=None, send=exp.transport.send)
    exp.transport.begin_round(1)
    a = exp.server.evaluate_personalized(direct)
    b = exp.server.evaluate_personalized(routed)
    assert a == b
    # the devices' rows pooled: per pattern, the counts add up to the devices' rows
    names = [k[len("pattern/"):-len("/n")] for k in a if k.startswith("pattern/") and k.endswith("/n")]
    assert "complete" in names and len(names) >= 2
    assert sum(a[f"pattern/{n}/n"] for n in names) == pytest.approx(
        a["personal_test_rows"] * sum(x is not None for x in a["client_accuracy"]))


def test_gca_scores_on_a_masked_public_set_ignore_the_rows_lacking_the_other_modality():
    from mmfl.algorithms.public_terms import global_local_contrastive_scores
    g = torch.Generator().manual_seed(2)
    local, glob = torch.randn(3, 6, 4, generator=g), torch.randn(6, 4, generator=g)
    keep = torch.tensor([True, False, True, True, False, True])
    full = global_local_contrastive_scores(local, glob, chunk=4, candidates=keep)
    sub = global_local_contrastive_scores(local[:, keep], glob[keep], chunk=4)
    assert torch.allclose(full[:, keep], sub, atol=1e-6)  # eq. 4 over the present candidates only
    glob2 = glob.clone()
    glob2[~keep] = GARBAGE
    assert torch.equal(global_local_contrastive_scores(local, glob2, chunk=4, candidates=keep)[:, keep], full[:, keep])
