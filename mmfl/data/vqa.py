"""VQA v2 (Goyal et al., CVPR 2017) read from its released files, as frozen-encoder features.

CreamFL (Yu et al., ICLR 2023, Table 2, Appendix A.2) evaluates its server model on VQA v2.0,
"accuracy over the 3,000 most frequent answers". Nothing is downloaded: ``root`` points at the
user's copy in the released layout (each file may also sit in a ``questions/``,
``annotations/``, ``images/`` sub-folder of ``root``, any capitalisation)::

    v2_OpenEnded_mscoco_<split>_questions.json  {"questions": [{"image_id", "question", "question_id"}]}
    v2_mscoco_<split>_annotations.json          {"annotations": [{"question_id", "image_id",
                                                   "answers": [{"answer", "answer_confidence", "answer_id"}] x 10,
                                                   "multiple_choice_answer", "answer_type", "question_type"}]}
    <split>/COCO_<split>_<image_id as 12 digits>.jpg

with ``<split>`` = ``train2014`` (fine-tuning) and ``val2014`` (evaluation) by default.

* **Answers** are normalised as the official evaluation (``vqaEval.py`` of the VQA API) does:
  :func:`process_punctuation` then :func:`process_digit_article` (number words to digits,
  articles dropped, contractions restored). The official script normalises only when the ten
  answers disagree; here every answer is normalised, so the vocabulary (normalised) and the
  ground truth always compare alike.
* **Vocabulary**: the ``answers`` (K, default 3,000) most frequent normalised
  ``multiple_choice_answer`` of the training questions (ties by the answer's text),
  :func:`answer_vocabulary`.
* **Features**: every image through the run's frozen image encoder
  (:func:`mmfl.data.featurize.image_features`, read by :func:`mmfl.data.captions.read_image`),
  every distinct question through its text encoder (:func:`~mmfl.data.featurize.text_features`),
  so a question has the shape of the CreamFL server's ``text`` input and an image that of its
  ``image`` input (:class:`~mmfl.data.captions.FrozenEncoderParams`). Cached
  (:mod:`mmfl.data.cache`) by the encoders, the question texts and the image files' names,
  sizes and modification times.

Not registered as a ``[data]`` set: a VQA split has soft multi-answer targets, not the one
label per sample of :class:`~mmfl.data.base.DatasetBundle`. :func:`load_vqa` returns a
:class:`VQAData` that :mod:`mmfl.core.vqa` trains and scores on.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmfl.data.captions import IMAGE_BATCH, FrozenEncoderParams, _subset, read_image, read_json
from mmfl.errors import ConfigError, DataError
from mmfl.data.vqa_answers import normalize_answer

VQA_VERSION = 1  # bump when the code changes what load_vqa returns
QUESTIONS_FILE = "v2_OpenEnded_mscoco_{split}_questions.json"
ANNOTATIONS_FILE = "v2_mscoco_{split}_annotations.json"
IMAGE_FILE = "COCO_{split}_{image_id:012d}.jpg"
NO_ANSWER = -1  # answer index of a human answer outside the vocabulary (and of padding)

# ----------------------------------------------------------------------------- the released files


@dataclass
class VQAQuestion:
    question_id: int
    image_id: int
    question: str
    answers: list[str]  # the human answers, normalised (10 in VQA v2)
    multiple_choice_answer: str  # normalised
    answer_type: str  # "yes/no" | "number" | "other" in VQA v2
    question_type: str  # e.g. "what color is the"


@dataclass
class VQARecords:
    """One split as read from its files: questions sorted by (image id, question id)."""

    split: str
    questions: list[VQAQuestion]
    image_ids: list[int]  # sorted, the images the questions ask about
    image_paths: list[Path]
    files: dict[str, str]  # "questions" / "annotations" / "images" -> where they were found


def _candidates(root: Path, sub: tuple[str, ...]) -> list[Path]:
    out = [root]
    for name in sub:
        for variant in (name, name.capitalize(), name.upper()):
            if (root / variant).is_dir():
                out.append(root / variant)
    return out


def find_file(root: Path, name: str, sub: tuple[str, ...], what: str) -> Path:
    """``root/name`` or ``root/<sub>/name`` (sub-folder in any of lower/Capital/UPPER case)."""
    places = _candidates(root, sub)
    for d in places:
        if (d / name).is_file():
            return d / name
    raise DataError(f"{root}: {what} {name} not found (looked in {', '.join(str(d) for d in places)})")


def find_image_dir(root: Path, split: str) -> Path:
    for d in _candidates(root, ("images",)):
        if (d / split).is_dir():
            return d / split
    raise DataError(f"{root}: image folder {split}/ not found (looked in {root} and {root}/images)")


def _int_field(path: Path, where: str, item: dict, key: str) -> int:
    v = item.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise DataError(f"{path}: {where}: '{key}' must be an integer, got {v!r}")
    return v


def read_questions(path: Path) -> dict[int, tuple[int, str]]:
    """A released questions file -> ``{question_id: (image_id, question)}``."""
    data = read_json(path, "VQA questions file")
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise DataError(f"{path}: expected a VQA questions file (an object with a 'questions' list)")
    out: dict[int, tuple[int, str]] = {}
    for i, q in enumerate(data["questions"]):
        where = f"questions[{i}]"
        if not isinstance(q, dict):
            raise DataError(f"{path}: {where}: expected {{'image_id', 'question', 'question_id'}}")
        qid, img = _int_field(path, where, q, "question_id"), _int_field(path, where, q, "image_id")
        text = q.get("question")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{path}: {where}: 'question' must be a non-empty string")
        if qid in out:
            raise DataError(f"{path}: {where}: question_id {qid} appears twice")
        out[qid] = (img, " ".join(text.split()))
    if not out:
        raise DataError(f"{path}: no questions")
    return out


def read_annotations(path: Path) -> dict[int, dict]:
    """A released annotations file -> ``{question_id: annotation}`` (answers checked, not yet
    normalised)."""
    data = read_json(path, "VQA annotations file")
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise DataError(f"{path}: expected a VQA annotations file (an object with an 'annotations' list)")
    out: dict[int, dict] = {}
    for i, a in enumerate(data["annotations"]):
        where = f"annotations[{i}]"
        if not isinstance(a, dict):
            raise DataError(f"{path}: {where}: expected an object")
        qid = _int_field(path, where, a, "question_id")
        _int_field(path, where, a, "image_id")
        answers = a.get("answers")
        if not isinstance(answers, list) or not answers:
            raise DataError(f"{path}: {where}: 'answers' must be a non-empty list")
        for j, ans in enumerate(answers):
            if not isinstance(ans, dict) or not isinstance(ans.get("answer"), str):
                raise DataError(f"{path}: {where}.answers[{j}]: expected {{'answer': str, ...}}")
        if not isinstance(a.get("multiple_choice_answer"), str):
            raise DataError(f"{path}: {where}: 'multiple_choice_answer' must be a string")
        if qid in out:
            raise DataError(f"{path}: {where}: question_id {qid} appears twice")
        out[qid] = a
    return out


def read_vqa_split(root: str | Path, split: str) -> VQARecords:
    """The questions, annotations and image paths of ``split`` (e.g. ``"val2014"``) under ``root``.

    Every question needs an annotation with the same image id and vice versa (DataError
    otherwise); a missing image file is a DataError too."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: VQA folder not found")
    qpath = find_file(root, QUESTIONS_FILE.format(split=split), ("questions",), "questions file")
    apath = find_file(root, ANNOTATIONS_FILE.format(split=split), ("annotations",), "annotations file")
    img_dir = find_image_dir(root, split)
    questions = read_questions(qpath)
    anns = read_annotations(apath)
    out = []
    for qid, (img, text) in questions.items():
        a = anns.get(qid)
        if a is None:
            raise DataError(f"{apath}: question {qid} of {qpath.name} has no annotation")
        if a["image_id"] != img:
            raise DataError(f"{apath}: question {qid}: image_id {a['image_id']} differs from the questions "
                            f"file's {img}")
        out.append(VQAQuestion(qid, img, text, [normalize_answer(x["answer"]) for x in a["answers"]],
                               normalize_answer(a["multiple_choice_answer"]), str(a.get("answer_type", "")),
                               str(a.get("question_type", ""))))
    extra = sorted(set(anns) - set(questions))
    if extra:
        raise DataError(f"{apath}: annotation of question {extra[0]} is not in {qpath.name} "
                        f"({len(extra)} such annotation(s))")
    out.sort(key=lambda q: (q.image_id, q.question_id))
    ids = sorted({q.image_id for q in out})
    paths = [img_dir / IMAGE_FILE.format(split=split, image_id=i) for i in ids]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p}: image file not found")
    return VQARecords(split, out, ids, paths, {"questions": str(qpath), "annotations": str(apath),
                                               "images": str(img_dir)})


