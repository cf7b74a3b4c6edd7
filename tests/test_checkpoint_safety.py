"""Checkpoints and run folders that cannot lie (issue 15, item 6): a damaged newest
checkpoint is detected by its checksum and resume falls back to the newest intact one,
bit-exact; two writers on one folder; --overwrite of a folder that is not a run; and
file system errors (output_dir a file, a full disk, a damaged config.toml) as one line."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest
from conftest import patience
import torch

from mmfl.cli import main
from mmfl.engine import checkpoint, runfolder
from mmfl.engine.runner import Experiment
from mmfl.errors import MMFLError

from helpers import DIGITS as BASE, config as make_cfg, run as run_exp, experiment


def rows_of(run_dir) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("_time_s")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_same_run(a: Experiment, b: Experiment) -> None:
    assert rows_of(a.run_dir) == rows_of(b.run_dir)
    sa, sb = a.server.state_dict(), b.server.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    ca, cb = a.store.state_dict(), b.store.state_dict()
    assert ca.keys() == cb.keys()
    for k in ca:
        assert torch.equal(ca[k], cb[k]), k


def flip_bytes(path, n=392):
    data = bytearray(path.read_bytes())
    start = len(data) - n - 8  # tensor data, past the header: the file still parses
    for i in range(start, start + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def one_error_line(capsys, argv) -> str:
    rc = main(argv)
    _, err = capsys.readouterr()
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmfl: error: "), err
    return lines[0]


# ----------------------------------------------------------------------------- checksums, fallback

def test_meta_records_a_sha256_per_file_and_load_hides_it(tmp_path):
    exp = run_exp(tmp_path, "sums", rounds=1)
    path = exp.run_dir / "checkpoints" / "round_00001"
    raw = json.loads((path / "meta.json").read_text())
    assert raw["sha256"] == {name: checkpoint.sha256(path / name) for name in checkpoint.PIECE_FILES}
    assert checkpoint.damage(path) is None
    assert checkpoint.load(path)[2] == {"round": 1}


def a_piece(ckpt):
    """One client's piece that the checkpoint ``ckpt`` names (mmfl.engine.pieces)."""
    index = json.loads((ckpt / "clients.json").read_text())["pieces"]
    return ckpt.parent / "pieces" / f"{index[sorted(index)[0]]}.safetensors"


@pytest.mark.parametrize("kind", ["flipped", "truncated", "missing", "meta", "piece_missing", "piece_flipped",
                                  "index"])
def test_damaged_newest_checkpoint_falls_back_and_resumes_bit_exact(tmp_path, capsys, kind):
    # the property: resume from the newest intact checkpoint equals an uninterrupted run
    full = run_exp(tmp_path, "full", "keep_checkpoints=2", "algorithm.name=scaffold", rounds=4)
    d = run_exp(tmp_path, "hurt", "keep_checkpoints=2", "algorithm.name=scaffold", rounds=3).run_dir
    newest = d / "checkpoints" / "round_00003"
    if kind == "flipped":  # 392 bytes inside server.safetensors: still a valid file, other numbers
        flip_bytes(newest / "server.safetensors")
        checkpoint.load(newest, verify=False)  # it would load without the checksum
    elif kind == "truncated":
        p = newest / "clients.json"
        p.write_bytes(p.read_bytes()[:-5])
    elif kind == "missing":
        (newest / "clients.json").unlink()
    elif kind in ("piece_missing", "piece_flipped"):  # a piece only the newest checkpoint names
        older = json.loads((d / "checkpoints" / "round_00002" / "clients.json").read_text())["pieces"]
        index = json.loads((newest / "clients.json").read_text())["pieces"]
        p = d / "checkpoints" / "pieces" / f"{next(v for v in index.values() if v not in older.values())}.safetensors"
        if kind == "piece_missing":
            p.unlink()
        else:
            flip_bytes(p, n=8)
    elif kind == "index":
        (newest / "clients.json").write_text('{"pieces": {}}')
    else:
        (newest / "meta.json").write_text('{"round": 3, "sha2')
    assert checkpoint.damage(newest) is not None
    capsys.readouterr()
    resumed = run_exp(tmp_path, "hurt", "keep_checkpoints=2", "algorithm.name=scaffold", rounds=4, resume=True)
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if "resuming from" in line]
    assert len(said) == 1 and "round_00003" in said[0] and "round_00002" in said[0], err
    assert [r["round"] for r in rows_of(d)] == [1, 2, 3, 4]
    assert_same_run(full, resumed)
    assert checkpoint.damage(d / "checkpoints" / "round_00004") is None


def test_damaged_only_checkpoint_with_keep_1_is_one_error(tmp_path, capsys):
    exp = run_exp(tmp_path, "one", rounds=2)  # keep_checkpoints = 1: nothing older to fall back to
    flip_bytes(exp.run_dir / "checkpoints" / "round_00002" / "server.safetensors")
    metrics = (exp.run_dir / "metrics.jsonl").read_bytes()
    with pytest.raises(MMFLError, match="unreadable.*sha256.*keep_checkpoints >= 2"):
        run_exp(tmp_path, "one", rounds=3, resume=True)
    assert (exp.run_dir / "metrics.jsonl").read_bytes() == metrics  # nothing truncated


