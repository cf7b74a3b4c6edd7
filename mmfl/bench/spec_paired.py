"""Block kinds of a TOML table spec (:mod:`mmfl.bench.spec`) for tables whose columns are a group's
settings, claim tables of paired tests, the run-cost sentence and a block written into a section of
another file. Each kind is ``fn(b, block, f) -> lines`` (docs/benchmarks.md "Table specs").

- ``setting_columns``: one row per method, ``cells`` a list of templates where an entry
  ``{ per_setting = "<template>" }`` becomes one cell per column setting; ``values = { name = <metric> }``
  are aggregated per setting as ``{v.name}``; ``row.<method>`` holds the row's constants (``{row.x}``,
  and ``{at.x}`` = ``row.x[<setting>]`` inside a ``per_setting`` cell).
- ``claims``: claims "a > b" as paired tests over the seeds both sides have
  (:func:`mmfl.sweep.paired_verdict`): holds / **reversed** / unresolved, nothing claimed from fewer
  than :data:`mmfl.bench.render.MIN_SEEDS_FOR_CLAIM` seeds; ``summary``: only the sentence counting them
  (``claims = "<id>"``: the claims of the block with that ``id``).
- ``run_cost``: ``text`` with ``{cost}`` = "Runs: n of N planned finished; summed run time ...".
- ``into_section``: its own ``blocks`` rendered and written into ``file`` between ``begin`` and ``end``.

A metric's ``key`` may be a list (the first key a run's final row has: e.g. the engine's
``personal/accuracy`` where a run has it, else ``accuracy``), and ``reader = "sum"`` adds ``key`` over
every row of a finished run (a per-round quantity such as a simulated round time)."""

from __future__ import annotations

from pathlib import Path

from mmfl.bench.render import MIN_SEEDS_FOR_CLAIM, md_table
from mmfl.bench.spec_kinds import _aggregate
from mmfl.bench.spec_read import _m, by_seed as read_by_seed
from mmfl.errors import ConfigError

METRIC = {"key": "accuracy", "reader": "final", "agg": "ms", "scale": 100.0, "digits": 1, "eval_key": None}


def _metric(m: dict | None, base: dict | None = None) -> dict:
    out = {**METRIC, **(base or {}), **(m or {})}
    if bad := set(out) - set(METRIC):
        raise ConfigError(f"table spec: metric: unknown key {sorted(bad)[0]!r} (allowed: {', '.join(METRIC)})")
    return out


def by_seed(b, group: str, method: str, setting: str | None, m: dict) -> dict[int, float]:
    """``{seed: value}`` of the finished runs with a finite value (:func:`mmfl.bench.spec_read.by_seed`;
    ``key`` a list: per seed the first one present; ``reader = "sum"``: the key summed over a run's rows)."""
    names, out = b.names(group, method, setting), {}
    for k in m["key"] if isinstance(m["key"], list) else [m["key"]]:
        mk = _m(None, key=f"sum:{k}", reader="rows") if m["reader"] == "sum" else \
            _m(None, key=k, reader=m["reader"], eval_key=m["eval_key"] or _eval_key(b, k))
        out.update({s: v for s, v in read_by_seed(b, names, mk).items() if s not in out})
    return {s: out[s] for s in names if s in out}


def _eval_key(b, key: str) -> str | None:
    """A run total (``_mb_round``...) is read off the final evaluated row (the grid's ``eval_key``, else accuracy)."""
    return b.grid.eval_key or ("accuracy" if key.startswith("_") else None)


def _agg(vals: dict, n_expected: int, m: dict) -> str:
    """``ms``: "mean ± std" (population), "(n/N)" when seeds are missing; ``mean``
    (:func:`mmfl.bench.spec_kinds._aggregate`); "—" for none."""
    if m["agg"] not in ("ms", "mean"):
        raise ConfigError(f"table spec: metric.agg: 'ms' or 'mean', got {m['agg']!r}")
    return _aggregate(vals, n_expected, m)


def setting_columns(b, block: dict, f) -> list[str]:
    g = block["group"]
    settings = block.get("settings") or list(b.grid.settings(g))
    rows = block.get("rows", "methods")
    methods = list(b.methods(g)) if rows == "methods" else rows
    values = {k: _metric(x) for k, x in block.get("values", {}).items()}
    body = []
    for method in methods:
        const = block.get("row", {}).get(method, {})
        local = {"key": method, "label": b.grid.entry(g, method).label, "row": const}
        cells = []
        for c in block["cells"]:
            if isinstance(c, str):
                cells.append(f.fill(c, **local))
                continue
            for s in settings:
                v = {k: _agg(by_seed(b, g, method, s, m), len(b.names(g, method, s)), m) for k, m in values.items()}
                at = {k: x[s] for k, x in const.items() if isinstance(x, dict) and s in x}
                cells.append(f.fill(c["per_setting"], **local, v=v, at=at, setting=b.grid.settings(g)[s].label))
        body.append(cells)
    return md_table([f.fill(h) for h in block["header"]], body)


