"""FedMSplit's graph, two diagnostics at seed 0 of grid.toml's configs: (a) the raw (G4) gradient
scale in case D (why (G5) normalizes); (b) case C, beta 0.1: the label similarity of each client's
neighbours weighted by the learned graph, by its cosine part alone, and uniform.

    .venv/bin/python benchmarks/fedmsplit/diagnose.py [--out /tmp/fedmsplit-graph]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mmfl.bench import load_grid

GRID = Path(__file__).resolve().with_name("grid.toml")


def raw_config(setting: str, method: str) -> dict:
    return load_grid(GRID).raw_config("graph", method, setting, 0)


def diagnose(out: Path) -> list[str]:
    """Seed 0: (a) the raw (G4) scale, case D (why (G5) normalizes); (b) case C, beta 0.1: the label
    similarity of each client's neighbours weighted by the learned graph, the cosine part alone, uniform."""
    import torch

    import mmfl.algorithms.fedmsplit as fm
    from mmfl.config import resolve
    from mmfl.engine.runner import Experiment

    torch.set_num_threads(1)
    seen, orig = [], fm.normalized_step

    def spy(row, grad, lr):
        seen.append(float(grad.abs().max()))
        return orig(row, grad, lr)

    fm.normalized_step = spy
    try:
        Experiment(resolve(dict(raw_config("D", "learned"), name="diag-scale", output_dir=str(out))),
                   progress=False).run(overwrite=True)
    finally:
        fm.normalized_step = orig
    lines = [f"raw (G4) max |grad| per row, case D seed 0: {len(seen)} rows, median {np.median(seen):.4f}, "
             f"90th percentile {np.quantile(seen, 0.9):.4f}, max {max(seen):.4f}"]
    exp = Experiment(resolve(dict(raw_config("C-beta0.1", "learned"), name="diag-graph", output_dir=str(out))),
                     progress=False)
    exp.run(overwrite=True)
    srv, fed = exp.server, exp.federation
    P = np.stack([np.bincount(c.label_array(), minlength=fed.meta.num_classes) / len(c) for c in fed.clients])
    sim = (P @ P.T) / np.outer(np.linalg.norm(P, axis=1), np.linalg.norm(P, axis=1))
    for u in ("classifier", *[m for m in srv._modules if m.startswith("encoders.")]):
        cids, a, vec = srv.graph(u)
        S, off = sim[np.ix_(cids, cids)], ~np.eye(len(cids), dtype=bool)

        def weighted(A):
            A = A.numpy().copy()
            A[~off] = 0
            return float(((A / A.sum(1, keepdims=True)) * S).sum(1).mean())

        lines.append(f"case C beta 0.1 seed 0, view {u}: neighbours' label-distribution cosine weighted by the learned "
                     f"graph {weighted(a):.3f}, by its cosine part {weighted(fm.attention_matrix(vec, srv.params.tau)):.3f},"
                     f" uniform {float(S[off].mean()):.3f}; mean A_ii learned {float(a.diag().mean()):.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/fedmsplit-graph", help="run folder")
    print("\n".join(diagnose(Path(ap.parse_args().out))))


if __name__ == "__main__":
    main()
