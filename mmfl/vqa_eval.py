"""``mmfl vqa``: CreamFL's VQA evaluation (Table 2) of a finished run's server model.

    mmfl vqa RUN --root DIR [--set epochs=30 ...]    VQA v2 in its released format at DIR
    mmfl vqa RUN --emoji [--set ...]                 the emoji VQA set of the run's emoji_pairs split

Loads the run's ``config.toml`` and its last checkpoint's server model (``model/*`` of
``checkpoints/<LATEST>/server.safetensors``; ``--weights init``: the run's initial weights, a
control), reads the VQA set through the run's own frozen encoders (``data.image_encoder``,
``data.image_size``, ``data.text_encoder``), fine-tunes a VQA head on the training split
(:func:`mmfl.core.vqa.finetune_vqa`) and writes the accuracies to ``RUN/vqa.json`` (and the
answers in the official results format, ``[{"question_id", "answer"}]``, to
``RUN/vqa_predictions.json``). :func:`vqa_of_run` is the same from Python.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from mmfl.errors import ConfigError, MMFLError

WEIGHTS = ("final", "init")
# the --set keys: VQADataParams' fields but the run's (root, encoders), then VQATrainParams';
# listed here so that building the parser imports no torch (a test keeps them in step)
DATA_KEYS = ("split_train", "split_test", "answers", "max_train_images", "max_test_images", "seed")
TRAIN_KEYS = ("epochs", "batch_size", "lr", "encoders", "encoder_lr", "hidden", "fusion", "dropout",
              "weight_decay", "seed")


def load_server(run_dir: str | Path, weights: str = "final"):
    """``(cfg, model, checkpoint name)`` of a run folder: the ``[model]`` built for the run's data
    set, with the last checkpoint's server weights (``"final"``) or the run's initial ones (``"init"``)."""
    from mmfl.config import load_config
    from mmfl.data import DATASETS
    from mmfl.engine import checkpoint
    from mmfl.models.factory import model_factory
    from mmfl.core.training import load_into

    run = Path(run_dir).expanduser()
    if not (run / "config.toml").is_file():
        raise MMFLError(f"{run}: not a run folder (no config.toml)")
    if weights not in WEIGHTS:
        raise ConfigError(f"--weights: must be one of {list(WEIGHTS)}, got {weights!r}")
    cfg = load_config(run / "config.toml")
    meta = DATASETS.get(cfg.data.name).factory(cfg.data.params).meta
    model = model_factory(cfg, meta)()
    if not all(hasattr(model, a) for a in ("encoders", "proj", "holds")):
        raise ConfigError(f"{run}: the server model is a {type(model).__name__}; VQA needs model.name = "
                          "\"multimodal\" (a CreamFL-style run)")
    missing = [m for m in ("image", "text") if m not in model.holds]
    if missing:
        raise ConfigError(f"{run}: data set '{cfg.data.name}' has modalities {list(meta.modalities)}; VQA needs "
                          "'image' and 'text' (emoji_pairs, coco_captions, flickr30k)")
    name = "initial weights"
    if weights == "final":
        ckpt = checkpoint.latest(run / "checkpoints")
        if ckpt is None:
            raise MMFLError(f"{run}: no checkpoint (checkpoints/LATEST); finish the run first")
        server, _, _ = checkpoint.load(ckpt, lazy_clients=True)
        try:
            load_into(model, server, prefix="model/")
        except RuntimeError as e:
            raise MMFLError(f"{ckpt}: server weights do not fit the run's model ({str(e).splitlines()[0]})") from None
        name = ckpt.name
    return cfg, model.eval(), name


def frozen_encoders_of(cfg):
    """The run's ``[data]`` encoder settings as :class:`~mmfl.data.captions.FrozenEncoderParams`."""
    from mmfl.data.captions import FrozenEncoderParams

    p = cfg.data.params
    if not all(hasattr(p, k) for k in ("image_encoder", "image_size", "text_encoder")):
        raise ConfigError(f"data.name: '{cfg.data.name}' has no frozen image and text encoders; VQA needs a run "
                          "on emoji_pairs, coco_captions or flickr30k")
    return FrozenEncoderParams(p.image_encoder, p.image_size, p.text_encoder)


def split_settings(values: dict):
    """``--set`` values -> (data values, :class:`VQATrainParams`); unknown keys are ConfigErrors."""
    from mmfl.data.vqa import VQADataParams
    from mmfl.core.vqa import VQATrainParams
    from mmfl.registry import build_params

    unknown = sorted(set(values) - set(DATA_KEYS) - set(TRAIN_KEYS))
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], DATA_KEYS + TRAIN_KEYS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"vqa.{unknown[0]}: unknown VQA setting{hint} (known: "
                          f"{', '.join(sorted(set(DATA_KEYS + TRAIN_KEYS)))})")
    data = {k: v for k, v in values.items() if k in DATA_KEYS}
    train = {k: v for k, v in values.items() if k not in DATA_KEYS or k in TRAIN_KEYS}
    build_params("vqa", "data", VQADataParams, {"root": "-", **data})  # type and range checks
    return data, build_params("vqa", "train", VQATrainParams, train)


