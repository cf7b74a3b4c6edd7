"""Preprocessing once (mmfl.data.cache): a second run loads instead of recomputing; the key
follows the input files' content and the settings; damaged entries are recomputed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import mmfl.data.idx as idx
from mmfl.data.cache import cache_dir, cached

sys.path.insert(0, str(Path(__file__).parent))
from data_fixtures import write_mnist_dir  # noqa: E402


class Counter:
    def __init__(self, fn=None):
        self.calls, self.fn = 0, fn

    def __call__(self, *a, **k):
        self.calls += 1
        return self.fn(*a, **k) if self.fn else {"x": torch.arange(6.0).reshape(2, 3)}


def test_second_call_does_not_recompute_and_key_follows_content_and_settings(tmp_path):
    src = tmp_path / "input.bin"
    src.write_bytes(b"abc")
    root = tmp_path / "cache"
    f = Counter()
    first = cached("feat", [src], {"n_mels": 64}, f, root=root)
    again = cached("feat", [src], {"n_mels": 64}, f, root=root)
    assert f.calls == 1 and torch.equal(first["x"], again["x"])
    cached("feat", [src], {"n_mels": 80}, f, root=root)  # other settings
    assert f.calls == 2
    cached("feat", [src], {"n_mels": 64}, f, version=2, root=root)  # other code version
    assert f.calls == 3
    os.utime(src, ns=(1, 1))  # same content, other mtime: hashed again, same key
    cached("feat", [src], {"n_mels": 64}, f, root=root)
    assert f.calls == 3
    src.write_bytes(b"abd")  # other content
    cached("feat", [src], {"n_mels": 64}, f, root=root)
    assert f.calls == 4
    for entry in (root / "feat").glob("*.safetensors"):  # damaged entries are recomputed
        entry.write_bytes(b"garbage")
    assert torch.equal(cached("feat", [src], {"n_mels": 64}, f, root=root)["x"], first["x"])
    assert f.calls == 5
    assert not list(root.rglob("*.tmp"))


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFL_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    src = tmp_path / "in.bin"
    src.write_bytes(b"x")
    cached("ns", [src], {}, Counter())
    assert list((tmp_path / "elsewhere" / "ns").glob("*.safetensors"))
    monkeypatch.delenv("MMFL_CACHE_DIR")
    assert cache_dir() == Path("~/.cache/mmfl").expanduser()


def test_idx_loader_decodes_each_file_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFL_CACHE_DIR", str(tmp_path / "cache"))
    write_mnist_dir(tmp_path / "mnist", n_train=30, n_test=10)
    reads = Counter(idx.read_idx)
    monkeypatch.setattr(idx, "read_idx", reads)
    a = idx.load_idx_dir(tmp_path / "mnist", "m")
    assert reads.calls == 4  # train/test images and labels
    b = idx.load_idx_dir(tmp_path / "mnist", "m")
    assert reads.calls == 4  # the second run loads the decoded tensors
    assert torch.equal(a.train.features["image"], b.train.features["image"])
    assert torch.equal(a.test.labels, b.test.labels) and b.train.labels.dtype == torch.int64
