"""Streaming aggregation (mmfl.core.streaming, Server.train_accumulator, SimulationTransport.send_stream):
a folding rule fed one update at a time equals the rule on the list; rules that need the whole
list have no fold and their servers keep the list path; a streamed round keeps at most one reply
alive; streamed runs resume bit for bit."""

from __future__ import annotations

import weakref

import pytest
import torch

import mmfl.engine.simulation as simulation
from mmfl.config import load_config
from mmfl.core.aggregation import AGGREGATION_RULES, aggregate
from mmfl.core.dp import central_dp_mean
from mmfl.core.streaming import CentralDPFold, foldable, make_fold
from mmfl.errors import ConfigError

from helpers import rows, run


BASE = ["data.name=digits", "partition.num_clients=4", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "train.batch_size=128", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"]
# two mfeat views, 2 of the 4 clients unimodal: the iot rule's per-update multimodal flag matters
MULTIMODAL = ["data.name=mfeat", 'data.views=["pix", "fou"]', "partition.num_clients=4", 'case="D"',
              "model.name=multimodal", "model.feat_dim=8", "model.mlp_hidden=[16]",
              "train.local_epochs=1", "train.batch_size=64", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"]


def _updates(n=5, seed=0):
    """Float32 model-like updates; the last two lack module 'b.' (clients without that modality),
    plus an integer key (BatchNorm's counter)."""
    g = torch.Generator().manual_seed(seed)
    ups = []
    for k in range(n):
        u = {"a.w": torch.randn(7, 3, generator=g), "a.b": torch.randn(3, generator=g),
             "n": torch.tensor(k % 3, dtype=torch.int64)}
        if k < n - 2:
            u["b.w"] = torch.randn(4, 4, generator=g)
        ups.append(u)
    return ups


def _previous(seed=1):
    g = torch.Generator().manual_seed(seed)
    return {"a.w": torch.randn(7, 3, generator=g), "a.b": torch.randn(3, generator=g),
            "b.w": torch.randn(4, 4, generator=g), "n": torch.tensor(0, dtype=torch.int64)}


def _fold(rule, updates, weights, previous, items=None, **kwargs):
    fold = make_fold(rule, previous, **kwargs)
    for k, (u, w) in enumerate(zip(updates, weights)):
        fold.add(u, w, **(items[k] if items else {}))
    return fold.finish()


def _assert_close(a, b):
    """Equal keys; floating values within 2 float32 ulps (the fold divides once at the end, the list
    rule scales each update first: float64 rounding apart); integer values equal."""
    assert a.keys() == b.keys()
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], rtol=2.5e-7, atol=1e-7)
        else:
            assert torch.equal(a[k], b[k]), k


def test_only_averaging_rules_declare_a_fold():
    folding = {n for n in AGGREGATION_RULES.names() if foldable(n)}
    assert folding == {"weighted_mean", "mean", "iot", "norm_clip"}
    for name in ("median", "trimmed_mean", "krum", "multi_krum", "bulyan", "norm_clip_adaptive"):
        assert make_fold(name, _previous()) is None


def test_streamed_weighted_mean_equals_the_list_rule_with_module_weights():
    ups = _updates()
    weights = [3.0, {"": 5.0, "b.": 2.0}, 1.0, 7.0, {"": 4.0, "b.": 0.0}]
    prev = _previous()
    _assert_close(_fold("weighted_mean", ups, weights, prev), aggregate("weighted_mean", ups, weights, prev))
    # without previous: only the keys the updates carry
    _assert_close(_fold("weighted_mean", ups, weights, None), aggregate("weighted_mean", ups, weights))


def test_streamed_mean_and_iot_equal_the_list_rules():
    ups, weights, prev = _updates(), [3.0, 5.0, 1.0, 7.0, 4.0], _previous()
    _assert_close(_fold("mean", ups, weights, prev), aggregate("mean", ups, weights, prev))
    mm = [True, False, False, True, False]
    out = _fold("iot", ups, weights, prev, items=[{"multimodal": m} for m in mm], multimodal_weight=100.0)
    _assert_close(out, aggregate("iot", ups, weights, prev, multimodal=mm, multimodal_weight=100.0))


def test_streamed_norm_clip_equals_the_list_rule():
    ups, weights, prev = _updates(), [3.0, 5.0, 1.0, 7.0, 4.0], _previous()
    for clip in (0.5, 100.0):  # most updates clipped / none
        _assert_close(_fold("norm_clip", ups, weights, prev, clip_norm=clip),
                      aggregate("norm_clip", ups, weights, prev, clip_norm=clip))


def test_streamed_central_dp_is_bit_exact():
    ups = [{k: v for k, v in u.items() if k != "b.w"} for u in _updates()]  # DP: every update the same keys
    prev = {k: v for k, v in _previous().items() if k != "b.w"}
    fold = CentralDPFold(prev, clip_norm=0.7, noise_multiplier=0.5, seed=11, denominator=6)
    for u in ups:
        fold.add(u, None)
    out = fold.finish()
    ref = central_dp_mean(ups, prev, 0.7, 0.5, 11, denominator=6)
    assert out.keys() == ref.keys() and all(torch.equal(out[k], ref[k]) for k in ref)


