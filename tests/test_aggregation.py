"""Aggregation rules (mmfl.core.aggregation): each rule on tiny tensors against a hand computation,
and the table used by name from the config."""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.config import load_config
from mmfl.core.aggregation import AGGREGATION_RULES, aggregate
from mmfl.errors import ConfigError

from helpers import run


def _updates():
    a = {"w": torch.tensor([1.0, 2.0]), "enc.img": torch.tensor([4.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}  # b holds no image encoder
    return [a, b]


def test_weighted_mean_is_data_weighted_per_key_over_holders_by_hand():
    prev = {"w": torch.zeros(2), "enc.img": torch.tensor([9.0]), "enc.txt": torch.tensor([7.0]),
            "n": torch.tensor(0)}
    out = aggregate("weighted_mean", _updates(), [1.0, 3.0], prev)
    assert torch.allclose(out["w"], torch.tensor([(1 + 9) / 4, (2 + 18) / 4]))  # (1*a + 3*b) / 4
    assert torch.equal(out["enc.img"], torch.tensor([4.0]))  # only a holds it
    assert torch.equal(out["enc.txt"], torch.tensor([7.0]))  # nobody sent it: keeps its value
    assert int(out["n"]) == 5  # integer buffers take the maximum


def test_weighted_mean_uses_the_longest_module_prefix_weight():
    ups = [{"enc.img": torch.tensor([0.0]), "head": torch.tensor([0.0])},
           {"enc.img": torch.tensor([4.0]), "head": torch.tensor([4.0])}]
    out = aggregate("weighted_mean", ups, [{"": 1.0, "enc.img": 3.0}, {"": 1.0, "enc.img": 1.0}])
    assert float(out["enc.img"]) == pytest.approx(1.0)  # (3*0 + 1*4) / 4
    assert float(out["head"]) == pytest.approx(2.0)  # (1*0 + 1*4) / 2


def test_mean_ignores_data_weights_by_hand():
    out = aggregate("mean", _updates(), [1.0, 3.0])
    assert torch.allclose(out["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(out["enc.img"], torch.tensor([4.0]))


def test_iot_multiplies_multimodal_weights_by_hand():
    out = aggregate("iot", _updates(), [3.0, 5.0], multimodal=[True, False], multimodal_weight=100.0)
    assert torch.allclose(out["w"], (300 * torch.tensor([1.0, 2.0]) + 5 * torch.tensor([3.0, 6.0])) / 305)


def test_unknown_rule_is_a_config_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.aggregation"):
        load_config(None, ["algorithm.name=fedavg", "algorithm.aggregation=medain", f"output_dir={tmp_path}"])
    assert {"weighted_mean", "mean", "iot"} <= set(AGGREGATION_RULES.names())


def _run(tmp_path, name, *over):  # the default config (digits, the default model), 4 clients, 2 rounds
    return run(tmp_path, name, *over, base=("threads=1", "partition.num_clients=4"), rounds=2).server.model.state_dict()


def test_fedavg_with_the_rule_named_explicitly_equals_the_default(tmp_path):
    a = _run(tmp_path, "default", "algorithm.name=fedavg")
    b = _run(tmp_path, "named", "algorithm.name=fedavg", "algorithm.aggregation=weighted_mean")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = _run(tmp_path, "mean", "algorithm.name=fedavg", "algorithm.aggregation=mean")
    assert any(not torch.equal(a[k], c[k]) for k in a)  # the name is used (unequal client sizes)


# ----------------------------------------------------------------------------- representation rules (CreamFL family)

def _reps():
    # three clients' representations of P = 2 public samples, d = 2; client 0 holds the whole pair
    return [{"image": torch.tensor([[1.0, 0.0], [0.0, 2.0]])},
            {"image": torch.tensor([[0.0, 1.0], [1.0, 1.0]])},
            {"image": torch.tensor([[3.0, 0.0], [0.0, 0.5]])}]


def test_rep_mean_avg_iot_are_per_sample_means_in_float32_by_hand():
    ups, info = _reps(), {}
    out = aggregate("rep_mean", ups, [2.0, 3.0, 5.0], info=info)["image"]
    assert out.dtype == torch.float32
    assert torch.allclose(out, torch.tensor([[4 / 3, 1 / 3], [1 / 3, 3.5 / 3]]))
    assert info["weight_max/image"] == pytest.approx(1 / 3)  # uniform
    out = aggregate("rep_avg", ups, [2.0, 3.0, 5.0])["image"]
    assert torch.allclose(out, torch.tensor([[(2 + 15) / 10, 3 / 10], [3 / 10, (4 + 3 + 2.5) / 10]]))
    out = aggregate("rep_iot", ups, [2.0, 3.0, 5.0], multimodal=[True, False, False], multimodal_weight=100.0)
    assert torch.allclose(out["image"], torch.tensor([[(200 + 15) / 208, 3 / 208], [3 / 208, (400 + 3 + 2.5) / 208]]))


def test_gca_rule_by_hand():
    # eq. 4: s = x.g_k - log sum_j exp(x.g_j) against the *other* modality's global reps; eq. 5-6
    ups = [{"image": torch.tensor([[1.0], [0.0]])}, {"image": torch.tensor([[0.5], [1.0]])}]
    glob = {"image": torch.zeros(2, 1), "text": torch.tensor([[1.0], [2.0]])}
    out = aggregate("gca", ups, [1.0, 1.0], global_reps=glob, pair=("image", "text"))["image"]
    s = [[1 - math.log(math.e + math.e ** 2), 0 - math.log(2)],
         [0.5 - math.log(math.exp(0.5) + math.exp(1.0)), 2 - math.log(math.exp(1) + math.exp(2))]]
    for k, (x0, x1) in enumerate([(1.0, 0.5), (0.0, 1.0)]):
        a0 = math.exp(s[0][k]) / (math.exp(s[0][k]) + math.exp(s[1][k]))
        assert out[k, 0].item() == pytest.approx(a0 * x0 + (1 - a0) * x1, rel=1e-5)
    with pytest.raises(ValueError, match="global_reps"):
        aggregate("gca", ups, [1.0, 1.0])


def test_fedet_variance_and_fedgems_entropy_rules_by_hand():
    ups = [{"image": torch.tensor([[1.0, 0.0, 0.0]])}, {"image": torch.tensor([[1.0, 1.0, 1.0]])},
           {"image": torch.tensor([[3.0, 0.0, 0.0]])}]  # C = 3, P = 1, d = 3
    var = [1 / 3, 0.0, 3.0]  # unbiased variance over d
    out = aggregate("fedet_variance", ups, [1.0] * 3)["image"]
    assert out[0].tolist() == pytest.approx([(var[0] * 1 + var[1] * 1 + var[2] * 3) / sum(var),
                                             var[1] / sum(var), var[1] / sum(var)])
    # entropies of softmax(rep): 0.98, 1.10, 0.37 -> only client 2 is at or below the mean
    assert torch.equal(aggregate("fedgems_entropy", ups, [1.0] * 3)["image"], torch.tensor([[3.0, 0.0, 0.0]]))


def _creamfl_server(aggregation, holds):
    from types import SimpleNamespace

    from mmfl.algorithms.creamfl import CreamFLParams, CreamFLServer

    server = CreamFLServer.__new__(CreamFLServer)
    server.params, server.pair = CreamFLParams(aggregation=aggregation), ("image", "text")
    server.ctx = SimpleNamespace(modalities_of=lambda c: holds[c])
    return server


def _old_aggregate_reps(p, pair, replies, glob, holds):
    """CreamFLServer.aggregate_reps as it was before the rule table (the 6-way if/elif), for bit-identity."""
    from mmfl.algorithms.creamfl_terms import entropy_selection_weights, variance_weights
    from mmfl.algorithms.public_terms import aggregate_representations, global_local_contrastive_scores

    agg, info = {}, {}
    for m in pair:
        cids = [c for c in sorted(replies) if "rep/" + m in replies[c].arrays]
        if not cids:
            continue
        local = torch.stack([replies[c].arrays["rep/" + m].float() for c in cids])
        other = pair[1] if m == pair[0] else pair[0]
        if p.aggregation == "gca":
            w = torch.softmax(global_local_contrastive_scores(local, glob[other], p.chunk, p.exclude_positive), dim=0)
        elif p.aggregation == "mean":
            w = torch.full((len(cids), local.shape[1]), 1.0 / len(cids))
        elif p.aggregation in ("avg", "iot"):
            raw = torch.tensor([float(replies[c].scalars["num_examples"]) * (
                float(p.iot_weight) if p.aggregation == "iot" and set(pair) <= set(holds[c]) else 1.0)
                for c in cids], dtype=torch.float32)
            w = (raw / raw.sum()).unsqueeze(1).expand(-1, local.shape[1])
        elif p.aggregation == "variance":
            w = variance_weights(local)
        else:
            w = entropy_selection_weights(local, p.entropy_temperature)
        agg[m] = aggregate_representations(local, w)
        info[f"clients/{m}"] = len(cids)
        info[f"weight_max/{m}"] = float(w.max(0).values.mean())
    return agg, info


@pytest.mark.parametrize("name", ["gca", "mean", "avg", "iot", "variance", "entropy"])
def test_creamfl_aggregation_names_give_bit_identical_output_to_the_old_if_elif(name):
    from mmfl.algorithms.creamfl import AGGREGATIONS
    from mmfl.core.message import Message

    gen = torch.Generator().manual_seed(0)
    holds = [("image", "text"), ("image",), ("text",), ("image", "text")]
    P, d = 37, 8
    replies = {c: Message(arrays={f"rep/{m}": torch.nn.functional.normalize(torch.randn(P, d, generator=gen), dim=-1)
                                  for m in holds[c]}, scalars={"num_examples": 10 + 7 * c}) for c in range(4)}
    glob = {m: torch.nn.functional.normalize(torch.randn(P, d, generator=gen), dim=-1) for m in ("image", "text")}
    server = _creamfl_server(name, holds)
    agg, info = server.aggregate_reps(replies, glob)
    old_agg, old_info = _old_aggregate_reps(server.params, server.pair, replies, glob, holds)
    assert list(agg) == list(old_agg) == ["image", "text"]
    assert all(torch.equal(agg[m], old_agg[m]) for m in agg)
    assert list(info.items()) == list(old_info.items())  # same values, same order (metrics.jsonl)
    # the table's rule named directly is the same rule
    direct, _ = _creamfl_server(AGGREGATIONS[name], holds).aggregate_reps(replies, glob)
    assert all(torch.equal(direct[m], agg[m]) for m in agg)


def test_creamfl_unknown_aggregation_is_one_config_error_line(tmp_path):
    with pytest.raises(ConfigError, match="^algorithm.aggregation: unknown aggregation rule 'medain'"):
        load_config(None, ["algorithm.name=creamfl", "algorithm.aggregation=medain", f"output_dir={tmp_path}"])
    assert {"gca", "rep_mean", "rep_avg", "rep_iot", "fedet_variance", "fedgems_entropy"} <= set(AGGREGATION_RULES.names())


def test_a_representation_rule_is_refused_where_model_states_are_averaged():
    """A per-sample representation rule (CreamFL's family) named for a FedAvg-family server is a
    config error naming the field, not a failure at run time; CreamFL accepts it."""
    from mmfl.config import load_config
    from mmfl.errors import ConfigError

    with pytest.raises(ConfigError, match="algorithm.aggregation: rule 'gca' combines per-sample"):
        load_config(None, ["algorithm.name=fedavg", 'algorithm.aggregation="gca"'])
    cfg = load_config(None, ["data.name=emoji_pairs", "algorithm.name=creamfl", 'algorithm.aggregation="fedet_variance"'])
    assert cfg.algorithm.params.aggregation == "fedet_variance"
