"""Write the emoji image-text pairs (npm ``emoji-datasource-google@16.0.0``, fetched by
``scripts/setup.sh``) as a user's own paired set: ``manifest.csv`` with ``image`` (a path to
the 64x64 PNG), ``text`` (the emoji's name), ``label`` (its category) and ``split``
(``public`` / ``train`` / ``test``, drawn per category with a seed), so that the manifest can
be CreamFL's public paired set (``split = "public"`` rows) — the way you would lay out your
own image-caption pairs.

    python scripts/emoji_to_manifest.py OUT [--root DIR] [--public 0.5 --test 0.2]

Only the standard library is used. The PNGs are referenced where they are, not copied.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output folder for manifest.csv")
    default = Path(os.environ.get("MMFL_DATA_DIR", Path.home() / ".cache/mmfl/data")) / "emoji-datasource-google-16.0.0"
    ap.add_argument("--root", type=Path, default=default, help=f"the unpacked npm package (default {default})")
    ap.add_argument("--public", type=float, default=0.5, help="share of each category in the public split")
    ap.add_argument("--test", type=float, default=0.2, help="share of each category in the test split")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    pkg = a.root / "package" if (a.root / "package").is_dir() else a.root
    index = pkg / "emoji.json"
    if not index.is_file():
        sys.exit(f"emoji_to_manifest: {index} not found (run `bash scripts/setup.sh` or pass --root)")
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for e in json.loads(index.read_text(encoding="utf-8")):
        png = pkg / "img" / "google" / "64" / e["image"]
        if e.get("has_img_google") and png.is_file() and e.get("name"):
            by_cat[e["category"]].append({"image": str(png), "text": e["name"].capitalize(), "label": e["category"]})
    rng = random.Random(a.seed)
    rows = []
    for cat in sorted(by_cat):
        items = by_cat[cat]
        rng.shuffle(items)
        n_test, n_pub = round(a.test * len(items)), round(a.public * len(items))
        for i, it in enumerate(items):
            it["split"] = "test" if i < n_test else "public" if i < n_test + n_pub else "train"
            rows.append(it)
    a.out.mkdir(parents=True, exist_ok=True)
    with (a.out / "manifest.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["image", "text", "label", "split"])
        w.writeheader()
        w.writerows(rows)
    counts = {s: sum(r["split"] == s for r in rows) for s in ("public", "train", "test")}
    print(f"{a.out / 'manifest.csv'}: {len(rows)} pairs, {len(by_cat)} categories, {counts}")


if __name__ == "__main__":
    main()