# ----------------------------------------------------------------------------- the engine

def _run(tmp_path, name, *over, rounds=2, resume=False, base=BASE):
    exp = run(tmp_path, name, *over, base=base, rounds=rounds, resume=resume)
    return exp, rows(exp)


def _plain(rows):
    return [{k: v for k, v in r.items() if not k.endswith("_time_s") and k != "replies_streamed"} for r in rows]


@pytest.mark.parametrize("extra", [[], ["algorithm.aggregation=mean"], ['dp.mode="central"', "dp.noise_multiplier=0.5"],
                                   ["algorithm.aggregation=norm_clip", "algorithm.aggregation_params={clip_norm=0.5}"],
                                   ['dp.mode="local"', "dp.noise_multiplier=0.5"],
                                   ['attack.kind="inflate_examples"', "attack.fraction=0.25"],
                                   ['attack.kind="sign_flip"', "attack.fraction=0.25"],
                                   ["batch_clients=true"], ["algorithm.name=moon"],
                                   ["algorithm.name=fedavgm"],  # a server_step after the fold
                                   ["algorithm.name=fedavgm", 'dp.mode="central"', "dp.noise_multiplier=0.5"],
                                   ["MULTIMODAL", "algorithm.name=fediot"]])
def test_streamed_run_equals_list_run_with_dp_and_attacks(tmp_path, extra):
    """Same bytes, dropped/rejected rows, losses and accuracy; the model within float rounding."""
    base = MULTIMODAL if extra[:1] == ["MULTIMODAL"] else BASE
    extra = [e for e in extra if e != "MULTIMODAL"]
    off, r_off = _run(tmp_path, "off", "stream_aggregation=off", *extra, base=base)
    on, r_on = _run(tmp_path, "on", "stream_aggregation=on", *extra, base=base)
    assert [r.get("replies_streamed") for r in r_on] == [r["clients_replied"] for r in r_off]
    assert all("replies_streamed" not in r for r in r_off)
    assert _plain(r_on) == _plain(r_off)
    _assert_close(on.server.state_dict(), off.server.state_dict())


def test_a_rule_without_fold_keeps_the_list_path_and_says_so(tmp_path, capsys):
    _, rows = _run(tmp_path, "median", "stream_aggregation=on", "algorithm.aggregation=median")
    assert all("replies_streamed" not in r for r in rows) and rows[-1]["clients_replied"] == 4
    assert "aggregation 'median' needs the whole list of replies; its rounds take the list path" in capsys.readouterr().err


def test_auto_streams_from_the_threshold(tmp_path, monkeypatch):
    _, rows = _run(tmp_path, "small", "stream_aggregation=auto")
    assert all("replies_streamed" not in r for r in rows)  # 4 clients < STREAM_FROM
    monkeypatch.setattr(simulation, "STREAM_FROM", 4)
    _, rows = _run(tmp_path, "large", "stream_aggregation=auto")
    assert [r["replies_streamed"] for r in rows] == [4, 4]


def test_a_streamed_round_keeps_at_most_one_reply_alive(tmp_path, monkeypatch):
    """Every reply (and one of its tensors) is tracked by weakref; when a client's reply is made,
    the replies made before it that are still alive are counted. Streaming: at most the previous
    one (the loop variable); the list path: all of them (the instrument works)."""
    orig = simulation.run_client
    alive: list = []
    most = {"now": 0}

    def tracked(*args, **kwargs):
        reply, state = orig(*args, **kwargs)
        most["now"] = max(most["now"], sum(1 for r, t in alive if r() is not None or t() is not None))
        alive.append((weakref.ref(reply), weakref.ref(next(iter(reply.arrays.values())))))
        return reply, state

    monkeypatch.setattr(simulation, "run_client", tracked)
    _run(tmp_path, "on", "stream_aggregation=on", "partition.num_clients=8", rounds=1)
    assert most["now"] <= 1
    alive.clear()
    _run(tmp_path, "off", "stream_aggregation=off", "partition.num_clients=8", rounds=1)
    assert most["now"] == 7


def test_streamed_run_resumes_bit_exact(tmp_path):
    over = ["stream_aggregation=on", "clients_per_round=3"]
    full, a = _run(tmp_path, "full", *over, rounds=4)
    _run(tmp_path, "split", *over, rounds=2)
    resumed, b = _run(tmp_path, "split", *over, rounds=4, resume=True)
    assert [r["round"] for r in b] == [1, 2, 3, 4] and all(r["replies_streamed"] == 3 for r in b)
    assert [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in a] == \
        [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in b]
    for k, v in full.server.state_dict().items():
        assert torch.equal(v, resumed.server.state_dict()[k]), k


def test_a_bad_stream_setting_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="stream_aggregation"):
        load_config(None, [*BASE, 'stream_aggregation="sometimes"'])