def vqa_of_run(run_dir: str | Path, root: str | Path | None = None, emoji: bool = False,
               settings: dict | None = None, weights: str = "final", output: str | Path | None = None,
               emoji_seed: int = 0) -> dict:
    """Fine-tune a VQA head on the run's server model and score it; writes ``output`` (default
    ``RUN/vqa.json``, ``RUN/vqa_init.json`` for ``weights="init"``) and returns what it wrote.

    Data: the VQA v2 copy at ``root``, or (``emoji``) the emoji VQA set of the run's
    ``emoji_pairs`` split (:func:`mmfl.data.vqa_emoji.emoji_vqa_dir`). ``settings``: fields of
    :class:`~mmfl.data.vqa.VQADataParams` (answers, max_train_images, ...) and
    :class:`~mmfl.core.vqa.VQATrainParams` (epochs, encoders, lr, ...)."""
    if (root is None) == (not emoji):
        raise ConfigError("vqa: give either --root DIR (a VQA v2 copy) or --emoji (the emoji VQA set)")
    run = Path(run_dir).expanduser()
    if not (run / "config.toml").is_file():  # before importing torch: a mistyped path is said at once
        raise MMFLError(f"{run}: not a run folder (no config.toml)")
    import torch

    from mmfl.algorithms.creamfl_terms import reps_of
    from mmfl.data.vqa import VQADataParams, load_vqa
    from mmfl.core.vqa import finetune_vqa

    data_values, train = split_settings(dict(settings or {}))
    cfg, model, ckpt = load_server(run, weights)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    enc = frozen_encoders_of(cfg)
    if emoji:
        if cfg.data.name != "emoji_pairs":
            raise ConfigError(f"--emoji: the run's data set is '{cfg.data.name}'; the emoji VQA set follows an "
                              "emoji_pairs run's split (use --root for a VQA v2 copy)")
        from mmfl.data.vqa_emoji import emoji_vqa_dir

        root = emoji_vqa_dir(cfg.data.params, emoji_seed)
    from mmfl.registry import build_params

    p = build_params("vqa", "data", VQADataParams, {**data_values, "root": str(root), **asdict(enc)})
    t0 = time.perf_counter()
    data = load_vqa(p)
    for m, feats in (("image", data.train.image), ("text", data.train.question)):
        want = tuple(model.shapes[m])
        if tuple(feats.shape[1:]) != want:
            raise MMFLError(f"{root}: {m} features have shape {tuple(feats.shape[1:])}, the server model takes {want}")
    load_s = time.perf_counter() - t0
    modules = [model.encoders, model.proj]
    params = [q for mod in modules for q in mod.parameters()]
    t0 = time.perf_counter()
    result = finetune_vqa(lambda inputs: reps_of(model, inputs, ("image", "text")), params, data, train, modules)
    predictions = result.pop("predictions")
    out = {"run": str(run), "algorithm": cfg.algorithm.name, "weights": weights, "checkpoint": ckpt,
           "data": {**data.info, "emoji": emoji}, "train": asdict(train), **result,
           "load_time_s": load_s, "train_time_s": time.perf_counter() - t0}
    path = Path(output) if output else run / ("vqa.json" if weights == "final" else f"vqa_{weights}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    qids = [q.question_id for q in data.test.records.questions]
    path.with_name(path.stem + "_predictions.json").write_text(json.dumps(
        [{"question_id": q, "answer": a} for q, a in zip(qids, predictions)]))
    out["output"] = str(path)
    return out


def summary_lines(out: dict) -> list[str]:
    lines = [f"VQA of {out['run']} ({out['algorithm']}, {out['checkpoint']}, encoders {out['train']['encoders']}): "
             f"{out['data']['questions']['test']} test questions, {out['data']['answers']} answers",
             f"  accuracy {out['accuracy']:.2f}  (10-choose-9 {out['accuracy_official']:.2f}; "
             f"majority '{out['majority_answer']}' {out['majority']:.2f}; oracle {out['oracle']:.2f}; "
             f"train {out['train_accuracy']:.2f})"]
    for t, row in out["by_answer_type"].items():
        lines.append(f"  {t:<8} {row['accuracy']:6.2f}  ({row['questions']} questions)")
    if len(out["by_question_type"]) <= 10:  # VQA v2 has 65: those stay in the JSON
        width = max(len(t) for t in out["by_question_type"])
        for t, row in out["by_question_type"].items():
            lines.append(f"    {t:<{width}} {row['accuracy']:6.2f}  ({row['questions']} questions)")
    lines.append(f"results: {out['output']}")
    return lines


def add_vqa_parser(sub) -> None:
    epilog = ("--set keys (docs/vqa.md has their meaning and defaults):\n  data: " + ", ".join(DATA_KEYS)
              + "\n  head: " + ", ".join(TRAIN_KEYS))
    p = sub.add_parser("vqa", help="fine-tune a VQA head on a finished run's server model (CreamFL Table 2)",
                       description="VQA accuracy of a finished CreamFL-style run's server model: a head on its\n"
                                   "image and question representations, fine-tuned on the training split, scored\n"
                                   "on the test split (soft score min(#humans / 3, 1)). See docs/vqa.md.",
                       epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="run folder (with config.toml and checkpoints/)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--root", help="VQA v2 folder: v2_OpenEnded_mscoco_<split>_questions.json, "
                                    "v2_mscoco_<split>_annotations.json, <split>/COCO_<split>_<id>.jpg")
    src.add_argument("--emoji", action="store_true", help="the emoji VQA set of the run's emoji_pairs split "
                                                          "(built under $MMFL_DATA_DIR on first use)")
    p.add_argument("--weights", choices=WEIGHTS, default="final",
                   help="final: the last checkpoint's server model; init: the run's initial weights (a control)")
    p.add_argument("--output", help="where to write the JSON (default RUN/vqa.json)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a VQA setting, e.g. --set epochs=30 --set encoders=finetune (keys below)")


def cmd_vqa(args) -> int:
    from mmfl.config_raw import parse_override

    settings = {}
    for item in args.overrides:
        keys, value = parse_override(item)
        settings[".".join(keys)] = value
    out = vqa_of_run(args.run, root=args.root, emoji=args.emoji, settings=settings, weights=args.weights,
                     output=args.output)
    print("\n".join(summary_lines(out)))
    return 0
