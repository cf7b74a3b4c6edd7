"""The numbers docs/data.md quotes about the multimodal data sets and the frozen encoders.

    .venv/bin/python benchmarks/data/check.py            # probes and load times (~5 min)
    .venv/bin/python benchmarks/data/check.py --probes   # only the linear probes

- Linear probes (scikit-learn logistic regression on standardized inputs, train -> test),
  one per modality: how hard each modality of av_mnist and mfeat_pair is, and how the
  noise parameters of av_mnist change that.
- Load times of the data sets that run frozen encoders (MobileNetV2, MiniLM), with an empty
  preprocessing cache and then cached. One torch thread; timings depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch


def probe(train: torch.Tensor, y_train, test: torch.Tensor, y_test) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(train.flatten(1).numpy())
    clf = LogisticRegression(max_iter=300).fit(sc.transform(train.flatten(1).numpy()), y_train)
    return float(clf.score(sc.transform(test.flatten(1).numpy()), y_test))


def load(name: str, values: dict):
    from mmfl.data import DATASETS

    return DATASETS.get(name).factory(DATASETS.params(name, values))


def probes() -> None:
    for name, over in (("av_mnist", {}), ("av_mnist", {"image_noise": 1.0}), ("av_mnist", {"audio_noise": 0.05}),
                       ("mfeat_pair", {})):
        b = load(name, over)
        accs = {m: probe(b.train.features[m], b.train.label_array(), b.test.features[m], b.test.label_array())
                for m in b.meta.modalities}
        print(f"probe {name} {over or '(defaults)'}: " + ", ".join(f"{m} {a:.2f}" for m, a in accs.items()),
              flush=True)


def load_times() -> None:
    os.environ["MMFL_CACHE_DIR"] = tempfile.mkdtemp(prefix="mmfl-check-cache-")  # start empty
    for name in ("emoji_pairs", "fashion_mnist_features", "bbc_news"):
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            load(name, {})
            times.append(time.perf_counter() - t0)
        print(f"load {name}: {times[0]:.1f} s with an empty cache, {times[1]:.2f} s cached", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", action="store_true", help="only the linear probes")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    probes()
    if not args.probes:
        load_times()
    return 0


if __name__ == "__main__":
    sys.exit(main())
