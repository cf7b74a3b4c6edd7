"""VQA (CreamFL's Table 2 evaluation): the VQA v2 reader on a fixture written in the released
format, the official answer normalisation, the soft score by hand, a VQA head that learns what
the image determines, the emoji VQA builder and `mmfl vqa` on a tiny finished run.

The cheap encoders ("pixels:4" images, "hash:64" texts) stand in for MobileNetV2 / MiniLM."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mmfl.cli import main as cli_main
from mmfl.data.vqa import (VQADataParams, answer_index, answer_vocabulary, load_vqa, normalize_answer,
                           read_vqa_split)
from mmfl.core.vqa import (VQATrainParams, answer_counts, finetune_vqa, official_score, soft_score, soft_targets,
                             vqa_score, vqa_score_official)
from mmfl.errors import ConfigError, DataError

from helpers import run_config

try:
    from test_emoji_bbc import write_emoji_package
except ImportError:  # tests/ imported as a package
    from tests.test_emoji_bbc import write_emoji_package

CHEAP = {"image_encoder": "pixels:4", "text_encoder": "hash:64", "image_size": 32}
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


@pytest.fixture(autouse=True)
def _own_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MMFL_DATA_DIR", str(tmp_path / "data"))


def write_vqa_dir(root: Path, splits: dict[str, list[tuple[str, list[tuple[str, list[str]]]]]],
                  layout: str = "flat") -> Path:
    """VQA v2's released files under ``root``. ``splits[split]`` = one ``(colour, questions)`` per
    image, ``questions`` = ``(question, ten answers)``; each image is a 20x16 JPEG of that colour.
    ``layout = "nested"`` puts the files in Questions/, Annotations/ and Images/ as some copies do.
    Question ids are listed in descending order (the reader sorts by image and question id)."""
    qdir, adir, idir = (root,) * 3 if layout == "flat" else (root / "Questions", root / "Annotations", root / "Images")
    for d in (qdir, adir):
        d.mkdir(parents=True, exist_ok=True)
    image_id = 9
    for split, images in splits.items():
        (idir / split).mkdir(parents=True, exist_ok=True)
        questions, annotations = [], []
        for colour, qs in images:
            image_id += 4
            img = np.full((16, 20, 3), COLOURS[colour], dtype=np.uint8)
            row = 5 * list(COLOURS).index(colour)
            img[row:row + 5] = 255  # a white band whose place differs by colour (not a scaled copy)
            Image.fromarray(img).save(idir / split / f"COCO_{split}_{image_id:012d}.jpg", quality=95)
            for k, (q, answers) in enumerate(qs):
                qid = image_id * 1000 + k
                questions.append({"image_id": image_id, "question": q, "question_id": qid})
                top = max(set(answers), key=answers.count)
                annotations.append({"question_id": qid, "image_id": image_id, "question_type": "what color is",
                                    "answer_type": "yes/no" if top in ("yes", "no") else "other",
                                    "multiple_choice_answer": top,
                                    "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": j + 1}
                                                for j, a in enumerate(answers)]})
        info = {"info": {"description": "tiny"}, "license": {"name": "test"}, "data_subtype": split}
        (qdir / f"v2_OpenEnded_mscoco_{split}_questions.json").write_text(json.dumps(
            {**info, "task_type": "Open-Ended", "data_type": "mscoco", "questions": questions[::-1]}))
        (adir / f"v2_mscoco_{split}_annotations.json").write_text(json.dumps({**info, "annotations": annotations}))
    return root


def colour_images(colours: list[str]) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """One image per colour; "what color is this?" answered by the colour (ten times), and a yes/no."""
    return [(c, [("what color is this?", [c] * 10), ("is this red?", ["yes" if c == "red" else "no"] * 10)])
            for c in colours]


# ----------------------------------------------------------------------------- normalisation and scores


@pytest.mark.parametrize("raw, want", [
    ("Yes", "yes"), ("yes!", "yes"), ("A Dog.", "dog"), ("the cat's toy", "cat's toy"), ("Two", "2"),
    ("none", "0"), ("ten", "10"), ("isnt", "isn't"), ("Dont", "don't"), ("t-shirt", "t shirt"),
    ("red/white", "red white"), ("hello, world", "hello world"), ("1,000", "1000"), ("2.5", "2.5"),
    ("  an apple\n", "apple"), ("face-smiling", "face smiling"), ("food & drink", "food & drink"),
])
def test_answer_normalisation_follows_the_official_evaluation(raw, want):
    assert normalize_answer(raw) == want


def test_soft_score_by_hand():
    counts = torch.tensor([0, 1, 2, 3, 4, 10])
    assert soft_score(counts).tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1, 1, 1])
    # the official 10-choose-9 average: 0.3 / 0.6 / 0.9 / 1.0 for 1 / 2 / 3 / 4+ matching humans
    assert official_score(counts, torch.full((6,), 10)).tolist() == pytest.approx([0, 0.3, 0.6, 0.9, 1, 1])
    humans = ["2"] * 2 + ["3"] * 8
    assert vqa_score("two", humans) == pytest.approx(2 / 3)  # 2 of 10 humans -> 2/3
    assert vqa_score("Three", humans) == 1.0  # 3 or more -> 1
    assert vqa_score("four", humans) == 0.0
    assert vqa_score_official("two", humans) == pytest.approx(0.6)
    # the string form of the official score equals the closed form for every count
    for c in range(11):
        ans = ["a"] * c + ["b"] * (10 - c)
        assert vqa_score_official("a", ans) == pytest.approx(float(official_score(torch.tensor([c]),
                                                                                 torch.tensor([10]))))


def test_answer_counts_and_soft_targets_by_hand():
    answers = torch.tensor([[0, 0, 1, -1], [2, 2, 2, 2]])  # -1: outside the vocabulary
    assert answer_counts(torch.tensor([0, 2]), answers).tolist() == [2, 4]
    assert answer_counts(torch.tensor([1, 0]), answers).tolist() == [1, 0]
    t = soft_targets(answers, 3)
    assert torch.allclose(t, torch.tensor([[2 / 3, 1 / 3, 0], [0, 0, 1]]))


# ----------------------------------------------------------------------------- the reader


@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_reader_reads_the_released_format(tmp_path, layout):
    root = write_vqa_dir(tmp_path / "vqa", {"train2014": [
        ("red", [("What color is this?", ["Red"] * 6 + ["dark red"] * 3 + ["the red"]), ("How many?", ["two"] * 10)]),
        ("blue", [("what color is this?", ["blue"] * 10)])]}, layout)
    rec = read_vqa_split(root, "train2014")
    assert [q.image_id for q in rec.questions] == [13, 13, 17] and rec.image_ids == [13, 17]
    assert [q.question_id for q in rec.questions] == [13000, 13001, 17000]  # sorted by image, then id
    q = rec.questions[0]
    assert q.question == "What color is this?" and q.answers == ["red"] * 6 + ["dark red"] * 3 + ["red"]
    assert rec.questions[1].answers == ["2"] * 10 and q.multiple_choice_answer == "red"
    assert q.answer_type == "other" and q.question_type == "what color is"
    assert [p.name for p in rec.image_paths] == ["COCO_train2014_000000000013.jpg", "COCO_train2014_000000000017.jpg"]
    vocab = answer_vocabulary(rec.questions, 3000)
    assert vocab == ["2", "blue", "red"]  # by frequency, ties alphabetically
    rec.questions[2].multiple_choice_answer = "red"
    assert answer_vocabulary(rec.questions, 1) == ["red"]
    idx, n = answer_index(rec.questions, ["red", "2"])
    assert idx[0].tolist() == [0] * 6 + [-1] * 3 + [0] and idx[2].tolist() == [-1] * 10 and n.tolist() == [10, 10, 10]


def _break(root: Path, name: str, fn) -> None:
    path = root / name
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def test_reader_errors_are_one_line_data_errors(tmp_path):
    def fresh(name):
        return write_vqa_dir(tmp_path / name, {"val2014": colour_images(["red", "blue"])})

    q, a = "v2_OpenEnded_mscoco_val2014_questions.json", "v2_mscoco_val2014_annotations.json"
    with pytest.raises(DataError, match="VQA folder not found"):
        read_vqa_split(tmp_path / "nowhere", "val2014")
    root = fresh("a")
    (root / q).unlink()
    with pytest.raises(DataError, match=r"questions file v2_OpenEnded_mscoco_val2014_questions.json not found"):
        read_vqa_split(root, "val2014")
    root = fresh("b")
    (root / a).write_text('{"annotations": [')
    with pytest.raises(DataError, match="cannot parse JSON"):
        read_vqa_split(root, "val2014")
    root = fresh("c")
    _break(root, a, lambda d: d["annotations"].pop(1))
    with pytest.raises(DataError, match=r"question 13001 of .* has no annotation"):
        read_vqa_split(root, "val2014")
    root = fresh("d")
    _break(root, a, lambda d: d["annotations"][0].update(image_id=99))
    with pytest.raises(DataError, match="image_id 99 differs"):
        read_vqa_split(root, "val2014")
    root = fresh("e")
    _break(root, q, lambda d: d["questions"].append(dict(d["questions"][0])))
    with pytest.raises(DataError, match="appears twice"):
        read_vqa_split(root, "val2014")
    root = fresh("f")
    _break(root, a, lambda d: d["annotations"][2].update(answers=[{"answer_id": 1}]))
    with pytest.raises(DataError, match=r"annotations\[2\].answers\[0\]: expected"):
        read_vqa_split(root, "val2014")
    root = fresh("g")
    _break(root, q, lambda d: d.pop("questions"))
    with pytest.raises(DataError, match="expected a VQA questions file"):
        read_vqa_split(root, "val2014")
    root = fresh("h")
    next((root / "val2014").iterdir()).unlink()
    with pytest.raises(DataError, match="image file not found"):
        read_vqa_split(root, "val2014")
    root = fresh("i")
    _break(root, q, lambda d: d["questions"].pop(0))
    with pytest.raises(DataError, match="is not in v2_OpenEnded"):
        read_vqa_split(root, "val2014")
    with pytest.raises(ConfigError, match="vqa.answers: must be an integer >= 1"):
        VQADataParams(root="x", answers=0)


def test_load_vqa_features_have_the_encoders_shapes(tmp_path):
    root = write_vqa_dir(tmp_path / "vqa", {"train2014": colour_images(["red", "green", "blue"]),
                                            "val2014": colour_images(["blue", "red"])})
    data = load_vqa(VQADataParams(root=str(root), **CHEAP))
    from mmfl.data.featurize import text_features

    assert data.train.image.shape == (3, 16) and data.train.question.shape == (6, 64)
    assert data.test.image_index.tolist() == [0, 0, 1, 1] and data.vocab[:2] == ["no", "blue"]
    want = text_features([q.question for q in data.test.records.questions], "hash:64", cache=False)
    assert torch.allclose(data.test.question, want)  # distinct texts encoded once, rows restored
    assert data.info["questions"] == {"train": 6, "test": 4} and data.info["answers"] == 5


# ----------------------------------------------------------------------------- the head


def _server(image_dim: int, text_dim: int):
    from mmfl.data.base import DatasetMeta
    from mmfl.models.multimodal import MultimodalParams, multimodal

    torch.manual_seed(0)
    meta = DatasetMeta(name="t", num_classes=1, modalities={"image": (image_dim,), "text": (text_dim,)})
    return multimodal(MultimodalParams(feat_dim=16, mlp_hidden=[32]), meta).eval()


@pytest.mark.slow
@pytest.mark.parametrize("encoders", ["frozen", "finetune"])
def test_finetuning_the_head_learns_what_the_image_determines(tmp_path, encoders):
    from mmfl.algorithms.creamfl_terms import reps_of

    # the colour question's answer is the image's colour; "green" is rarer, so the majority
    # answer ("no") scores only on the yes/no questions it fits
    train = ["red", "green", "blue", "blue", "red", "blue"] * 3
    root = write_vqa_dir(tmp_path / "vqa", {"train2014": colour_images(train),
                                            "val2014": colour_images(["red", "green", "blue", "blue"])})
    data = load_vqa(VQADataParams(root=str(root), **CHEAP))
    model = _server(16, 64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mods = [model.encoders, model.proj]
    out = finetune_vqa(lambda x: reps_of(model, x, ("image", "text")), [q for m in mods for q in m.parameters()],
                       data, VQATrainParams(epochs=60, batch_size=8, hidden=64, dropout=0.0, encoders=encoders), mods)
    assert out["majority_answer"] == "no" and out["majority"] == pytest.approx(100 * 3 / 8)
    assert out["accuracy"] == pytest.approx(100.0) and out["accuracy"] > out["majority"] + 50
    assert out["by_answer_type"]["other"]["accuracy"] == pytest.approx(100.0)
    assert out["by_question_type"]["what color is"] == {"accuracy": pytest.approx(100.0), "questions": 8}
    assert out["predictions"][:2] == ["red", "yes"] and out["oracle"] == pytest.approx(100.0)
    changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert changed == (encoders == "finetune")


def test_a_head_that_cannot_see_the_image_stays_at_the_question_prior(tmp_path):
    # the same fixture with every image representation zeroed: only the question is left, so the
    # colour questions fall back to one colour for all (the mechanism test above is not trivial)
    train = ["red", "green", "blue", "blue", "red", "blue"] * 3
    root = write_vqa_dir(tmp_path / "vqa", {"train2014": colour_images(train),
                                            "val2014": colour_images(["red", "green", "blue", "blue"])})
    data = load_vqa(VQADataParams(root=str(root), **CHEAP))
    blind = finetune_vqa(lambda x: {"image": torch.zeros(len(x["image"]), 4), "text": x["text"]}, [], data,
                         VQATrainParams(epochs=60, batch_size=8, hidden=64, dropout=0.0))
    assert blind["by_answer_type"]["other"]["accuracy"] == pytest.approx(50.0)  # "blue" for all: 2 of 4


# ----------------------------------------------------------------------------- emoji VQA and the command


def _emoji_run(tmp_path) -> Path:
    pkg = tmp_path / "emoji"
    write_emoji_package(pkg)
    raw = {"name": "run", "rounds": 1, "seed": 0, "output_dir": str(tmp_path / "runs"), "threads": 1,
           "data": {"name": "emoji_pairs", "root": str(pkg), **CHEAP, "image_size": 32},
           "partition": {"name": "iid", "num_clients": 2},
           "model": {"name": "multimodal", "feat_dim": 8, "mlp_hidden": [16]},
           "algorithm": {"name": "creamfl", "server_batch_size": 16},
           "train": {"local_epochs": 1, "batch_size": 16, "optimizer": "adam", "lr": 0.001}}
    run_config(raw)
    return tmp_path / "runs" / "run"


def test_emoji_vqa_uses_only_emoji_outside_the_public_split(tmp_path):
    from mmfl.data import DATASETS
    from mmfl.data.emoji import EmojiPairsParams
    from mmfl.data.vqa_emoji import emoji_splits, write_emoji_vqa

    pkg = tmp_path / "emoji"
    write_emoji_package(pkg)
    p = EmojiPairsParams(root=str(pkg), **CHEAP)
    bundle = DATASETS.get("emoji_pairs").factory(p)
    splits = emoji_splits(p)
    for s in ("public", "train", "test"):  # the same split as the loader's, base emoji only
        assert [e.name for e in splits[s]] == [n for n in bundle.meta.info["names"][s] if "skin tone" not in n]
    summary = write_emoji_vqa(tmp_path / "evqa", p)
    assert summary["splits"]["val2014"] == {"emoji_pairs_split": "test", "images": len(splits["test"]),
                                            "questions": 3 * len(splits["test"])}
    rec = read_vqa_split(tmp_path / "evqa", "val2014")
    ids = {e.group + 1: e for e in splits["test"]}
    public = {e.group + 1 for e in splits["public"]}
    assert set(rec.image_ids) == set(ids) and not public & set(read_vqa_split(tmp_path / "evqa", "train2014").image_ids)
    for q in rec.questions:
        e = ids[q.image_id]
        assert len(q.answers) == 10 and len(set(q.answers)) == 1
        if q.question.startswith("what category"):
            assert q.answers[0] == normalize_answer(e.category)
        elif q.question.startswith("what subcategory"):
            assert q.answers[0] == normalize_answer(e.subcategory)
        else:
            assert q.answers[0] == ("yes" if q.question.endswith(f" {e.category.lower()}?") else "no")
    # each image is the PNG composited on white, as emoji_pairs composites it (JPEG-compressed)
    from mmfl.data.emoji import load_pngs

    e = splits["test"][0]
    rgba = load_pngs(pkg / "package", [e.image])[0].astype(np.float32) / 255
    want = rgba[..., :3] * rgba[..., 3:] + 1 - rgba[..., 3:]
    got = np.asarray(Image.open(rec.image_paths[rec.image_ids.index(e.group + 1)]), dtype=np.float32) / 255
    assert np.abs(got - want).mean() < 0.05


def test_vqa_command_on_a_tiny_finished_run(tmp_path, capsys):
    run = _emoji_run(tmp_path)
    assert cli_main(["vqa", str(run), "--emoji", "--set", "epochs=2", "--set", "hidden=16"]) == 0, \
        capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "accuracy" in printed and "yes/no" in printed and "what subcategory is this" in printed
    out = json.loads((run / "vqa.json").read_text())
    assert out["checkpoint"] == "round_00001" and out["algorithm"] == "creamfl" and out["data"]["emoji"]
    assert out["train"]["epochs"] == 2 and 0 <= out["accuracy"] <= 100 and len(out["train_loss"]) == 2
    preds = json.loads((run / "vqa_predictions.json").read_text())
    assert len(preds) == out["questions"] == out["data"]["questions"]["test"]
    assert set(preds[0]) == {"question_id", "answer"}
    # a VQA v2 copy given by path, read through the run's encoders; the initial weights as a control
    root = write_vqa_dir(tmp_path / "vqa", {"train2014": colour_images(["red", "blue"] * 3),
                                            "val2014": colour_images(["blue", "red"])})
    assert cli_main(["vqa", str(run), "--root", str(root), "--weights", "init", "--set", "epochs=1",
                     "--set", "encoders=finetune", "--output", str(tmp_path / "v.json")]) == 0
    out = json.loads((tmp_path / "v.json").read_text())
    assert out["checkpoint"] == "initial weights" and out["questions"] == 4 and out["train"]["encoders"] == "finetune"
    capsys.readouterr()
    # user errors: one line, exit code 2
    for argv, msg in ((["vqa", str(run), "--emoji", "--set", "epoch=3"], "did you mean 'epochs'"),
                      (["vqa", str(run), "--emoji", "--set", "epochs=0"], "vqa.epochs: must be an integer >= 1"),
                      (["vqa", str(tmp_path / "none"), "--emoji"], "not a run folder"),
                      (["vqa", str(run), "--root", str(tmp_path / "none")], "VQA folder not found")):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("mmfl: error:") and msg in err and err.count("\n") == 1


def test_set_keys_list_the_parameters():
    from mmfl.vqa_eval import DATA_KEYS, TRAIN_KEYS

    run_owned = {"root", "image_encoder", "image_size", "text_encoder"}
    assert set(DATA_KEYS) == {f.name for f in fields(VQADataParams)} - run_owned
    assert set(TRAIN_KEYS) == {f.name for f in fields(VQATrainParams)}
    assert asdict(VQATrainParams())["encoders"] == "frozen"