def claim_verdict(va: dict, vb: dict, scale: float) -> dict:
    """:func:`mmfl.sweep.paired_verdict` of a − b over the seeds both ``{seed: value}`` have (in a's
    order), with ``word``: holds / **reversed** / unresolved / not claimed (n seeds)."""
    from mmfl.sweep import paired_verdict

    common = [k for k in va if k in vb]
    v = paired_verdict([va[k] for k in common], [vb[k] for k in common], scale)
    return {**v, "word": v["word"] if v["n"] >= MIN_SEEDS_FOR_CLAIM else f"not claimed ({v['n']} seeds)"}


def claim_head(unit: str) -> list[str]:
    return [f"| claim | Δ ({unit}, paired) | 95% bootstrap CI | paired t p | seeds | here |", "|---|---|---|---|---|---|"]


def claim_line(text: str, v: dict, digits: int) -> str:
    p = "–" if v["p"] != v["p"] else f"{v['p']:.3f}"
    return (f"| {text} | {v['delta']:+.{digits}f} | [{v['lo']:+.{digits}f}, {v['hi']:+.{digits}f}] | {p} "
            f"| {v['n']} | {v['word']} |")


def claim_rows(b, block: dict) -> list[tuple[str, dict, int]]:
    """``(text, claim_verdict, digits)`` of each claim both sides have 2+ paired seeds for (a claim's own
    ``metric`` over the block's; a side ``{method, setting, group, metric}``)."""
    g, base = block["group"], _metric(block.get("metric"))
    out = []
    for c in block["claims"]:
        cm = _metric(c.get("metric"), base)
        sides = []
        for side in (c["a"], c["b"]):
            side = side if isinstance(side, dict) else {"method": side}
            sides.append(by_seed(b, side.get("group", g), side["method"], side.get("setting"),
                                 _metric(side.get("metric"), cm)))
        va, vb = sides
        if va and vb and (v := claim_verdict(va, vb, cm["scale"]))["n"] >= 2:
            out.append((c["text"], v, cm["digits"]))
    return out


def count_sentence(words: list[str], what: str) -> str:
    held, rev, open_ = (sum(w == x for w in words) for x in ("holds", "**reversed**", "unresolved"))
    few = len(words) - held - rev - open_
    return (f"{held} of {len(words)} {what} claims hold by the paired test, {rev} are reversed by it, {open_} "
            f"unresolved" + (f", {few} not claimed (fewer than {MIN_SEEDS_FOR_CLAIM} seeds)" if few else "") + ".")


def claims(b, block: dict, f) -> list[str]:
    if isinstance(block["claims"], str):  # another block's claims (its ``id``), e.g. to count them elsewhere
        src = [bl for bl in _all_blocks(f.spec["blocks"]) if bl.get("id") == block["claims"]]
        if not src:
            raise ConfigError(f"table spec: claims = {block['claims']!r}: no block with that id")
        block = {**src[0], **{k: v for k, v in block.items() if k != "claims"}}
    rows = claim_rows(b, block)
    if "summary" in block and not rows and block.get("if_any"):
        return []  # ``if_any = true``: no sentence when no claim has 2+ paired seeds
    if "summary" in block:  # only the sentence counting the verdicts: "{count}"
        return [f.fill(block["summary"], count=count_sentence([v["word"] for _, v, _ in rows], block.get("what", "")))]
    if not rows:
        return []
    lines = claim_head(block.get("unit", "points")) + [claim_line(f.fill(text), v, d) for text, v, d in rows]
    return ([f.fill(block["intro"]), ""] if "intro" in block else []) + lines


def _all_blocks(blocks: list[dict]):
    for bl in blocks:
        yield bl
        yield from _all_blocks(bl.get("blocks", []))


def run_cost(b, block: dict, f) -> list[str]:
    from mmfl.bench.status import run_status, runs_line

    st = run_status(b, b.results.final)
    cost = runs_line(len(st["finished"]), st["planned"], st["run_s"], b.last_invocation())[2:]  # less the "- "
    return f.fill(block["text"], cost=cost).split("\n")


def into_section(b, block: dict, f) -> list[str]:
    from mmfl.bench.spec import KINDS, write_section

    out = []  # the blocks' lines one after another (no empty line between)
    for bl in block["blocks"]:
        out += KINDS[bl["kind"]](b, bl, f) if "kind" in bl else f.fill(bl["text"]).split("\n")
    write_section(Path(b.grid.root) / f.lookup(block["file"]), [block["begin"], *out, block["end"]],
                  block["begin"], block["end"])
    return []


KINDS = {"setting_columns": setting_columns, "claim_table": claims, "run_cost": run_cost, "into_section": into_section}
KEYS = {"settings", "claims", "unit", "summary", "what", "file", "begin", "end", "blocks", "id", "if_any"}
