"""Progress a newcomer sees: clients done inside a round (sequential and batched delivery), the
run's ETA before round 1 ends, nothing with progress off, and one line before a slow
preprocessing step on a cache miss only."""

from __future__ import annotations

import numpy as np
import pytest

from mmfl.engine import progress as progress_mod
from mmfl.engine.progress import RunProgress, run_eta

from helpers import DIGITS, run

BASE = (*DIGITS, "partition.num_clients=4")


def test_run_eta_from_the_current_rounds_pace_then_from_finished_rounds():
    # round 1 half done after 10 s: a round takes 20 s; 10 s of it and 4 more rounds left
    assert run_eta(10.0, 0, 10.0, 0.5, 4) == pytest.approx(10.0 + 4 * 20.0)
    # 2 rounds took 30 s (15 s each), the current one has run 5 s, 3 rounds after it
    assert run_eta(35.0, 2, 5.0, 0.0, 3) == pytest.approx(10.0 + 3 * 15.0)
    assert run_eta(1.0, 0, 1.0, 0.0, 3) is None  # nothing done yet: no guess


class Recorder(RunProgress):
    """A RunProgress that also records every call (the bars still run, off a terminal)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.calls: list[tuple] = []

    def begin_send(self, route, n):
        self.calls.append(("send", self.rnd, route, n))
        super().begin_send(route, n)

    def advance(self, k=1):
        self.calls.append(("done", self.rnd, k))
        super().advance(k)


def _run(tmp_path, monkeypatch, *overrides):
    made = []

    def make(desc, start, total):
        made.append(Recorder(desc, start, total))
        return made[-1]

    import mmfl.engine.stages.progress_bar as progress_bar  # the Progress stage (mmfl.engine.pipeline)

    monkeypatch.setattr(progress_bar, "RunProgress", make)
    run(tmp_path, "p", *overrides, base=BASE, progress=True)
    return made


def test_each_client_of_a_round_advances_the_clients_bar(tmp_path, monkeypatch):
    (rec,) = _run(tmp_path, monkeypatch)
    for rnd in (0, 1):
        train = [c for c in rec.calls if c[1] == rnd]
        assert train[0] == ("send", rnd, "train", 4)
        assert sum(c[2] for c in train if c[0] == "done") == 4  # 4 clients, each reported once
    assert rec.done == 2 and rec.inner is None


def test_batched_clients_advance_the_bar_by_group(tmp_path, monkeypatch):
    (rec,) = _run(tmp_path, monkeypatch, "batch_clients=true")
    done = [c for c in rec.calls if c[0] == "done" and c[1] == 0]
    assert sum(c[2] for c in done) == 4 and len(done) == 1  # one stacked group of 4


def test_run_eta_appears_on_the_rounds_bar_before_round_one_ends(monkeypatch):
    p = RunProgress("x", 0, 10)
    p.begin_round(0)
    p.begin_send("train", 4)
    p.advance()
    assert p.postfix.get("run ETA", "").startswith("~")
    p.end_round({"accuracy": 0.5})
    assert "run ETA" not in p.postfix and p.postfix["acc"] == "0.5000"  # tqdm's ETA takes over
    p.close()


def test_progress_off_makes_no_bar(tmp_path, monkeypatch):
    monkeypatch.setattr(progress_mod.RunProgress, "__init__", lambda *a: pytest.fail("a bar was made"))
    exp = run(tmp_path, "q", base=BASE, rounds=1)
    assert exp.transport.progress is None


def test_slow_encoder_says_what_it_caches_on_a_miss_only(tmp_path, monkeypatch, capsys):
    import torch

    import mmfl.data.featurize as fz
    import mmfl.data.featurize_image as fzi

    monkeypatch.delenv("MMFL_QUIET", raising=False)
    monkeypatch.setattr(fzi, "_mobilenet_image", lambda arr, size: torch.zeros(len(arr), fz.MOBILENET_DIM))
    imgs = np.zeros((3, 8, 8, 1), np.uint8)
    fz.image_features(imgs, "mobilenet_v2", size=32, cache_root=tmp_path)
    err = capsys.readouterr().err
    assert err.startswith("mmfl: embedding 3 images with MobileNetV2 at 32x32 (first run only; cached in ")
    assert str(tmp_path / "image-features") in err
    fz.image_features(imgs, "mobilenet_v2", size=32, cache_root=tmp_path)  # a cache hit: silent
    assert capsys.readouterr().err == ""
    fz.image_features(imgs, "pixels:4", cache_root=tmp_path)  # a fast encoder: silent
    assert capsys.readouterr().err == ""
