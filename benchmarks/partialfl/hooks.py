"""The PartialFL benchmark's post-run step (grid: grid.toml; its report is tables.toml, which names
this file as its ``hooks``): split learning with private-only clients is evaluated on the private
modality alone (``post`` -> ``eval_private.json``), and such a run is done once that file exists."""

from __future__ import annotations

import json
from pathlib import Path


def _private_only(raw: dict) -> list[str] | None:
    """Split learning with clients holding the private modality only: evaluate on it only."""
    if raw["algorithm"]["name"] in ("split_learning", "split_learning_u") and \
            raw.get("modalities", {}).get("name") == "mixed":
        return list(raw["modalities"]["modalities"])
    return None


def done(run_dir: Path, raw: dict) -> bool:
    return (run_dir / "summary.json").exists() and (_private_only(raw) is None
                                                     or (run_dir / "eval_private.json").exists())


def post(raw: dict, cfg, run_dir: Path, exp) -> None:
    """Split learning with private-only clients: the split model on the private modality
    alone (the shareable slot: zeros, as in training), into eval_private.json."""
    from mmfl.core.training import evaluate_model

    mods = _private_only(raw)
    if mods is not None:
        row = evaluate_model(exp.server.model, exp.federation.test.with_features(mods),
                             num_classes=exp.federation.meta.num_classes)
        row = {k: v for k, v in row.items() if not k.startswith("class_accuracy")}
        (run_dir / "eval_private.json").write_text(json.dumps(row, indent=1))
