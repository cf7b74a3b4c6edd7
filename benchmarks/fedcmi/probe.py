"""The post-run step of the FedCMI weak-modality diagnosis (grid: diagnose.toml; its report is
tables-diagnose.toml): ``probe.json``, a ridge-regression probe refit on the final global model's
self-projector output ``z_m`` over the whole training split (the same read-out for every method), next
to the model's own ``accuracy/<m>``. Loaded through the spec's ``hooks``."""

from __future__ import annotations

import json
from pathlib import Path


def done(run_dir: Path, raw: dict) -> bool:
    return (run_dir / "summary.json").exists() and (run_dir / "probe.json").exists()


def post(raw, cfg, run_dir: Path, exp) -> None:
    """Refit a ridge probe per modality on the final global model's z_m (train split) -> probe.json."""
    import torch
    import torch.nn.functional as F

    from mmfl.data import DATASETS
    from mmfl.engine import checkpoint
    from mmfl.models.factory import model_factory

    out = run_dir / "probe.json"
    if out.exists() and exp is None:
        return
    bundle = DATASETS.get(cfg.data.name).factory(cfg.data.params)
    server, _, _ = checkpoint.load(checkpoint.latest(run_dir / "checkpoints"))
    model = model_factory(cfg, bundle.meta)()
    model.load_state_dict({k[len("model/"):]: v for k, v in server.items() if k.startswith("model/")})
    model.eval()

    @torch.no_grad()
    def reps(data):
        z, ys = {m: [] for m in model.holds}, []
        for inputs, labels in data.batches(1000, shuffle=False):
            o = model(inputs)
            for m in model.holds:
                z[m].append(o["mod_reps"][m])
            ys.append(labels)
        return {m: torch.cat(v).double() for m, v in z.items()}, torch.cat(ys)

    (ztr, ytr), (zte, yte) = reps(bundle.train), reps(bundle.test)
    row = {}
    for m in model.holds:  # standardised z, one-hot least squares with ridge 0.01 * n
        mu, sd = ztr[m].mean(0), ztr[m].std(0) + 1e-6
        a = torch.cat([(ztr[m] - mu) / sd, torch.ones(len(ytr), 1, dtype=torch.double)], 1)
        b = torch.cat([(zte[m] - mu) / sd, torch.ones(len(yte), 1, dtype=torch.double)], 1)
        w = torch.linalg.solve(a.T @ a + 0.01 * len(a) * torch.eye(a.shape[1], dtype=torch.double),
                               a.T @ F.one_hot(ytr, bundle.meta.num_classes).double())
        row[f"probe_z/{m}"] = float(((b @ w).argmax(1) == yte).double().mean())
    out.write_text(json.dumps(row, indent=1))
