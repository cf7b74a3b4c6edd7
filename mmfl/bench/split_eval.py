"""A post-run evaluation for benchmarks with missing modalities: the run's final server model on the
test rows that hold a modality and on those that lack it (``test_missing_rate``), for each modality
with a positive rate. The masks are the run's own; under ``missing_policy = "drop_modality:<m>"``
the test set has no ``m``, so its masks are those the same config under ``"mask"`` draws (the same
seed draws the same test rows whatever the policy: :func:`mmfl.data.corruption.simulate`).

A grid uses it without Python of its own: ``hooks = "mmfl.bench.split_eval"`` in its table spec and
``post = { call = "split_json", writes = "split.json" }`` on a group; the spec reads
``reader = "split.json"``, keys ``accuracy/with:<m>`` and ``accuracy/without:<m>``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


def split_accuracy(run_dir: str | Path) -> dict[str, float]:
    """``{"accuracy/with:<m>": a, "accuracy/without:<m>": b}`` of the run's final server model."""
    import numpy as np
    import torch

    from mmfl.algorithms import ALGORITHMS
    from mmfl.api import load_run
    from mmfl.core.evaluation import global_metrics
    from mmfl.data.base import PRESENT
    from mmfl.data.federation import build_federation

    res = load_run(run_dir)
    cfg, fed, model = res.config, res.federation(), res.model()
    mods = cfg.modalities
    rates = {m: r for m, r in mods.params.test_missing_rate.items() if r > 0}
    ref = fed.test
    if any(PRESENT + m not in ref.features for m in rates):  # drop_modality: the masks of the "mask" policy
        masked = dataclasses.replace(cfg, modalities=dataclasses.replace(
            mods, params=dataclasses.replace(mods.params, missing_policy="mask")))
        ref = build_federation(masked, pooled=ALGORITHMS.get(cfg.algorithm.name).factory.pooled).test
    rows, out = fed.test.base_rows(), {}
    for m in rates:
        has = ref.features[PRESENT + m].numpy()[rows]
        with torch.no_grad():
            for word, sel in (("with", has), ("without", ~has)):
                sub = fed.test.subset(np.nonzero(sel)[0])
                out[f"accuracy/{word}:{m}"] = global_metrics(model, sub, fed.meta.num_classes)["accuracy"]
    return out


def split_json(raw: dict, cfg, run_dir: Path, exp) -> None:
    """A group's post-run step (``post = { call = "split_json", writes = "split.json" }``)."""
    (Path(run_dir) / "split.json").write_text(json.dumps(split_accuracy(run_dir), indent=1))
