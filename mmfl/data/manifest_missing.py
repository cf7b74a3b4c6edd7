"""Missing modalities of a manifest, per row: which cells are absent, the declared rules for
rows that cannot be used, the ``present/<m>`` masks and the lines a load prints about them.

A modality cell is *absent* when it is empty (an empty string, None, a NaN in a Parquet or
Hugging Face column) or names a file that does not exist (a path cell with a known extension,
or a table's image/audio cell whose bytes were not stored and whose file is gone,
:class:`mmfl.data.tables.MissingFile`). With ``data.missing = "allow"`` (the default) such a
row keeps its other modalities: the absent cell becomes zeros of the column's shape, and
``present/<m>`` (bool ``[N]``, :data:`mmfl.data.base.PRESENT`) is False for it in every split
where some row lacks ``m``. ``"error"`` refuses the first absent cell in one line.

Declared rules (one ``mmfl: note:`` line each time they apply):

- a row with no modality at all is dropped (it carries nothing to train or test on);
- a train/test row with no label is dropped with ``data.unlabelled = "drop"`` (the default:
  no algorithm here uses unlabelled rows yet), refused with ``"error"``. Public rows
  (CreamFL's public set) may be unlabelled and are kept.

Checks: a modality absent on every train row is an error (nothing could train its encoder);
a test split without any row of a modality, and a client whose rows all lack a modality, are
each one ``mmfl: warning:`` line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmfl.data.base import PRESENT
from mmfl.data.labels import listed
from mmfl.data.manifest_cells import file_kind
from mmfl.data.manifest_rows import empty
from mmfl.errors import DataError

EMPTY, NO_FILE = "empty", "no file"


def note(line: str) -> None:
    print(f"mmfl: note: {line}", file=sys.stderr, flush=True)


def warn(line: str) -> None:
    print(f"mmfl: warning: {line}", file=sys.stderr, flush=True)


def absent_reason(cell: Any, root: Path) -> tuple[str, str] | None:
    """Why a modality cell is absent: (``EMPTY`` | ``NO_FILE``, the missing file's path or ""),
    or None for a cell holding a value."""
    from mmfl.data.tables import MissingFile

    if isinstance(cell, MissingFile):
        return NO_FILE, cell.path
    if isinstance(cell, (list, tuple)) and not cell:
        return EMPTY, ""
    if not isinstance(cell, np.ndarray) and empty(cell):
        return EMPTY, ""
    if isinstance(cell, str) and file_kind(cell) is not None:
        path = Path(cell.strip()).expanduser()
        path = path if path.is_absolute() else root / path
        if not path.is_file():
            return NO_FILE, str(path)
    return None


def absent_cells(rows: list[dict], mods: list[str], root: Path) -> tuple[np.ndarray, dict[str, list[str]]]:
    """(bool ``[rows, modalities]``: True where the cell is absent, per modality the paths of
    missing files in row order)."""
    absent = np.zeros((len(rows), len(mods)), dtype=bool)
    files: dict[str, list[str]] = {m: [] for m in mods}
    for i, row in enumerate(rows):
        for j, m in enumerate(mods):
            why = absent_reason(row.get(m), root)
            if why is not None:
                absent[i, j] = True
                if why[0] == NO_FILE:
                    files[m].append(why[1])
    return absent, files


def refuse_absent(rows, mods, root, where) -> None:
    """``data.missing = "error"``: a DataError naming the first absent cell."""
    for n, row in enumerate(rows, 1):
        for m in mods:
            why = absent_reason(row.get(m), root)
            if why is None:
                continue
            what = "empty cell" if why[0] == EMPTY else f"file not found: {why[1]}"
            raise DataError(f"{where(n, m)}: {what} (data.missing = \"error\"; the default \"allow\" loads the "
                            f"row with present/{m} = False)")


def rows_to_keep(rows, absent: np.ndarray, labelled: np.ndarray, public: np.ndarray, p, where) -> np.ndarray:
    """Positions of the rows a load keeps, after the declared rules (a note line per rule that
    dropped rows; ``unlabelled = "error"`` raises on the first unlabelled train/test row)."""
    no_label = ~labelled & ~public
    if no_label.any() and p.unlabelled == "error":
        n = int(np.flatnonzero(no_label)[0]) + 1
        raise DataError(f"{where(n, p.label_column)}: empty cell (data.unlabelled = \"error\"; "
                        "the default \"drop\" leaves unlabelled rows out)")
    nothing = absent.all(axis=1)
    numbers = lambda mask: listed([str(i + 1) for i in np.flatnonzero(mask)], 8)  # noqa: E731
    if no_label.any():
        note(f"manifest: {int(no_label.sum())} of {len(rows)} rows have no {p.label_column} and are left out "
             f"(rows {numbers(no_label)}; data.unlabelled = \"drop\": no algorithm here trains on unlabelled rows yet)")
    if (nothing & ~no_label).any():
        note(f"manifest: {int((nothing & ~no_label).sum())} of {len(rows)} rows have no modality at all (every "
             f"modality cell empty or a missing file) and are left out (rows {numbers(nothing & ~no_label)})")
    return np.flatnonzero(~no_label & ~nothing)


def check_presence(present: dict[str, np.ndarray], idx: dict[str, np.ndarray], files: dict[str, list[str]],
                   names: dict[str, str], source) -> None:
    """Errors and lines about absent cells (``present[m]`` bool over the kept rows): a modality
    absent on every train row is an error; otherwise one note line per modality that some row
    lacks, and a warning when no test row has it."""
    for m, have in present.items():
        if have.all():
            continue
        n_train = len(idx["train"])
        if n_train and not have[idx["train"]].any():
            raise DataError(f"{source}: column {m!r}: every train row lacks it ({n_train} empty cells or missing "
                            "files): nothing could train on it; leave it out of data.modalities or fill it")
        lack = ~have
        per = ", ".join(f"{s} {int(lack[i].sum())}" for s, i in idx.items() if lack[i].any())
        nf = files.get(m, [])
        extra = f"; {len(nf)} of them name a file that does not exist, e.g. {nf[0]}" if nf else ""
        name = names.get(m, m)
        share = f"{int(lack.sum())} of {len(have)} rows ({100 * lack.mean():.1f} %)"
        note(f"manifest: {share} lack {name!r} ({per}){extra}; they train and evaluate with {PRESENT}{name} masks")
        if len(idx["test"]) and not have[idx["test"]].any():
            warn(f"manifest: no test row has {name!r} (all {len(idx['test'])} lack it): test accuracy says nothing "
                 f"about how the model uses {name!r}")


def fill(x: torch.Tensor, rows: np.ndarray, n: int) -> torch.Tensor:
    """``x`` (the present rows' values, ``[len(rows), ...]``) scattered into zeros ``[n, ...]``."""
    if len(rows) == n:
        return x
    out = torch.zeros((n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    out[torch.from_numpy(rows)] = x
    return out


def fill_lengths(lengths: torch.Tensor | None, rows: np.ndarray, n: int) -> torch.Tensor | None:
    """Valid lengths of the present rows scattered into ones ``[n]``: an absent row is a sequence
    of length 1 (one zero step), never 0, so that masked pooling stays finite."""
    if lengths is None or len(rows) == n:
        return lengths
    out = torch.ones(n, dtype=lengths.dtype, device=lengths.device)
    out[torch.from_numpy(rows)] = lengths
    return out


def warn_absent_clients(clients, mods: list[str], names: list[str] | None = None) -> None:
    """One warning line per modality that some clients lack on every one of their rows (their
    ``present/<m>`` all False): the client holds the modality in name only."""
    for m in mods:
        key = PRESENT + m
        bad = []
        for cid, c in enumerate(clients):
            if key not in c.features or len(c) == 0:
                continue
            mask = c.features[key] if c.indices is None else c.features[key][c.indices]
            if not bool(mask.any()):
                bad.append(names[cid] if names else str(cid))
        if bad:
            warn(f"{len(bad)} of {len(clients)} clients lack {m!r} on every row (client {listed(bad)}): they "
                 f"train no {m!r} encoder on their own data")
