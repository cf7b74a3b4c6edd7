"""The whole checkpoint chain is verified (issue 27, item 3): ``meta.json`` carries its own digest
over every field, the round included, so an edited round, a removed ``sha256`` table, another
field edited or added, or the digest removed is a damaged checkpoint: resume falls back to the
previous one with ``keep_checkpoints >= 2`` (bit-exact with an uninterrupted run) and is one
error line with ``keep_checkpoints = 1``. A checkpoint of an older mmfl (no digest, a folder
without the run marker) still resumes, with one warning line (the compat promise of
tests/test_resume_compat.py)."""

from __future__ import annotations

import json

import pytest

from mmfl.engine import checkpoint, runfiles
from mmfl.errors import MMFLError
from test_checkpoint_safety import assert_same_run, rows_of, run_exp


def edit(meta: dict, kind: str) -> dict:
    meta = dict(meta)
    if kind == "round":
        meta["round"] = meta["round"] - 1  # 2 -> 1: would replay round 2 on round 2's state
    elif kind == "sha256":
        del meta[checkpoint.SUMS]  # would fall back to unchecked loading
    elif kind == "field":
        meta["note"] = "added"
    elif kind == "sum":
        meta[checkpoint.SUMS] = {**meta[checkpoint.SUMS], "server.safetensors": "0" * 64}
    elif kind == "digest":
        del meta[checkpoint.META_SUM]
    return meta


KINDS = ["round", "sha256", "field", "sum", "digest"]


def tamper(run_dir, rnd: int, kind: str):
    p = run_dir / "checkpoints" / f"round_{rnd:05d}" / "meta.json"
    p.write_text(json.dumps(edit(json.loads(p.read_text()), kind)))
    assert checkpoint.damage(p.parent) is not None
    return p.parent


@pytest.mark.parametrize("kind", KINDS)
def test_an_edited_meta_with_keep_2_falls_back_bit_exact(tmp_path, capsys, kind):
    full = run_exp(tmp_path, "full", "keep_checkpoints=2", rounds=3)
    d = run_exp(tmp_path, "hurt", "keep_checkpoints=2", rounds=2).run_dir
    tamper(d, 2, kind)
    capsys.readouterr()
    resumed = run_exp(tmp_path, "hurt", "keep_checkpoints=2", rounds=3, resume=True)
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if "resuming from round_00001" in line]
    assert len(said) == 1 and "round_00002: meta.json" in said[0], err
    assert [r["round"] for r in rows_of(d)] == [1, 2, 3]
    assert_same_run(full, resumed)


@pytest.mark.parametrize("kind", KINDS)
def test_an_edited_meta_with_keep_1_is_one_line(tmp_path, kind):
    d = run_exp(tmp_path, "one", rounds=2).run_dir
    tamper(d, 2, kind)
    metrics = (d / "metrics.jsonl").read_bytes()
    with pytest.raises(MMFLError) as e:
        run_exp(tmp_path, "one", rounds=3, resume=True)
    line = str(e.value)
    assert "\n" not in line and "round_00002: meta.json" in line and "keep_checkpoints >= 2" in line
    assert (d / "metrics.jsonl").read_bytes() == metrics  # nothing changed


def test_the_digest_covers_every_field():
    meta = {"round": 2, "sha256": {"server.safetensors": "a", "clients.safetensors": "b"}}
    base = checkpoint.meta_digest(meta)
    assert checkpoint.meta_digest({**meta, checkpoint.META_SUM: "x"}) == base  # all but itself
    for changed in ({**meta, "round": 1}, {"round": 2}, {**meta, "x": 0},
                    {**meta, "sha256": {**meta["sha256"], "clients.safetensors": "c"}}):
        assert checkpoint.meta_digest(changed) != base


def test_an_older_mmfls_checkpoint_resumes_with_a_warning(tmp_path, capsys):
    full = run_exp(tmp_path, "full", rounds=3)
    d = run_exp(tmp_path, "old", rounds=2).run_dir
    (d / runfiles.MARKER).unlink()  # a run folder written by an mmfl from before the digest
    (d / runfiles.LISTING).unlink()
    p = d / "checkpoints" / "round_00002" / "meta.json"
    meta = json.loads(p.read_text())
    del meta[checkpoint.META_SUM]
    p.write_text(json.dumps(meta))
    assert checkpoint.damage(p.parent) is None and checkpoint.legacy(p.parent)
    capsys.readouterr()
    resumed = run_exp(tmp_path, "old", rounds=3, resume=True)
    warned = [line for line in capsys.readouterr().err.splitlines() if "older mmfl" in line]
    assert len(warned) == 1 and "round_00002" in warned[0]
    assert_same_run(full, resumed)
