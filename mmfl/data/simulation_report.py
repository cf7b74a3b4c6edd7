"""What ``mmfl partition`` shows beside the class counts: per client, the modalities it holds,
the rows lacking each of them, and what the simulation of ``[modalities]`` / ``[corruption]``
did to its rows (labels dropped or flipped, rows left out by the missing-row policy); the test
set's missing modalities; and the matrix the plot draws as a modality strip
(:func:`mmfl.data.partition_report.plot_federation`).
"""

from __future__ import annotations

import numpy as np

from mmfl.data.base import PRESENT
from mmfl.data.corruption import client_report

COUNTERS = (("labels_dropped", "labels dropped"), ("labels_flipped", "labels flipped"),
            ("incomplete_dropped", "incomplete dropped"), ("empty_dropped", "empty dropped"))


def client_rows(fed) -> list[dict]:
    """One :func:`~mmfl.data.corruption.client_report` dict per client: the federation's own
    (``fed.simulated``) for ``[data]``'s clients, computed from the view for the others."""
    sim = fed.simulated or []
    return [sim[c] if c < len(sim) else client_report(fed.clients[c], tuple(fed.modalities_of(c)), None, {})
            for c in range(fed.num_clients)]


def modality_names(fed) -> list[str]:
    """Every modality some client holds, ``[data]``'s first."""
    names = list(fed.meta.modalities)
    for c in range(fed.num_clients):
        names += [m for m in fed.modalities_of(c) if m not in names]
    return names


def simulation_active(fed, cfg) -> bool:
    """True when the table says more than the class counts: clients differ in modalities,
    samples lack some, or labels were dropped or flipped."""
    mp = cfg.modalities.params
    return (fed.client_modalities is not None or len(fed.meta.modalities) > 1
            or any(r > 0 for r in (*mp.missing_rate.values(), *mp.test_missing_rate.values()))
            or mp.missing_policy != "mask" or cfg.corruption is not None)


def simulation_table(fed, cfg, max_rows: int = 50) -> str:
    """Rows = clients: the modalities each holds (``+``-joined), its training rows, how many of
    them lack each modality (``-`` where it does not hold it), and the counters of what the
    simulation did (only the columns that are not all zero); a total row; a line on the test
    set; the settings that produced it."""
    rows = client_rows(fed)
    mods = modality_names(fed)
    counters = [(k, h) for k, h in COUNTERS if any(r.get(k, 0) for r in rows)]
    header = ["client", "holds", "rows"] + [f"lacking {m}" for m in mods] + [h for _, h in counters]
    body = []
    for c, r in enumerate(rows):
        lack = [str(r["lacking"][m]) if m in r["holds"] else "-" for m in mods]
        body.append([str(c), "+".join(r["holds"]), str(r["rows"])] + lack + [str(r.get(k, 0)) for k, _ in counters])
    if len(body) > max_rows:
        half = max_rows // 2
        body = body[:half] + [["..."] * len(header)] + body[len(body) - (max_rows - half):]
    total = ["all", "", str(sum(r["rows"] for r in rows))]
    total += [str(sum(r["lacking"].get(m, 0) for r in rows)) for m in mods]
    total += [str(sum(r.get(k, 0) for r in rows)) for k, _ in counters]
    body.append(total)
    widths = [max(len(x[j]) for x in [header] + body) for j in range(len(header))]

    def fmt(x):
        return "  ".join(s.ljust(w) if j == 1 else s.rjust(w) for j, (s, w) in enumerate(zip(x, widths)))

    mp = cfg.modalities.params
    lines = ["per client: the modalities it holds and its training rows (simulated by [modalities]"
             + (" and [corruption]" if cfg.corruption is not None else "") + "):",
             fmt(header), "  ".join("-" * w for w in widths)] + [fmt(x) for x in body]
    lines.append(test_line(fed))
    settings = [f"missing_policy {mp.missing_policy}"]
    if cfg.corruption is not None:
        c = cfg.corruption
        settings.append(f"label_missing_rate {c.label_missing_rate:g}")
        settings.append(f"label_noise {c.label_noise['rate']:g} {c.label_noise['kind']}")
    lines.append("settings: " + ", ".join(settings)
                 + "; rows with a dropped label, without a held modality (complete_rows) or without any "
                   "modality do not train")
    return "\n".join(lines)


def test_line(fed) -> str:
    """``test: N rows; lacking <m> k, ...`` of the server's test set."""
    test = fed.test
    rows = test.base_rows()
    parts = []
    for m in test.modalities:
        mask = test.features.get(PRESENT + m)
        if mask is not None:
            parts.append(f"lacking {m} {int((~mask.cpu().numpy()[rows]).sum())}")
    return f"test: {len(rows)} rows" + ("; " + ", ".join(parts) if parts else "; every modality present")


def strip_matrix(fed, ids: list[int]) -> tuple[np.ndarray, list[str]]:
    """``[len(ids), M]``: the share of each client's rows holding each modality (NaN where the
    client does not hold it), and the M modality names: the plot's modality strip."""
    rows = client_rows(fed)
    mods = modality_names(fed)
    out = np.full((len(ids), len(mods)), np.nan)
    for i, c in enumerate(ids):
        r = rows[c]
        for j, m in enumerate(mods):
            if m in r["holds"]:
                out[i, j] = 1.0 - r["lacking"][m] / r["rows"] if r["rows"] else 0.0
    return out, mods