def subset_images(rec: VQARecords, max_images: int, seed: int) -> VQARecords:
    """A seeded random subset of ``max_images`` images with all their questions (0: all)."""
    keep = _subset(len(rec.image_ids), max_images, seed)
    if len(keep) == len(rec.image_ids):
        return rec
    ids = [rec.image_ids[i] for i in keep]
    chosen = set(ids)
    return VQARecords(rec.split, [q for q in rec.questions if q.image_id in chosen], ids,
                      [rec.image_paths[i] for i in keep], rec.files)


# ----------------------------------------------------------------------------- answers as tensors


def answer_vocabulary(questions: list[VQAQuestion], k: int) -> list[str]:
    """The ``k`` most frequent (normalised) ``multiple_choice_answer`` of ``questions``, most
    frequent first, ties in alphabetical order; all of them if there are fewer."""
    if k < 1:
        raise ConfigError(f"vqa.answers: the vocabulary size must be >= 1, got {k}")
    counts = Counter(q.multiple_choice_answer for q in questions if q.multiple_choice_answer)
    return [a for a, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def answer_index(questions: list[VQAQuestion], vocab: list[str]) -> tuple[Tensor, Tensor]:
    """``(answers, n_answers)``: int64 ``[N, A]`` the vocabulary index of each human answer
    (:data:`NO_ANSWER` = -1 outside the vocabulary and as padding, A = the most answers any
    question has) and int64 ``[N]`` each question's number of human answers."""
    pos = {a: i for i, a in enumerate(vocab)}
    width = max((len(q.answers) for q in questions), default=0)
    out = torch.full((len(questions), width), NO_ANSWER, dtype=torch.long)
    for r, q in enumerate(questions):
        out[r, :len(q.answers)] = torch.tensor([pos.get(a, NO_ANSWER) for a in q.answers], dtype=torch.long)
    return out, torch.tensor([len(q.answers) for q in questions], dtype=torch.long)


# ----------------------------------------------------------------------------- features


@dataclass
class VQASplit:
    """One split as tensors. Questions are rows; ``image_index`` says which image each asks about."""

    image: Tensor  # float32 [n_images, d_i]: the frozen image encoder's features
    question: Tensor  # float32 [n_questions, d_t]: the frozen text encoder's features
    image_index: Tensor  # int64 [n_questions]: row of ``image`` per question
    answers: Tensor  # int64 [n_questions, A]: vocabulary index per human answer, -1 outside it
    n_answers: Tensor  # int64 [n_questions]
    records: VQARecords

    def __len__(self) -> int:
        return int(self.image_index.numel())


@dataclass
class VQAData:
    train: VQASplit
    test: VQASplit
    vocab: list[str]
    info: dict


@dataclass
class VQADataParams(FrozenEncoderParams):
    """Where the VQA v2 copy is and how much of it to use; the encoders must be the run's."""

    root: str = field(default="", metadata={
        "help": "(required) folder with the questions/annotations JSON files and the <split>/ image folders"})
    split_train: str = field(default="train2014", metadata={"help": "split the VQA head is fine-tuned on"})
    split_test: str = field(default="val2014", metadata={"help": "split the accuracy is measured on"})
    answers: int = field(default=3000, metadata={
        "help": "vocabulary: the K most frequent training answers (the paper's 3,000)"})
    max_train_images: int = field(default=0, metadata={
        "help": "seeded random subset of this many training images, with all their questions (0 = all)"})
    max_test_images: int = field(default=0, metadata={"help": "likewise for the test split (0 = all)"})
    seed: int = field(default=0, metadata={"help": "seed of the image subsets"})

    def __post_init__(self):
        from mmfl.data.captions import _check_encoders

        if not self.root:
            raise ConfigError("vqa.root: required (the folder holding the VQA v2 files)")
        for key in ("split_train", "split_test"):
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", getattr(self, key) or ""):
                raise ConfigError(f"vqa.{key}: must be a split name such as train2014, got {getattr(self, key)!r}")
        if isinstance(self.answers, bool) or not isinstance(self.answers, int) or self.answers < 1:
            raise ConfigError(f"vqa.answers: must be an integer >= 1, got {self.answers!r}")
        for key in ("max_train_images", "max_test_images"):
            if getattr(self, key) < 0:
                raise ConfigError(f"vqa.{key}: must be >= 0 (0 = all), got {getattr(self, key)}")
        _check_encoders(self.image_encoder, self.text_encoder, self.image_size)  # the run's data.* settings


def encode_split(rec: VQARecords, p: FrozenEncoderParams) -> tuple[Tensor, Tensor]:
    """``(image features [n_images, d_i], question features [n_questions, d_t])``; each distinct
    question text is encoded once. Cached by the encoders, the texts and the image files' stats."""
    from mmfl.data.audio import stat_fingerprint
    from mmfl.data.cache import cached
    from mmfl.data.featurize import image_feature_dim, text_features, texts_digest
    from mmfl.data.featurize_image import image_features

    texts = [q.question for q in rec.questions]
    distinct = sorted(set(texts))
    row = {t: i for i, t in enumerate(distinct)}

    def compute():
        feats = []
        for s in range(0, len(rec.image_paths), IMAGE_BATCH):
            batch = np.stack([read_image(path, p.image_size) for path in rec.image_paths[s:s + IMAGE_BATCH]])
            feats.append(image_features(batch, p.image_encoder, size=p.image_size, cache=False))
        img = torch.cat(feats) if feats else torch.zeros(0, image_feature_dim(p.image_encoder))
        return {"image": img, "text": text_features(distinct, p.text_encoder, cache=False)}

    settings = {"image_encoder": p.image_encoder, "text_encoder": p.text_encoder, "image_size": p.image_size,
                "fit": "shorter side bilinear + centre crop", "n_images": len(rec.image_paths),
                "images": stat_fingerprint(rec.image_paths), "texts": texts_digest(distinct)}
    out = cached("vqa-features", [], settings, compute, version=VQA_VERSION)
    index = torch.tensor([row[t] for t in texts], dtype=torch.long)
    return out["image"], out["text"][index]


def to_split(rec: VQARecords, vocab: list[str], p: FrozenEncoderParams) -> VQASplit:
    img, txt = encode_split(rec, p)
    pos = {i: k for k, i in enumerate(rec.image_ids)}
    index = torch.tensor([pos[q.image_id] for q in rec.questions], dtype=torch.long)
    answers, n = answer_index(rec.questions, vocab)
    return VQASplit(img, txt, index, answers, n, rec)


def load_vqa(p: VQADataParams) -> VQAData:
    """Both splits of the copy at ``p.root`` through ``p``'s encoders, with the vocabulary of
    ``p.answers`` answers from the training split."""
    recs = {}
    for part, split, limit, seed in (("train", p.split_train, p.max_train_images, p.seed),
                                     ("test", p.split_test, p.max_test_images, p.seed + 1)):
        recs[part] = subset_images(read_vqa_split(p.root, split), limit, seed)
    vocab = answer_vocabulary(recs["train"].questions, p.answers)
    if not vocab:
        raise DataError(f"{recs['train'].files['annotations']}: no non-empty multiple_choice_answer")
    splits = {part: to_split(rec, vocab, p) for part, rec in recs.items()}
    info = {"root": str(Path(p.root).expanduser()), "splits": {"train": p.split_train, "test": p.split_test},
            "files": {part: rec.files for part, rec in recs.items()},
            "questions": {part: len(s) for part, s in splits.items()},
            "images": {part: len(rec.image_ids) for part, rec in recs.items()},
            "answers": len(vocab), "answers_asked": p.answers,
            "encoders": {"image": p.image_encoder, "image_size": p.image_size, "text": p.text_encoder}}
    return VQAData(splits["train"], splits["test"], vocab, info)
