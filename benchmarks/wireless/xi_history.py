"""Post-run hooks of the wireless grids (``hooks`` of tables.toml): a run that keeps its checkpoints
(the Fig. 3 runs, ``keep_checkpoints`` > 1) is finished when it has ``xi_history.json``: xi~ (eq. 4,
the row softmax of Xi) of every group after every round, read off the kept checkpoints, plus who holds
what and which classes (the ``coef_history`` kind reads it); then all but the last checkpoint go."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def _needs(raw: dict) -> list[str]:
    return ["xi_history.json"] if raw.get("keep_checkpoints", 1) > 1 else []


def done(d: Path, raw: dict) -> bool:
    return (d / "summary.json").exists() and all((d / f).exists() for f in _needs(raw))


def post(raw: dict, cfg, d: Path, exp=None) -> None:
    if "xi_history.json" in _needs(raw) and not (d / "xi_history.json").exists():
        hist = xi_history(cfg, d)
        if len(hist["rounds"]) < cfg.run.rounds:
            raise RuntimeError(f"{d.name}: only {len(hist['rounds'])} of {cfg.run.rounds} checkpoints kept")
        (d / "xi_history.json").write_text(json.dumps(hist))
        for p in sorted((d / "checkpoints").glob("round_?????"))[:-1]:  # the last one stays (LATEST)
            shutil.rmtree(p, ignore_errors=True)


def xi_history(cfg, run_dir: Path) -> dict:
    import numpy as np
    import torch
    from safetensors import safe_open

    from mmfl.data.federation import build_federation

    fed = build_federation(cfg)
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("round_?????") if (p / "meta.json").is_file())
    rounds, xi = [], {}
    for p in ckpts:
        with safe_open(str(p / "server.safetensors"), framework="pt") as f:
            for k in (k for k in f.keys() if k.startswith("xi/")):
                xi.setdefault(k[len("xi/"):], []).append(torch.softmax(f.get_tensor(k).to(torch.float64), dim=1).tolist())
        rounds.append(int(json.loads((p / "meta.json").read_text())["round"]))
    return {"rounds": rounds, "xi_tilde": xi, "num_clients": fed.num_clients,
            "holds": [list(fed.modalities_of(c)) for c in range(fed.num_clients)],
            "classes": [sorted(int(v) for v in np.unique(c.label_array())) for c in fed.clients],
            "eta_hat": cfg.algorithm.params.eta_hat}
