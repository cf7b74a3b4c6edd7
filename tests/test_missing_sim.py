"""Simulated missing modalities (train and test), missing labels, label noise and the
missing-row policy (mmfl.data.corruption, [modalities] and [corruption]): exact shares per
client, zeros in absent rows, the seeds, resume, `mmfl partition`'s table, one-line errors, and
that each mechanism reaches training."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmfl.cli import main
from mmfl.config import load_config
from mmfl.data import DATASETS
from mmfl.data.base import PRESENT
from mmfl.data.federation import build_federation

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = """\
name = "ms"
seed = 0
rounds = 1
threads = 1

[data]
name = "mfeat"
views = ["pix", "fou"]

[partition]
name = "dirichlet"
num_clients = 4
beta = 5.0

[modalities]
name = "all"

[model]
name = "multimodal"
feat_dim = 8
mlp_hidden = [16]

[algorithm]
name = "mfedavg"

[train]
local_epochs = 1
batch_size = 64
lr = 0.05
"""


@pytest.fixture
def cfg_path(tmp_path):
    p = tmp_path / "ms.toml"
    p.write_text(CONFIG)
    return p


def fed_of(path, *over):
    return build_federation(load_config(path, list(over)))


def rows_of(view) -> np.ndarray:
    return view.indices.numpy() if view.indices is not None else np.arange(len(view))


def absent(view, m) -> np.ndarray:
    """Bool over the view's rows: the sample lacks ``m``."""
    mask = view.features.get(PRESENT + m)
    return np.zeros(len(view), bool) if mask is None else ~mask.numpy()[rows_of(view)]


def loader_bundle(path):
    cfg = load_config(path)
    return DATASETS.get(cfg.data.name).factory(cfg.data.params)


def test_train_and_test_rates_are_exact_zeros_in_absent_rows_and_no_row_loses_all(cfg_path):
    fed = fed_of(cfg_path, "modalities.missing_rate={fou = 0.3, pix = 0.2}",
                 "modalities.test_missing_rate={fou = 0.5, pix = 0.25}")
    bundle = loader_bundle(cfg_path)  # the loader's own tensors (a cache hit): never written to
    assert all(bool(bundle.train.features[m].abs().sum(dim=1).gt(0).all()) for m in ("pix", "fou"))
    for c, view in enumerate(fed.clients):
        n = len(view)
        lack = {m: absent(view, m) for m in ("pix", "fou")}
        assert lack["fou"].sum() == round(0.3 * n) and lack["pix"].sum() == round(0.2 * n), c
        assert not (lack["fou"] & lack["pix"]).any()
        feats, _ = view.get()
        for m in ("pix", "fou"):
            assert float(feats[m][torch.from_numpy(lack[m])].abs().sum()) == 0.0  # a masked row carries no data
            kept = feats[m][torch.from_numpy(~lack[m])]
            assert torch.equal(kept, bundle.train.features[m][view.indices][torch.from_numpy(~lack[m])])
        assert fed.simulated[c]["lacking"] == {m: int(lack[m].sum()) for m in ("pix", "fou")}
    n = len(fed.test)
    lack = {m: absent(fed.test, m) for m in ("pix", "fou")}
    assert lack["fou"].sum() == round(0.5 * n) and lack["pix"].sum() == round(0.25 * n)
    assert not (lack["fou"] & lack["pix"]).any()
    feats, _ = fed.test.get()
    assert float(feats["fou"][torch.from_numpy(lack["fou"])].abs().sum()) == 0.0
    # only the test set: the clients keep every modality
    fed = fed_of(cfg_path, "modalities.test_missing_rate={fou = 0.5}")
    assert absent(fed.test, "fou").sum() == round(0.5 * len(fed.test))
    assert all(PRESENT + "fou" not in c.features for c in fed.clients)


