"""``--overwrite`` deletes only what mmfl recorded writing (issue 27, item 2; mmfl.engine.runfiles):
a user's folder holding an experiment config and notes is refused with one line and left as it
was; a run folder with a file the run did not write is refused naming that file; a folder from
an mmfl without the marker is refused saying what to do; a real run is replaced."""

from __future__ import annotations

import json

import pytest

from mmfl.cli import main
from mmfl.engine import runfiles

TINY = ["data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "train.batch_size=128", "threads=1", "rounds=1"]

EXPERIMENT = """rounds = 5
[algorithm]
name = "fedavg"
[data]
name = "digits"
"""


def argv(tmp_path, name, *extra):
    sets = sum((["--set", o] for o in [*TINY, f"output_dir={tmp_path}", f"name={name}"]), [])
    return ["run", str(tmp_path / "cfg.toml"), "--no-progress", *sets, *extra]


def tree(d):
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))


def cli(args, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(args)
    return rc, capsys.readouterr().err.strip()


@pytest.fixture
def cfg(tmp_path):
    (tmp_path / "cfg.toml").write_text("")
    return tmp_path


def test_a_users_experiment_folder_is_refused_and_kept(cfg, capsys):
    d = cfg / "mine"
    (d / "data").mkdir(parents=True)
    (d / "config.toml").write_text(EXPERIMENT)  # what the old check took for a run (rounds + [algorithm])
    (d / "notes.md").write_text("what I tried")
    (d / "data" / "rows.csv").write_text("a,b\n1,2\n")
    before = {p: (d / p).read_bytes() for p in tree(d) if (d / p).is_file()}
    rc, err = cli(argv(cfg, "mine", "--overwrite"), capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "not a run folder of this mmfl" in err and "delete it by hand" in err
    assert {p: (d / p).read_bytes() for p in tree(d) if (d / p).is_file()} == before
    assert tree(d) == ["config.toml", "data", "data/rows.csv", "notes.md"]  # not even a lock file


def test_a_real_run_is_overwritten_and_a_foreign_file_refuses(cfg, capsys):
    assert cli(argv(cfg, "r"), capsys)[0] == 0
    d = cfg / "r"
    meta = json.loads((d / runfiles.MARKER).read_text())
    listing = (d / runfiles.LISTING).read_text().splitlines()
    assert {"config.toml", "metrics.jsonl", "checkpoints/", "summary.json"} <= set(listing)
    assert cli(["report", str(d)], capsys)[0] == 0 and "accuracy.png" in (d / runfiles.LISTING).read_text()
    first = tree(d)
    # a file or a folder the run did not write: refused naming it, nothing deleted
    for stray, named in (("notes.md", "notes.md"), ("sub/notes.md", "sub/")):
        (d / stray).parent.mkdir(exist_ok=True)
        (d / stray).write_text("mine")
        rc, err = cli(argv(cfg, "r", "--overwrite"), capsys)
        assert rc == 2 and len(err.splitlines()) == 1 and f"{d}: {named} was not written by this run" in err, err
        assert (d / stray).read_text() == "mine" and set(first) <= set(tree(d))
        (d / stray).unlink()
    (d / "sub").rmdir()
    # only mmfl's files left: replaced, with a new run id
    rc, err = cli(argv(cfg, "r", "--overwrite"), capsys)
    assert rc == 0, err
    assert json.loads((d / runfiles.MARKER).read_text())["run_id"] != meta["run_id"]
    assert not (d / "accuracy.png").exists() and (d / "summary.json").is_file()


def test_a_run_folder_without_the_marker_is_refused_with_what_to_do(cfg, capsys):
    assert cli(argv(cfg, "old"), capsys)[0] == 0
    d = cfg / "old"
    (d / runfiles.MARKER).unlink()  # as an mmfl from before the marker left it
    (d / runfiles.LISTING).unlink()
    before = tree(d)
    rc, err = cli(argv(cfg, "old", "--overwrite"), capsys)
    assert rc == 2 and "no .mmfl-run marker" in err and "move the folder away or delete it by hand" in err
    assert tree(d) == before
    # it still resumes (unmarked: record() writes no listing into it)
    rc, err = cli(argv(cfg, "old", "--resume", "--set", "rounds=2"), capsys)
    assert rc == 0, err
    assert not (d / runfiles.MARKER).exists()


def test_half_written_copies_and_owned_folders_count_as_the_runs(cfg, capsys):
    assert cli(argv(cfg, "r"), capsys)[0] == 0
    d = cfg / "r"
    (d / "metrics.jsonl.tmp").write_text("half")  # a crash inside atomic_write
    (d / "checkpoints" / "round_00002.tmp").mkdir()  # a crash inside checkpoint.save
    assert runfiles.first_unlisted(d) is None
    assert cli(argv(cfg, "r", "--overwrite"), capsys)[0] == 0
    assert not (d / "metrics.jsonl.tmp").exists() and not (d / "checkpoints" / "round_00002.tmp").exists()


def test_flower_overwrite_refuses_a_users_folder_before_flower_starts(cfg, capsys):
    d = cfg / "mine"
    d.mkdir()
    (d / "config.toml").write_text(EXPERIMENT)
    (d / "notes.md").write_text("what I tried")
    args = [a for a in argv(cfg, "mine", "--overwrite")[1:] if a != "--no-progress"]
    for cmd in ("simulate", "loopback"):
        rc, err = cli(["flower", cmd, *args], capsys)
        assert rc == 2 and len(err.splitlines()) == 1 and "not a run folder of this mmfl" in err, err
        assert tree(d) == ["config.toml", "notes.md"]


def test_a_users_files_inside_the_folders_mmfl_writes_refuse_and_stay(cfg, capsys):
    """A folder mmfl writes (checkpoints/, the tracker's tb/) is no licence for what is in it: a
    user's notes, a user's experiment folder and a nested file put there after the run each make
    --overwrite refuse, with one line naming them, nothing deleted; the tracker's own files
    (written by TensorBoard, not by mmfl) are listed and replaced."""
    assert cli(argv(cfg, "r", "--track", "tensorboard"), capsys)[0] == 0
    d = cfg / "r"
    listing = set((d / runfiles.LISTING).read_text().splitlines())
    assert any(p.startswith("tb/") and not p.endswith("/") for p in listing)  # TensorBoard's event file, by name
    assert any(p.startswith("checkpoints/round_") and not p.endswith("/") for p in listing)
    ckpt = sorted((d / "checkpoints").glob("round_?????"))[-1].relative_to(d).as_posix()
    strays = [("checkpoints/notes.md", "checkpoints/notes.md"),  # in the order of the (sorted) walk
              ("checkpoints/experiment/config.toml", "checkpoints/experiment/"),
              ("checkpoints/experiment/notes.md", "checkpoints/experiment/"),
              (f"{ckpt}/deep/er/mine.txt", f"{ckpt}/deep/"),
              ("tb/notes.md", "tb/notes.md")]
    for stray, _ in strays:
        (d / stray).parent.mkdir(parents=True, exist_ok=True)
        (d / stray).write_text(EXPERIMENT if stray.endswith(".toml") else "mine")
    for stray, named in strays:
        before = {p: (d / p).read_bytes() for p in tree(d) if (d / p).is_file()}
        rc, err = cli(argv(cfg, "r", "--overwrite"), capsys)
        assert rc == 2 and len(err.splitlines()) == 1 and f"{d}: {named} was not written by this run" in err, err
        assert {p: (d / p).read_bytes() for p in tree(d) if (d / p).is_file()} == before  # nothing deleted
        (d / stray).unlink()
        if not any((d / stray).parent.iterdir()):
            for up in [(d / stray).parent, *(d / stray).parent.parents]:
                if up == d or any(up.iterdir()):
                    break
                up.rmdir()
    rc, err = cli(argv(cfg, "r", "--overwrite"), capsys)
    assert rc == 0, err


def test_clear_deletes_only_listed_files_and_only_emptied_folders(tmp_path):
    """clear() itself (after the check, a file may still appear): listed files go, a folder goes
    only once empty, and an unlisted file at any depth stays with the folders holding it."""
    d = tmp_path / "run"
    d.mkdir()
    runfiles.start(d)
    runfiles.record(d, "a.txt", "ck/", "ck/r1/m.bin", "tb/", "tb/ev")
    for rel in ("a.txt", "ck/r1/m.bin", "tb/ev", "ck/r1/late.txt", "ck/user/deep/x.md"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(rel)
    assert runfiles.first_unlisted(d) == "ck/user/"  # a folder is named before the files below it
    runfiles.clear(d)
    assert tree(d) == ["ck", "ck/r1", "ck/r1/late.txt", "ck/user", "ck/user/deep", "ck/user/deep/x.md"]
