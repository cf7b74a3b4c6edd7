"""CreamFL benchmark, one rung toward the paper's regime (issue 26; grid.toml group ``rung``):
the mfeat setting at 32 rounds (the paper: 30; Table 1's runs: 16), CreamFL against the server
alone, 5 seeds, paired by seed, beside the same pair at 16 rounds (Table 1's runs). A sibling
of tables.py (``load_sibling``)."""

from __future__ import annotations

import numpy as np

from mmfl.bench import md_table, ms, paired

KEY, TWO = "rsum_authors", "r1_sum"  # the paper's four-term R@1_sum; i2t + t2i R@1 on one gallery
RKEYS = ["fold_i2t_r1", "fold_t2i_r1", "i2t_r1", "t2i_r1", KEY, TWO]


def _verdict(v: dict | None) -> str:
    if v is None or v["n"] < 2:
        return "— | — | — | — | not testable (fewer than 2 paired seeds)"
    return (f"{v['delta']:+.1f} | [{v['lo']:+.1f}, {v['hi']:+.1f}] | {v['p']:.3f} | {v['n']} | "
            f"{v['text'].split(' (')[0]}")


def rung(b) -> list[str]:
    g = b.grid.groups.get("rung")
    if g is None:
        return []
    seeds, rounds = g.seeds, b.config("rung").get("rounds")
    base_rounds = b.config("t1", None, "mfeat").get("rounds")
    out = []
    for st in b.grid.settings("rung"):
        pairs = {"rung": ("rung", "creamfl", "server_alone", rounds),
                 "t1": ("t1", "creamfl", "server_alone", base_rounds)}
        rows = []
        for grp, cream, alone, r in pairs.values():
            for m in (cream, alone):
                if b.vals(grp, m, st, key=KEY):
                    label = b.grid.entry(grp, m).label
                    rows.append([f"{r}", label, *[ms(b.vals(grp, m, st, key=k), len(seeds)) for k in RKEYS]])
        if not rows:
            return ["Not run in this regeneration (no finished rung run; the command above runs it).", ""]
        out += [f"### {st}: {rounds} rounds against Table 1's {base_rounds}", "",
                f"Final round, server model, test set; mean ± std over seeds {seeds} (the columns of Table 1). "
                f"Grid group `rung` (`--group rung`): the setting's config with `rounds = {rounds}`, all else as "
                "Table 1; the server alone as in Table 1.", "",
                *md_table(["rounds", "method", "i2t R@1 (fifths)", "t2i R@1 (fifths)", "i2t R@1 (all)",
                           "t2i R@1 (all)", "R@1_sum (four terms)", "R@1 i2t+t2i (one gallery)"], rows), ""]
        head = ["| claim | metric | mean Δ (paired) | 95% bootstrap CI | paired t-test p | seeds | here |",
                "|---|---|---|---|---|---|---|"]
        lines = []
        gains = {}
        for tag, (grp, cream, alone, r) in pairs.items():
            for key, name in ((KEY, "R@1_sum"), (TWO, "R@1 i2t+t2i (one gallery)")):
                a, z = b.by_seed(grp, cream, st, key=key), b.by_seed(grp, alone, st, key=key)
                common = sorted(set(a) & set(z))
                gains[(tag, key)] = {s: a[s] - z[s] for s in common}
                v = paired(a, z) if len(common) >= 2 else None
                lines.append(f"| CreamFL > server alone, {r} rounds | {name} | {_verdict(v)} |")
        for key, name in ((KEY, "R@1_sum"), (TWO, "R@1 i2t+t2i (one gallery)")):
            hi, lo = gains.get(("rung", key), {}), gains.get(("t1", key), {})
            if len(set(hi) & set(lo)) >= 2:
                lines.append(f"| gain at {rounds} rounds > gain at {base_rounds} | {name} | "
                             f"{_verdict(paired(hi, lo))} |")
        out += ["Paired by seed (`mmfl.sweep.paired_verdict`: the mean per-seed difference, its 95% percentile "
                "bootstrap interval over the seeds, `scipy.stats.ttest_rel`; *holds* when the interval lies above "
                "0 and p < 0.05). The last rows compare the gain over the server alone at the two lengths, "
                "seed by seed.", "", *head, *lines, ""]
        for tag in ("rung", "t1"):
            d = list(gains.get((tag, KEY), {}).values())
            if d:
                out.append(f"- Per-seed gain in R@1_sum at {rounds if tag == 'rung' else base_rounds} rounds: "
                           + ", ".join(f"{x:+.1f}" for x in d) + f" (mean {np.mean(d):+.1f}).")
        out.append("")
    return out