def test_rates_above_one_in_sum_still_leave_every_row_a_modality(cfg_path, capsys):
    fed = fed_of(cfg_path, "modalities.missing_rate={fou = 0.7, pix = 0.7}",
                 "modalities.test_missing_rate={fou = 0.9, pix = 0.9}")
    for view, r in [*((c, 0.7) for c in fed.clients), (fed.test, 0.9)]:
        lack_pix, lack_fou = absent(view, "pix"), absent(view, "fou")
        assert not (lack_pix & lack_fou).any()  # the data set's first modality first, the other the rest
        assert lack_pix.sum() == round(r * len(view)) and lack_fou.sum() == len(view) - lack_pix.sum()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(x.startswith("mmfl: warning: modalities.") for x in err)
    assert "fewer train samples lack fou" in err[0] and "fewer test samples lack fou" in err[1]


def test_missing_labels_drop_the_right_count(cfg_path):
    base = fed_of(cfg_path)
    fed = fed_of(cfg_path, "corruption.label_missing_rate=0.25")
    for c, (b, view) in enumerate(zip(base.clients, fed.clients)):
        lost = round(0.25 * len(b))
        assert len(view) == len(b) - lost and fed.simulated[c]["labels_dropped"] == lost
        assert set(rows_of(view)) <= set(rows_of(b))
    assert fed.simulated[0]["labels_flipped"] == 0


@pytest.mark.parametrize("kind", ["symmetric", "pair"])
def test_label_noise_flips_the_share_with_the_mapping(cfg_path, kind):
    clean = loader_bundle(cfg_path).train.labels.numpy()
    fed = fed_of(cfg_path, f'corruption.label_noise={{rate = 0.2, kind = "{kind}"}}')
    seen_offsets = set()
    for c, view in enumerate(fed.clients):
        rows = rows_of(view)
        y = view.labels.numpy()[rows]
        flipped = y != clean[rows]
        assert flipped.sum() == round(0.2 * len(view)) == fed.simulated[c]["labels_flipped"]
        offsets = (y[flipped] - clean[rows][flipped]) % 10
        if kind == "pair":
            assert set(offsets) == {1}  # c -> c + 1 mod K
        seen_offsets |= set(offsets.tolist())
    if kind == "symmetric":
        assert seen_offsets == set(range(1, 10))  # every other class, none the same
    assert (loader_bundle(cfg_path).train.labels.numpy() == clean).all()  # the loader's labels untouched
    assert (fed.test.labels.numpy() == build_federation(load_config(cfg_path)).test.labels.numpy()).all()


def test_complete_rows_and_drop_modality_policies(cfg_path):
    rate = "modalities.missing_rate={fou = 0.4}"
    mask = fed_of(cfg_path, rate)
    comp = fed_of(cfg_path, rate, "modalities.missing_policy='complete_rows'")
    for c, (a, b) in enumerate(zip(mask.clients, comp.clients)):
        assert len(b) == len(a) - absent(a, "fou").sum() == len(a) - round(0.4 * len(a))
        assert not absent(b, "fou").any() and comp.simulated[c]["incomplete_dropped"] == absent(a, "fou").sum()
    drop = fed_of(cfg_path, rate, "modalities.test_missing_rate={fou = 0.4}",
                  "modalities.missing_policy='drop_modality:fou'")
    assert list(drop.meta.modalities) == ["pix"] and drop.client_modalities is None
    assert all(c.modalities == ["pix"] for c in [*drop.clients, drop.test])
    assert [len(c) for c in drop.clients] == [len(c) for c in mask.clients]
    pooled = build_federation(load_config(cfg_path, [rate, "modalities.missing_policy='complete_rows'"]), pooled=True)
    assert len(pooled.clients[0]) == sum(len(c) for c in comp.clients)


def test_same_seed_same_draws_other_seed_other_draws(cfg_path):
    over = ["modalities.missing_rate={fou = 0.3}", "modalities.test_missing_rate={pix = 0.3}",
            "corruption.label_missing_rate=0.1", 'corruption.label_noise={rate = 0.2, kind = "symmetric"}']

    def draws(seed):
        fed = fed_of(cfg_path, *over, f"seed={seed}")
        return ([rows_of(c).tolist() for c in fed.clients], [absent(c, "fou").tolist() for c in fed.clients],
                [c.label_array().tolist() for c in fed.clients], absent(fed.test, "pix").tolist())

    a, b, other = draws(0), draws(0), draws(1)
    assert a == b
    assert all(x != y for x, y in zip(a, other))