def test_disk_store_refuses_to_go_back(tmp_path):
    d = run_exp(tmp_path, "disk", "keep_checkpoints=2", "algorithm.name=scaffold", "state_store=\"disk\"",
                rounds=3).run_dir
    flip_bytes(d / "checkpoints" / "round_00003" / "server.safetensors")
    with pytest.raises(MMFLError, match="disk client-state store cannot go back to round_00002"):
        run_exp(tmp_path, "disk", "keep_checkpoints=2", "algorithm.name=scaffold", "state_store=\"disk\"",
                rounds=4, resume=True)


# ----------------------------------------------------------------------------- two writers

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0); os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("held", flush=True)
sys.stdin.read()
"""


def test_second_writer_fails_naming_the_folder_and_the_holder(tmp_path, capsys):
    d = run_exp(tmp_path, "busy", rounds=1).run_dir
    before = (d / "metrics.jsonl").read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d / runfolder.LOCK)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(MMFLError, match=f"{d}: run folder is in use by another mmfl process "
                                            f"\\(pid {holder.pid}\\)"):
            run_exp(tmp_path, "busy", rounds=2, resume=True)
        cfg = tmp_path / "c.toml"
        cfg.write_text("")
        line = one_error_line(capsys, ["run", str(cfg), "--no-progress", *sum((["--set", o] for o in BASE), []),
                                       "--set", f"output_dir={tmp_path}", "--set", "rounds=2",
                                       "--set", "name=busy", "--resume"])
        assert str(d) in line and f"pid {holder.pid}" in line
    finally:
        holder.stdin.close()
        holder.wait(timeout=patience(30))
    assert (d / "metrics.jsonl").read_bytes() == before  # the second writer wrote nothing
    run_exp(tmp_path, "busy", rounds=2, resume=True)  # released by the holder's exit
    assert [r["round"] for r in rows_of(d)] == [1, 2]


def test_lock_is_held_during_the_run_and_released_after(tmp_path):
    exp = experiment(make_cfg(tmp_path, "inproc", rounds=1))
    with runfolder.RunLock(exp.run_dir):  # another writer (this process, another open file)
        with pytest.raises(MMFLError, match=f"in use by another mmfl process \\(pid {os.getpid()}\\)"):
            exp.run()
    exp.run()
    with runfolder.RunLock(exp.run_dir):  # free again after the run
        pass


# ----------------------------------------------------------------------------- --overwrite

def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("years of work")
    (d / "config.toml").write_text('title = "not an mmfl config"\n')
    with pytest.raises(MMFLError, match="not a run folder of this mmfl"):
        run_exp(tmp_path, "mine", rounds=1, overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == ["config.toml", "thesis.tex"]  # not even a lock file
    assert (d / "thesis.tex").read_text() == "years of work"
    # an mmfl run is replaced, its lock file kept; a file the run did not write refuses (tests/test_overwrite.py)
    d2 = run_exp(tmp_path, "run", rounds=1).run_dir
    run_exp(tmp_path, "run", rounds=1, overwrite=True)
    assert (d2 / "config.toml").is_file() and (d2 / ".lock").is_file()


# ----------------------------------------------------------------------------- file system errors

def test_output_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    argv = ["run", str(cfg), "--no-progress", *sum((["--set", o] for o in BASE), []),
            "--set", f"output_dir={f}", "--set", "rounds=1", "--set", "name=r"]
    line = one_error_line(capsys, argv)
    assert str(f) in line and "Not a directory" in line and "output_dir" in line
    assert f.read_text() == "x"


def test_output_dir_under_proc_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    argv = ["run", str(cfg), "--no-progress", *sum((["--set", o] for o in BASE), []),
            "--set", "output_dir=/proc/mmfl-runs", "--set", "rounds=1", "--set", "name=r"]
    assert "/proc/mmfl-runs" in one_error_line(capsys, argv)


def test_full_disk_while_checkpointing_is_one_line_and_loses_nothing(tmp_path, capsys, monkeypatch):
    full = run_exp(tmp_path, "ref", "keep_checkpoints=2", rounds=3)
    d = run_exp(tmp_path, "enospc", "keep_checkpoints=2", rounds=2).run_dir
    before = sorted(p.name for p in (d / "checkpoints").iterdir())

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "save_file", no_space)
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    argv = ["run", str(cfg), "--no-progress", *sum((["--set", o] for o in BASE), []),
            "--set", f"output_dir={tmp_path}", "--set", "rounds=3", "--set", "name=enospc",
            "--set", "keep_checkpoints=2", "--resume"]
    line = one_error_line(capsys, argv)
    assert "No space left on device" in line and "--resume" in line
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == before  # no .tmp left, nothing pruned
    monkeypatch.undo()
    resumed = run_exp(tmp_path, "enospc", "keep_checkpoints=2", rounds=3, resume=True)
    assert_same_run(full, resumed)


def test_damaged_saved_config_is_one_line(tmp_path, capsys):
    d = run_exp(tmp_path, "cfgbad", rounds=1).run_dir
    (d / "config.toml").write_bytes(b"rounds = 1\n[algorithm\n\xff\xfe")
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    argv = ["run", str(cfg), "--no-progress", *sum((["--set", o] for o in BASE), []),
            "--set", f"output_dir={tmp_path}", "--set", "rounds=2", "--set", "name=cfgbad", "--resume"]
    line = one_error_line(capsys, argv)
    assert "config.toml" in line and "damaged" in line
    assert [r["round"] for r in rows_of(d)] == [1]  # untouched
