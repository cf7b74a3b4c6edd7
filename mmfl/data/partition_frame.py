"""A federation's partition as data (``mmfl.partition(config)``, ``Result.partition()``; docs/api.md):
per client and class, how many training rows it holds, and how many of them hold each modality.

Long form (default), one row per client x class (every class of the client's data set, zeros
included): ``client``, ``label`` (class id), ``class`` (class name), ``count`` (rows of that class),
then one column per modality of the federation: the rows of that class that hold it (0 where the
client does not hold the modality; fewer than ``count`` where per-sample masks ``present/<m>``
mark rows without it). Wide form (``wide=True``): Flower Datasets' ``compute_counts`` shape, index
``client``, one column per class name, the counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mmfl.data.base import PRESENT

if TYPE_CHECKING:  # pragma: no cover
    import pandas


def class_names(meta) -> list[str]:
    """The class names of a data set's meta (``"0"``, ``"1"``, ... where it names none)."""
    names = [str(n) for n in (meta.class_names or [])][:meta.num_classes]
    return names + [str(j) for j in range(len(names), meta.num_classes)]


def modalities_of_federation(fed) -> list[str]:
    """Every modality some client's data set has, in first-seen order."""
    out: list[str] = []
    for cid in range(fed.num_clients):
        for m in fed.meta_of(cid).modalities:
            if m not in out:
                out.append(m)
    return out


def partition_frame(fed, wide: bool = False) -> "pandas.DataFrame":
    """The partition of ``fed`` (a :class:`~mmfl.data.base.Federation`) as a DataFrame (module doc)."""
    import pandas as pd

    mods = modalities_of_federation(fed)
    rows = []
    for cid in range(fed.num_clients):
        data, meta = fed.clients[cid], fed.meta_of(cid)
        k = meta.num_classes
        y = np.asarray(data.label_array(), dtype=np.int64)
        count = np.bincount(y, minlength=k)[:k]
        held = set(fed.modalities_of(cid)) & set(data.modalities)
        per_mod = {}
        for m in mods:
            if m not in held:
                per_mod[m] = np.zeros(k, dtype=np.int64)
                continue
            mask = data.features.get(PRESENT + m)
            if mask is not None and data.indices is not None:  # a view on shared tensors
                mask = mask[data.indices]
            keep = np.ones(len(y), bool) if mask is None else np.asarray(mask.cpu(), dtype=bool)
            per_mod[m] = np.bincount(y[keep], minlength=k)[:k]
        for j, name in enumerate(class_names(meta)):
            rows.append({"client": cid, "label": j, "class": name, "count": int(count[j]),
                         **{m: int(per_mod[m][j]) for m in mods}})
    df = pd.DataFrame(rows, columns=["client", "label", "class", "count", *mods])
    if not wide:
        return df
    out = df.pivot_table(index="client", columns="class", values="count", aggfunc="sum", fill_value=0, sort=False)
    out.columns.name = None
    return out.astype(np.int64)