def test_resume_draws_the_same(cfg_path, tmp_path, capsys):
    over = ["--set", f"output_dir={tmp_path / 'runs'}", "--set", "modalities.missing_rate={fou = 0.4}",
            "--set", "modalities.test_missing_rate={fou = 0.4}", "--set", "corruption.label_missing_rate=0.1",
            "--set", 'corruption.label_noise={rate = 0.2, kind = "pair"}']
    assert main(["run", str(cfg_path), "--no-progress", *over, "--set", "name=whole", "--set", "rounds=2"]) == 0
    assert main(["run", str(cfg_path), "--no-progress", *over, "--set", "name=cut", "--set", "rounds=1"]) == 0
    assert main(["run", str(cfg_path), "--no-progress", *over, "--set", "name=cut", "--set", "rounds=2",
                 "--resume"]) == 0
    capsys.readouterr()
    rows = {n: [json.loads(x) for x in (tmp_path / "runs" / n / "metrics.jsonl").read_text().splitlines()]
            for n in ("whole", "cut")}
    last = {n: r[-1] for n, r in rows.items()}
    assert last["whole"]["round"] == last["cut"]["round"] == 2
    assert last["whole"]["accuracy"] == last["cut"]["accuracy"]
    assert last["whole"]["train_loss"] == pytest.approx(last["cut"]["train_loss"], rel=1e-6)
    saved = (tmp_path / "runs" / "cut" / "config.toml").read_text()
    assert "test_missing_rate" in saved and "[corruption]" in saved and "label_missing_rate = 0.1" in saved


def test_partition_prints_modalities_and_simulation_columns(cfg_path, tmp_path, capsys):
    png = tmp_path / "p.png"
    rc = main(["partition", str(cfg_path), "--plot", str(png), "--set", "modalities.missing_rate={fou = 0.5}",
               "--set", "modalities.test_missing_rate={pix = 0.25}", "--set", "corruption.label_missing_rate=0.1",
               "--set", 'corruption.label_noise={rate = 0.2, kind = "pair"}'])
    out = capsys.readouterr().out
    assert rc == 0 and png.stat().st_size > 0
    header = next(x for x in out.splitlines() if x.startswith("client  holds"))
    for col in ("rows", "lacking pix", "lacking fou", "labels dropped", "labels flipped"):
        assert col in header
    fed = fed_of(cfg_path, "modalities.missing_rate={fou = 0.5}", "modalities.test_missing_rate={pix = 0.25}",
                 "corruption.label_missing_rate=0.1", 'corruption.label_noise={rate = 0.2, kind = "pair"}')
    line0 = next(x for x in out.splitlines() if x.split()[:2] == ["0", "pix+fou"]).split()
    s = fed.simulated[0]
    assert line0[2:] == [str(v) for v in (s["rows"], 0, s["lacking"]["fou"], s["labels_dropped"], s["labels_flipped"])]
    assert f"test: {len(fed.test)} rows; lacking pix {round(0.25 * len(fed.test))}" in out
    # explicit holds: the holds column names each client's modalities, '-' where it lacks one
    rc = main(["partition", str(cfg_path), "--set",
               'modalities={name = "explicit", holds = [["pix", "fou"], ["fou"], ["pix"], ["pix"]]}'])
    out = capsys.readouterr().out
    assert rc == 0
    lines = {x.split()[0]: x.split() for x in out.splitlines() if x.split()[:1] in (["0"], ["1"], ["2"])
             and len(x.split()) == 5}
    assert lines["1"][1] == "fou" and lines["1"][3] == "-" and lines["2"][1] == "pix" and lines["2"][4] == "-"


