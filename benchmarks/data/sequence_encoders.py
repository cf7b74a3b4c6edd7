"""Sanity check of the sequence encoders on real variable-length data: FSDD spoken digits
(3,000 recordings at 8 kHz, 0.14-2.3 s) as log-mel frame sequences ``[n_mels, T_i]``,
zero-padded to ``max_frames`` with their lengths, classified by the ``multimodal`` model
with one modality and encoder ``conv1d`` / ``gru`` (both masked by the lengths) or the
flattening ``mlp`` of the padded ``[n_mels, max_frames]`` array (what a [C, T] shape got
before). Centralized training (one client), Adam, FSDD's usual split (recordings 0-4 of
each speaker and digit are the test set: 300 test, 2,700 train).

    nice -n 10 .venv/bin/python benchmarks/data/sequence_encoders.py [--epochs 8] [--seeds 0 1]

It checks that the encoders learn, not an ordering between them (two seeds).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # this checkout's mmfl
from mmfl.data.audio import LOG_EPS, mel_filterbank, read_wav_mono
from mmfl.data.base import LENGTH
from mmfl.models.multimodal import MultimodalModel

ROOT = Path("/work/shared/data/fsdd/recordings")
NAME = re.compile(r"(\d)_(\w+)_(\d+)\.wav")


def log_mel_frames(x: np.ndarray, n_mels: int, hop: int, n_fft: int = 256) -> torch.Tensor:
    """One recording ``[n]`` -> float32 ``[n_mels, 1 + n // hop]`` log-mel frames (Hann window,
    centred frames, :func:`mmfl.data.audio.mel_filterbank`, ``log(mel + 1e-6)``)."""
    w = torch.from_numpy(np.pad(x, (0, max(0, n_fft - len(x)))))
    spec = torch.stft(w, n_fft=n_fft, hop_length=hop, win_length=n_fft, window=torch.hann_window(n_fft),
                      center=True, pad_mode="constant", return_complex=True)
    power = spec.real.square() + spec.imag.square()
    return torch.log(mel_filterbank(n_mels, n_fft, 8000) @ power + LOG_EPS)


def load(n_mels: int, hop: int, max_frames: int):
    """(x_train, n_train, y_train, x_test, n_test, y_test): padded ``[N, n_mels, max_frames]``
    standardized with the train frames' scalar mean/std (padding stays 0), lengths, labels."""
    xs, ns, ys, test = [], [], [], []
    for p in sorted(ROOT.glob("*.wav")):
        d, _, i = NAME.fullmatch(p.name).groups()
        f = log_mel_frames(read_wav_mono(p), n_mels, hop)[:, :max_frames]
        xs.append(f), ns.append(f.shape[1]), ys.append(int(d)), test.append(int(i) < 5)
    test = np.array(test)
    train_frames = torch.cat([x for x, t in zip(xs, test) if not t], dim=1)
    mean, std = float(train_frames.mean()), float(train_frames.std())
    x = torch.zeros(len(xs), n_mels, max_frames)
    for k, f in enumerate(xs):
        x[k, :, : f.shape[1]] = (f - mean) / std
    n, y = torch.tensor(ns), torch.tensor(ys)
    tr, te = torch.from_numpy(~test), torch.from_numpy(test)
    return x[tr], n[tr], y[tr], x[te], n[te], y[te]


def run(kind: str, seed: int, data, epochs: int, batch: int, lr: float) -> tuple[float, float, int]:
    """(test accuracy, seconds, parameters) of one model trained from seed ``seed``."""
    xtr, ntr, ytr, xte, nte, yte = data
    torch.manual_seed(seed)
    model = MultimodalModel({"audio": tuple(xtr.shape[1:])}, 10, feat_dim=128, encoders={"audio": kind})
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    for _ in range(epochs):
        model.train()
        for rows in torch.randperm(len(ytr), generator=gen).split(batch):
            out = model({"audio": xtr[rows], LENGTH + "audio": ntr[rows]})
            loss = F.cross_entropy(out["logits"], ytr[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model({"audio": xte[r], LENGTH + "audio": nte[r]})["logits"].argmax(1)
                          for r in torch.arange(len(yte)).split(256)])
    return float((pred == yte).float().mean()), time.time() - t0, sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--kinds", nargs="+", default=["conv1d", "gru", "mlp"])
    ap.add_argument("--n-mels", type=int, default=40)
    ap.add_argument("--hop", type=int, default=128, help="STFT hop in samples (16 ms at 8 kHz)")
    ap.add_argument("--max-frames", type=int, default=150)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not ROOT.is_dir():
        sys.exit(f"{ROOT}: FSDD recordings not found (docs/data.md says where to get them)")
    data = load(a.n_mels, a.hop, a.max_frames)
    lengths = torch.cat([data[1], data[4]])
    print(f"FSDD: {len(data[2])} train / {len(data[5])} test, [{a.n_mels}, T_i] frames, T_i in "
          f"[{int(lengths.min())}, {int(lengths.max())}] (median {int(lengths.median())}), padded to {a.max_frames}")
    print("| encoder | params | " + " | ".join(f"seed {s}" for s in a.seeds) + " | mean | s / run |")
    print("|---|---|" + "---|" * len(a.seeds) + "---|---|")
    for kind in a.kinds:
        res = [run(kind, s, data, a.epochs, a.batch, a.lr) for s in a.seeds]
        accs = [100 * r[0] for r in res]
        print(f"| {kind} | {res[0][2]:,} | " + " | ".join(f"{v:.1f}" for v in accs)
              + f" | {np.mean(accs):.1f} | {np.mean([r[1] for r in res]):.0f} |", flush=True)


if __name__ == "__main__":
    main()
