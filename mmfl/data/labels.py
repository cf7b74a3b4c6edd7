"""Labels checked at load: is the label column a set of classes, and can the classes be learned?

Two checks:

- :func:`check_label_column` (a manifest's raw label cells, before they become class ids):
  with ``data.label_type = "auto"`` (the default) a column that is not a set of classes is
  refused in one line: labels that mix numbers and names; numbers with a fractional part
  (continuous values: a regression target); or numbers of which more than half of the labelled
  rows are distinct, with at least :data:`MIN_DISTINCT` distinct values (integer-valued
  floats from a converter, ids: not classes, since fewer than two rows per class on average
  cannot be learned). ``label_type = "class"`` takes every distinct value as a class name.
- :func:`label_warnings` (any data set, from :func:`mmfl.data.federation.build_federation`):
  one ``mmfl: warning:`` line per kind, each listing every case: classes of the test split that
  no training row has, classes with fewer than :data:`FEW_ROWS` training rows, clients that
  hold a single class. Warnings, not errors: a label-skew partition makes single-class
  clients on purpose, and a small data set may still be worth running.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable

import numpy as np

from mmfl.errors import DataError

FEW_ROWS = 5  # a class with fewer training rows than this is named
MANY_DISTINCT = 0.5  # numeric labels with more distinct values than this share of the rows: not classes
MIN_DISTINCT = 10  # ... and at least this many distinct values (tiny sets keep their few classes)
LABEL_TYPES = ("auto", "class")

_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _kind(v: Any) -> tuple[str, float | None]:
    """("int" | "float" | "name", the number or None): "int" for integers and integer-valued
    floats (``3``, ``3.0``, ``"3"``, ``"3.0"``), "float" for a number with a fractional part."""
    if isinstance(v, (bool, np.bool_)):
        return "name", None
    if isinstance(v, (int, np.integer)):
        return "int", float(v)
    if isinstance(v, (float, np.floating)):
        return ("int" if float(v).is_integer() else "float"), float(v)
    s = str(v).strip()
    if _INT.fullmatch(s):
        return "int", float(s)
    if _FLOAT.fullmatch(s):
        x = float(s)
        return ("int" if x.is_integer() else "float"), x
    return "name", None


HINT = "or set data.label_type = \"class\" to take each distinct value as a class"


def check_label_column(values: list[Any], rows, label_type: str, column: str,
                       where: Callable[[int | None, str], str], numbers=None, hint: str = HINT) -> None:
    """The label cells of the (labelled, non-public) ``rows`` (0-based positions into ``values``)
    as classes, or a DataError naming the manifest, the row and ``data.label_type``.
    ``where(n, column)`` names position ``n`` (1-based) in messages, ``numbers[i]`` the manifest
    row number of position ``i`` (default ``i + 1``); ``hint`` ends the message (how to keep the
    values as classes: ``mmfl convert`` names its ``--label-type class``)."""
    if label_type == "class":
        return
    rows = list(rows)
    kinds = [_kind(values[i]) for i in rows]
    names = [i for i, (k, _) in zip(rows, kinds) if k == "name"]
    nums = [i for i, (k, _) in zip(rows, kinds) if k != "name"]
    if names and nums:
        a, b = nums[0], names[0]
        row = (lambda i: i + 1) if numbers is None else (lambda i: int(numbers[i]))  # noqa: E731
        raise DataError(f"{where(None, column)}: labels mix numbers ({len(nums)} rows, e.g. row {row(a)}: "
                        f"{values[a]!r}) and names ({len(names)} rows, e.g. row {row(b)}: {values[b]!r}); fix the "
                        f"column, {hint}")
    if names or not rows:
        return
    frac = [i for i, (k, _) in zip(rows, kinds) if k == "float"]
    if frac:
        i = frac[0]
        raise DataError(f"{where(i + 1, column)}: label {values[i]!r} is not a whole number: {len(frac)} of "
                        f"{len(rows)} labels have a fractional part, so the column holds continuous values (a "
                        f"regression target?); mmfl trains classifiers: bin the values into classes, {hint}")
    distinct = len({x for _, x in kinds})
    if distinct > MANY_DISTINCT * len(rows) and distinct >= MIN_DISTINCT:
        raise DataError(f"{where(None, column)}: {distinct} distinct numeric labels for {len(rows)} labelled rows "
                        f"(more than half the rows: fewer than 2 rows per class): a regression target or an id, "
                        f"not classes? bin the values into classes, {hint}")


def listed(items: list[str], most: int = 10) -> str:
    """``items`` comma-joined, the first ``most`` of them, then "and N more"."""
    more = len(items) - most
    return ", ".join(items[:most]) + (f" and {more} more" if more > 0 else "")


def label_warnings(train: np.ndarray, test: np.ndarray | None, num_classes: int, class_names: list[str],
                   clients: list[np.ndarray] | None = None, what: str = "", single_class_ok: bool = False,
                   client_names: list[str] | None = None) -> list[str]:
    """The warning lines (without the ``mmfl: warning:`` prefix) about these labels: test classes
    absent from ``train``, classes with 1 to ``FEW_ROWS - 1`` training rows, and ``clients`` (each
    its label array) that hold a single class (not with ``single_class_ok``). ``what`` prefixes
    each line (e.g. the data set's name)."""
    def name(c: int) -> str:
        return repr(class_names[c]) if c < len(class_names) else str(c)

    k = max(num_classes, int(train.max()) + 1 if len(train) else 0,
            int(test.max()) + 1 if test is not None and len(test) else 0)
    n_train = np.bincount(train[train >= 0], minlength=k)
    lines = []
    if test is not None and len(test):
        n_test = np.bincount(test[test >= 0], minlength=k)
        unseen = [c for c in range(k) if n_test[c] and not n_train[c]]
        if unseen:
            rows = int(n_test[unseen].sum())
            lines.append(f"{what}{len(unseen)} class(es) in the test split have no training row: "
                         f"{listed([f'{name(c)} ({n_test[c]} test rows)' for c in unseen])}; no model can "
                         f"predict them, so {rows} of {len(test)} test rows ({100 * rows / len(test):.1f} %) "
                         "count as errors")
    few = [c for c in range(k) if 0 < n_train[c] < FEW_ROWS]
    if few:
        lines.append(f"{what}{len(few)} class(es) have fewer than {FEW_ROWS} training rows: "
                     f"{listed([f'{name(c)} ({n_train[c]})' for c in few])}; too few to learn them reliably")
    if clients is not None and not single_class_ok and len(clients) > 1:
        single = []
        for cid, y in enumerate(clients):
            held = np.unique(y[y >= 0])
            if len(held) == 1:
                label = client_names[cid] if client_names else str(cid)
                single.append(f"{label}: {name(int(held[0]))} ({len(y)} rows)")
        if single:
            lines.append(f"{what}{len(single)} of {len(clients)} clients hold a single class: client "
                         f"{listed(single)}; their local training sees one label (a label-skew partition "
                         "does this on purpose; otherwise raise partition.beta or use fewer clients)")
    return lines


def warn_labels(*args, **kwargs) -> None:
    """Print :func:`label_warnings` as ``mmfl: warning:`` lines on stderr."""
    for line in label_warnings(*args, **kwargs):
        print(f"mmfl: warning: {line}", file=sys.stderr, flush=True)