@pytest.mark.parametrize("over, fragment", [
    ("modalities.missing_rate={fou = 1.0}", "modalities.missing_rate.fou: must be in [0, 1)"),
    ("modalities.test_missing_rate={fou = -0.1}", "modalities.test_missing_rate.fou: must be in [0, 1)"),
    ("modalities.test_missing_rate={audio = 0.1}", "modalities.test_missing_rate: unknown modality 'audio'"),
    ("modalities.missing_policy='drop'", "modalities.missing_policy: must be 'mask', 'complete_rows'"),
    ("modalities.missing_policy='drop_modality:audio'", "modalities.missing_policy: unknown modality 'audio'"),
    ("corruption.label_missing_rate=1.0", "corruption.label_missing_rate: must be in [0, 1)"),
    ("corruption.label_noise={rate = 1.5}", "corruption.label_noise.rate: must be in [0, 1)"),
    ("corruption.label_noise={rate = 0.1, kind = 'asym'}", "corruption.label_noise.kind: must be"),
    ("corruption.label_noise={rate = 0.1, knd = 'pair'}", "corruption.label_noise.knd: unknown key"),
    ("corruption.label_rate=0.1", "corruption.label_rate: unknown key"),
    ("corruption=0.1", "corruption: must be a table"),
])
def test_each_bad_option_is_one_error_line(cfg_path, capsys, over, fragment):
    rc = main(["partition", str(cfg_path), "--set", over])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("mmfl: error: ") and fragment in err, err


def test_drop_modality_refuses_clients_holding_only_that_modality(cfg_path, capsys):
    rc = main(["partition", str(cfg_path), "--set", 'modalities={name = "explicit", holds = [["pix", "fou"], '
               '["fou"], ["pix"], ["pix"]], missing_policy = "drop_modality:fou"}'])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "client(s) 1 with no modality" in err, err


def _final(tmp_path, name, *over) -> dict:
    assert main(["run", str(tmp_path / "ms.toml"), "--no-progress", "--set", f"output_dir={tmp_path / 'runs'}",
                 "--set", f"name={name}", *[x for o in over for x in ("--set", o)]]) == 0
    return json.loads((tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()[-1])


def test_each_mechanism_reaches_training_and_evaluation(cfg_path, tmp_path, capsys, monkeypatch):
    from mmfl.models.multimodal import MultimodalModel

    seen = []
    forward = MultimodalModel.forward

    def spy(self, inputs):  # every batch a model sees, in training and evaluation
        if self.training and PRESENT + "fou" in inputs and "fou" in inputs:
            gone = ~inputs[PRESENT + "fou"]
            seen.append((int(gone.sum()), float(inputs["fou"][gone].abs().sum())))
        return forward(self, inputs)

    monkeypatch.setattr(MultimodalModel, "forward", spy)
    base = _final(tmp_path, "base")
    masked = _final(tmp_path, "train", "modalities.missing_rate={fou = 0.5}")
    assert sum(n for n, _ in seen) > 0 and all(s == 0.0 for _, s in seen)  # absent rows reach training as zeros
    assert masked["train_loss"] != base["train_loss"]
    test_only = _final(tmp_path, "test", "modalities.test_missing_rate={fou = 0.5}")
    assert test_only["train_loss"] == base["train_loss"]  # the clients' rows are untouched
    assert (test_only["accuracy"], test_only["test_loss"]) != (base["accuracy"], base["test_loss"])
    for name, over in [("complete", ("modalities.missing_rate={fou = 0.5}", "modalities.missing_policy='complete_rows'")),
                       ("dropped", ("modalities.missing_policy='drop_modality:fou'",)),
                       ("nolabels", ("corruption.label_missing_rate=0.5",)),
                       ("noise", ('corruption.label_noise={rate = 0.4, kind = "pair"}',))]:
        row = _final(tmp_path, name, *over)
        assert row["train_loss"] not in (base["train_loss"], masked["train_loss"]), name
    capsys.readouterr()
