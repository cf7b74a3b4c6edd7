"""A small VQA set in VQA v2's released format, built from real emoji images (npm
``emoji-datasource-google@16.0.0``, the images of ``emoji_pairs``), with **templated** questions.

:func:`write_emoji_vqa` writes, under ``out``::

    v2_OpenEnded_mscoco_train2014_questions.json   v2_mscoco_train2014_annotations.json
    v2_OpenEnded_mscoco_val2014_questions.json     v2_mscoco_val2014_annotations.json
    train2014/COCO_train2014_<12-digit id>.jpg     val2014/COCO_val2014_<12-digit id>.jpg

``train2014`` holds the emoji of ``emoji_pairs``' ``train`` split (the image-text clients'
private pairs), ``val2014`` those of its ``test`` split; neither holds an emoji of the
``public`` split the CreamFL server trains on (:func:`emoji_splits` reproduces
``emoji_pairs``' split for the run's data parameters). Only base emoji are used (no
skin-tone variants). Each image is the 64x64 PNG composited on white (as ``emoji_pairs``
composites it), saved as a JPEG (quality 95, no chroma subsampling); its image id is the emoji's position in
Unicode order plus one.

Three questions per image, from emoji.json's fields (``question_type`` is the template):

* "what category is this emoji?" -> its category, lower-cased ("food & drink"); ``other``;
* "what subcategory is this emoji?" -> its subcategory ("animal-mammal", which the answer
  normalisation turns into "animal mammal"); ``other``;
* "is this emoji in the category <c>?" -> "yes" or "no"; ``c`` is the emoji's own category or,
  with probability 1/2 (seeded per emoji), another one drawn uniformly; ``yes/no``.

The ten "human" answers of a question are all the same answer: emoji.json gives one category
and one subcategory per emoji, so there is no real annotator disagreement to reproduce (a
"what is this?" question answered by the name and short names would vary, but the names of
unseen emoji are never in a vocabulary built from other emoji, so it is left out).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np

from mmfl.data.emoji import EmojiEntry, EmojiPairsParams, emoji_package_dir, load_pngs, read_emoji_json, split_groups
from mmfl.data.vqa import ANNOTATIONS_FILE, IMAGE_FILE, QUESTIONS_FILE
from mmfl.errors import DataError

EMOJI_VQA_VERSION = 1  # bump when the written set changes
SPLITS = {"train2014": "train", "val2014": "test"}  # VQA split -> emoji_pairs split
TEMPLATES = ("what category is this emoji?", "what subcategory is this emoji?", "is this emoji in the category {}?")
QUESTION_TYPES = ("what category is this", "what subcategory is this", "is this emoji in")


def emoji_splits(p: EmojiPairsParams) -> dict[str, list[EmojiEntry]]:
    """The base emoji of each ``emoji_pairs`` split (``public``, ``train``, ``test``), in Unicode
    order, exactly as :func:`mmfl.data.emoji.emoji_pairs` splits them for ``p``."""
    pkg = emoji_package_dir(p.root)
    entries = read_emoji_json(pkg, p.text, p.skin_tones)
    key = (lambda e: e.subcategory) if p.label == "subcategory" else (lambda e: e.category)
    order: dict[str, int] = {}
    for e in sorted(entries, key=lambda e: e.sort_order):
        order.setdefault(key(e), len(order))
    labels = np.array([order[key(e)] for e in entries], dtype=np.int64)
    groups = np.array([e.group for e in entries], dtype=np.int64)
    _, first = np.unique(groups, return_index=True)  # a group's first entry is its base emoji
    parts = split_groups(labels[first], p.public_fraction, p.test_fraction, p.seed)
    return {s: [entries[i] for i in first[np.sort(pos)]] for s, pos in parts.items()}


def _questions(e: EmojiEntry, image_id: int, categories: list[str], rng: np.random.Generator) -> list[dict]:
    own = e.category.lower()
    asked = own if rng.random() < 0.5 else str(rng.choice([c for c in categories if c != own] or [own]))
    rows = [(TEMPLATES[0], own, "other"), (TEMPLATES[1], e.subcategory, "other"),
            (TEMPLATES[2].format(asked), "yes" if asked == own else "no", "yes/no")]
    return [{"question_id": image_id * 1000 + k, "image_id": image_id, "question": q, "answer": a,
             "answer_type": t, "question_type": QUESTION_TYPES[k]} for k, (q, a, t) in enumerate(rows)]


def write_emoji_vqa(out: str | Path, p: EmojiPairsParams | None = None, seed: int = 0) -> dict:
    """Write the emoji VQA set for ``emoji_pairs`` parameters ``p`` (default: its defaults) to
    ``out`` (replaced if it exists; written to a temporary folder first). ``seed``: the yes/no
    questions' category draws. Returns a summary (images and questions per split)."""
    from PIL import Image

    p = p or EmojiPairsParams()
    out = Path(out).expanduser()
    pkg = emoji_package_dir(p.root)
    splits = emoji_splits(p)
    if any(not e.subcategory for es in splits.values() for e in es):
        raise DataError(f"{pkg / 'emoji.json'}: an emoji has no subcategory (the emoji VQA set asks for it)")
    categories = sorted({e.category.lower() for es in splits.values() for e in es})
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    summary: dict = {"source": str(pkg), "emoji_pairs": asdict(p), "seed": seed, "version": EMOJI_VQA_VERSION,
                     "splits": {}}
    for vqa_split, pair_split in SPLITS.items():
        entries = splits[pair_split]
        (tmp / vqa_split).mkdir()
        rgba = load_pngs(pkg, [e.image for e in entries]).astype(np.float32) / 255.0
        rgb = rgba[..., :3] * rgba[..., 3:] + (1.0 - rgba[..., 3:])  # on white, as emoji_pairs composites
        questions, annotations = [], []
        for e, img in zip(entries, rgb):
            image_id = e.group + 1
            Image.fromarray(np.round(img * 255.0).astype(np.uint8), "RGB").save(
                tmp / vqa_split / IMAGE_FILE.format(split=vqa_split, image_id=image_id), quality=95, subsampling=0)
            rng = np.random.default_rng([seed, image_id])
            for q in _questions(e, image_id, categories, rng):
                questions.append({"image_id": image_id, "question": q["question"], "question_id": q["question_id"]})
                annotations.append({
                    "question_id": q["question_id"], "image_id": image_id, "question_type": q["question_type"],
                    "answer_type": q["answer_type"], "multiple_choice_answer": q["answer"],
                    "answers": [{"answer": q["answer"], "answer_confidence": "yes", "answer_id": j + 1}
                                for j in range(10)]})
        info = {"description": f"emoji VQA ({pair_split} split of emoji_pairs), templated questions",
                "version": str(EMOJI_VQA_VERSION)}
        common = {"info": info, "license": {"name": "data MIT, images Apache-2.0 (npm emoji-datasource-google)"},
                  "data_subtype": vqa_split, "data_type": "mscoco"}
        (tmp / QUESTIONS_FILE.format(split=vqa_split)).write_text(json.dumps(
            {**common, "task_type": "Open-Ended", "questions": questions}))
        (tmp / ANNOTATIONS_FILE.format(split=vqa_split)).write_text(json.dumps({**common, "annotations": annotations}))
        summary["splits"][vqa_split] = {"emoji_pairs_split": pair_split, "images": len(entries),
                                        "questions": len(questions)}
    (tmp / "emoji_vqa.json").write_text(json.dumps(summary, indent=2))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return summary


def emoji_vqa_dir(p: EmojiPairsParams | None = None, seed: int = 0) -> Path:
    """The emoji VQA set for ``p`` under ``$MMFL_DATA_DIR`` (``emoji-vqa-<digest of p and seed>``),
    written on first use."""
    from mmfl.data.avmnist import data_dir

    p = p or EmojiPairsParams()
    split = {k: getattr(p, k) for k in ("label", "public_fraction", "test_fraction", "seed")}  # what the set depends on
    key = json.dumps({"split": split, "seed": seed, "v": EMOJI_VQA_VERSION,
                      "package": str(emoji_package_dir(p.root).resolve())}, sort_keys=True)
    out = data_dir() / f"emoji-vqa-{hashlib.blake2b(key.encode(), digest_size=6).hexdigest()}"
    if not (out / "emoji_vqa.json").is_file():
        write_emoji_vqa(out, p, seed)
    return out
