"""Reading finished runs of a raw folder: summaries, metric rows, the final or best
evaluated value, extra evaluation files written after a run, values by seed, mean curves.
Every reader caches per run folder (one :class:`Results` per report)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from mmfl.report import load_metrics


def finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Results:
    """The runs of one raw folder. A run is *finished* when its summary.json exists,
    *failed* when only its failed.txt does (a diverged run: the message)."""

    def __init__(self, raw_dir: str | Path, files: tuple[str, ...] = ()):
        """``files``: JSON files a post-run step writes into run folders (``eval_private.json``,
        ``vqa.json``, ...); :meth:`final` overlays their keys on the final row."""
        self.raw = Path(raw_dir)
        self.files = tuple(files)
        self._rows: dict[str, list[dict]] = {}
        self._final: dict[tuple, dict | None] = {}

    def summary(self, name: str) -> dict | None:
        p = self.raw / name / "summary.json"
        return json.loads(p.read_text()) if p.is_file() else None

    def finished(self, name: str) -> bool:
        return (self.raw / name / "summary.json").is_file()

    def failed(self, name: str) -> str | None:
        """The failure message of a run that has no summary but a failed.txt, else None."""
        p = self.raw / name / "failed.txt"
        return p.read_text().strip() if p.is_file() and not self.finished(name) else None

    def file(self, name: str, filename: str) -> dict | None:
        p = self.raw / name / filename
        return json.loads(p.read_text()) if p.is_file() else None

    def rows(self, name: str) -> list[dict]:
        """metrics.jsonl of a finished run ([] when the run is not finished)."""
        if name not in self._rows:
            self._rows[name] = load_metrics(self.raw / name) if self.finished(name) else []
        return self._rows[name]

    def final(self, name: str, key: str = "accuracy") -> dict | None:
        """The last row of a finished run that has ``key`` (its final evaluation), with the
        keys of the run's ``files`` laid over it (``_files``: which were there) and run totals:
        ``_mb_up``/``_mb_down``/``_mb_round`` (mean MB per round), ``_mb_total``, ``_wall``
        (summed round wall time, s), ``_nonfinite`` (non-finite metrics: the row's ``key``,
        ``test_loss``, any round's ``train_loss``). None for an unfinished run or one never
        evaluated."""
        ck = (name, key)
        if ck in self._final:
            return self._final[ck]
        rows = self.rows(name)
        evals = [r for r in rows if key in r]
        out = None
        if evals or any(self.file(name, f) is not None for f in self.files):
            out = dict(evals[-1]) if evals else {}
            out["_files"] = []
            for f in self.files:
                extra = self.file(name, f)
                if extra is not None:
                    out.update(extra)
                    out["_files"].append(f)
            n = max(len(rows), 1)
            up = [r.get("bytes_up", 0) for r in rows]
            down = [r.get("bytes_down", 0) for r in rows]
            out["_mb_up"] = sum(up) / n / 1e6
            out["_mb_down"] = sum(down) / n / 1e6
            out["_mb_round"] = out["_mb_up"] + out["_mb_down"]
            out["_mb_total"] = (sum(up) + sum(down)) / 1e6
            out["_wall"] = float(sum(r.get("wall_time_s", 0.0) for r in rows))
            out["_nonfinite"] = [k for k in (key, "test_loss") if k in out and not finite(out[k])] + \
                (["train_loss"] if any("train_loss" in r and not finite(r["train_loss"]) for r in rows) else [])
        self._final[ck] = out
        return out

    def value(self, name: str, key: str = "accuracy", reader: str = "final", eval_key: str | None = None):
        """One number of one run: ``reader`` "final" (the final evaluated row, with the
        ``files`` overlaid: the last row with ``eval_key``, default ``key``, so run totals
        such as ``_mb_up`` can be read off it), "best" (the maximum of ``key`` over the rows),
        "summary" (summary.json) or a JSON file name (``"vqa.json"``: a file a post-run step
        wrote into the run folder). None when absent."""
        if reader == "final":
            r = self.final(name, eval_key or key)
            return None if r is None else r.get(key)
        if reader.endswith(".json"):
            f = self.file(name, reader)
            return None if f is None else f.get(key)
        if reader == "best":
            v = [r[key] for r in self.rows(name) if finite(r.get(key))]
            return max(v) if v else None
        if reader == "summary":
            s = self.summary(name)
            return None if s is None else s.get(key)
        raise ValueError(f"reader: 'final', 'best' or 'summary', got {reader!r}")

    def by_seed(self, names: dict[int, str], key: str = "accuracy", reader: str = "final",
                keep_failed: bool = False, eval_key: str | None = None) -> dict[int, float | None]:
        """``{seed: value}`` of the finished runs of ``names`` (``{seed: run name}``) with a
        finite value; ``keep_failed``: a failed run gives ``None`` (a diverged run counts)."""
        out: dict[int, float | None] = {}
        for seed, name in names.items():
            v = self.value(name, key, reader, eval_key)
            if finite(v):
                out[seed] = float(v)
            elif keep_failed and self.failed(name) is not None:
                out[seed] = None
        return out

    def vals(self, names, key: str = "accuracy", reader: str = "final", eval_key: str | None = None) -> list[float]:
        """The finite values of the finished runs among ``names`` (a list or ``{seed: name}``)."""
        names = names if isinstance(names, dict) else dict(enumerate(names))
        return [v for v in self.by_seed(names, key, reader, eval_key=eval_key).values() if v is not None]

    def mean_curve(self, names, key: str = "accuracy") -> list[dict]:
        """``[{"round", key}]``: the mean over the finished runs among ``names`` of each
        evaluated row, as long as the shortest run ([] when none finished)."""
        names = list(names.values()) if isinstance(names, dict) else list(names)
        curves = [[r for r in self.rows(n) if key in r] for n in names if self.finished(n)]
        if not curves:
            return []
        rounds = min(len(c) for c in curves)
        return [{"round": curves[0][i].get("round", i + 1), key: float(np.mean([c[i][key] for c in curves]))}
                for i in range(rounds)]
