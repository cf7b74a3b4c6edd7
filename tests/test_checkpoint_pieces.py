"""Checkpoints proportional to the round (issue 28, item 7): the memory store writes only the
clients saved since the last checkpoint, as content-addressed pieces (mmfl.engine.pieces), so the
bytes a checkpoint writes do not grow with the number of clients seen; pieces no kept checkpoint
names are removed; a missing or altered piece is caught and resume falls back; a run killed
mid-round resumes bit-exact."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmfl.engine import checkpoint, pieces
from mmfl.engine.state_store import ClientStateStore

from helpers import DIGITS, run

BASE = (*DIGITS, "partition.num_clients=20", "clients_per_round=2", "algorithm.name=moon", 'state_store="memory"')
run_exp = functools.partial(run, base=BASE)


def bytes_per_checkpoint(monkeypatch) -> list[int]:
    """Bytes each checkpoint.save writes: its round folder + the pieces it added."""
    sizes: list[int] = []
    save = checkpoint.save

    def counting(root, rnd, *a, **k):
        folder = Path(root) / pieces.DIR
        before = set(folder.iterdir()) if folder.is_dir() else set()
        final = save(root, rnd, *a, **k)
        new = [p for p in folder.iterdir() if p not in before] if folder.is_dir() else []
        sizes.append(sum(p.stat().st_size for p in [*final.iterdir(), *new]))
        return final

    monkeypatch.setattr(checkpoint, "save", counting)
    return sizes


def test_bytes_per_checkpoint_do_not_grow_with_the_clients_seen(tmp_path, monkeypatch):
    sizes = bytes_per_checkpoint(monkeypatch)
    run_exp(tmp_path, "pieces", rounds=5)
    exp = run_exp(tmp_path, "pieces", rounds=10, resume=True)  # a resumed run reuses the pieces it finds
    assert len(exp.store) >= 10  # clients seen grew from 2 to 10+ (MOON keeps each one's model)
    assert len(sizes) == 10 and max(sizes) <= 1.3 * sizes[0], sizes
    sizes.clear()  # the mechanism removed: every checkpoint rewrites every client seen, and grows
    monkeypatch.setattr(ClientStateStore, "incremental", False)
    run_exp(tmp_path, "whole", rounds=10)
    assert sizes[-1] > 3 * sizes[0], sizes


def test_pieces_no_kept_checkpoint_names_are_collected(tmp_path):
    exp = run_exp(tmp_path, "gc", "keep_checkpoints=2", rounds=6)
    root = exp.run_dir / "checkpoints"
    named = set()
    for ckpt in sorted(root.glob("round_?????")):
        named |= set(pieces.read_index(ckpt).values())
    assert {p.name for p in (root / "pieces").iterdir()} == {f"{d}.safetensors" for d in named}
    assert sorted(p.name for p in root.glob("round_?????")) == ["round_00005", "round_00006"]
    (root / "pieces" / "notes.txt").write_text("mine")  # not of a piece's form: never deleted
    run_exp(tmp_path, "gc", "keep_checkpoints=2", rounds=7, resume=True)
    assert (root / "pieces" / "notes.txt").read_text() == "mine"


def test_a_piece_named_by_the_only_checkpoint_missing_is_one_error(tmp_path):
    exp = run_exp(tmp_path, "one", rounds=2)
    ckpt = exp.run_dir / "checkpoints" / "round_00002"
    digest = sorted(pieces.read_index(ckpt).values())[0]
    (ckpt.parent / pieces.DIR / f"{digest}.safetensors").unlink()
    why = checkpoint.damage(ckpt)
    assert why is not None and digest in why and "missing" in why and "\n" not in why
    with pytest.raises(Exception, match="keep_checkpoints >= 2"):
        run_exp(tmp_path, "one", rounds=3, resume=True)


def _cli(tmp_path, name, rounds, resume=False):
    cmd = [sys.executable, "-m", "mmfl.cli", "run", str(tmp_path / "c.toml"), "--no-progress"]
    for o in [*BASE, f"output_dir={tmp_path}", f"name={name}", f"rounds={rounds}", "keep_checkpoints=2"]:
        cmd += ["--set", o]
    return cmd + (["--resume"] if resume else [])


def test_a_run_killed_mid_round_resumes_bit_exact(tmp_path):
    (tmp_path / "c.toml").write_text("")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    rounds = 8
    subprocess.run(_cli(tmp_path, "full", rounds), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(_cli(tmp_path, "killed", rounds), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    latest = tmp_path / "killed" / "checkpoints" / "LATEST"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if latest.is_file() and latest.read_text().strip() >= "round_00003":
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run(_cli(tmp_path, "killed", rounds, resume=True), check=True, env=env, capture_output=True)
    rows = [{k: v for k, v in json.loads(line).items() if not k.endswith("_time_s")}
            for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    want = [{k: v for k, v in json.loads(line).items() if not k.endswith("_time_s")}
            for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert rows == want
    a = checkpoint.load(checkpoint.latest(tmp_path / "full" / "checkpoints"))
    b = checkpoint.load(checkpoint.latest(tmp_path / "killed" / "checkpoints"))
    for x, y in ((a[0], b[0]), (a[1], b[1])):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k
