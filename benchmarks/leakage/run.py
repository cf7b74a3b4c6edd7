"""What an honest-but-curious server learns (issue 27 item 6): each algorithm's run, with and
without DP, then ``mmfl audit`` on it; writes benchmarks/results/leakage.md.

    .venv/bin/python benchmarks/leakage/run.py [--out DIR] [--seed S] [--workers 2]

DP: ``dp.mode = "local"`` (each reply clipped to norm 1 and noised, z = 1) where the algorithm
takes it, else DP-SGD (``dp.mode = "sample"``, z = 1, clip 1), else the per-row Gaussian mechanism
(``dp.mode = "rows"``, z = 1, clip 1), else "refused" with mmfl's line. ``--dp-only``: only the DP
cells, written over the existing table's DP rows of those algorithms.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CELLS = [  # name, config, overrides
    ("FedAvg", "mmfl/configs/demo.toml", ["rounds=5"]),
    ("MOON", "mmfl/configs/demo.toml", ["rounds=5", "algorithm.name=moon"]),
    ("FedCMI", "mmfl/configs/fedcmi.toml", ["rounds=3"]),
    ("CreamFL", "mmfl/configs/creamfl_mfeat.toml", ["rounds=3"]),
    ("CreamFL (4 image clients, Dirichlet 0.1)", "mmfl/configs/creamfl_mfeat.toml",  # the label skew of its
     ["rounds=1", "clients_per_round=4", "client_data=[]", 'partition={name="dirichlet",beta=0.1,num_clients=4}',  # MNIST clients, on
      'modalities={name="explicit",holds=[["image"],["image"],["image"],["image"]]}',  # mfeat, small: what the
      "algorithm.public_size=300", "train.local_epochs=1"]),  # representation attack costs on a shared machine
    ("PartialFL", "mmfl/configs/partialfl_digits.toml", ["rounds=5"]),
    ("split learning", "mmfl/configs/partialfl_digits.toml",
     ["rounds=2", 'algorithm={name="split_learning"}', 'privacy.labels="shareable"']),
    ("split learning (U-shaped)", "mmfl/configs/partialfl_digits.toml",
     ["rounds=2", 'algorithm={name="split_learning_u"}']),
]
DP = {"local": ['dp.mode="local"', "dp.clip_norm=1.0", "dp.noise_multiplier=1.0"],
      "sample": ['dp.mode="sample"', "dp.clip_norm=1.0", "dp.noise_multiplier=1.0"],
      "rows": ['dp.mode="rows"', "dp.clip_norm=1.0", "dp.noise_multiplier=1.0"]}
MMFL = [sys.executable, "-m", "mmfl.cli"]
# the audit's arguments where not "--rounds 2": CreamFL's replies hold no model update; its representation
# attack reads each client's first reply, so one replayed round (6 of 8 clients) halves its shadow clients
AUDIT = {"CreamFL": ["--rounds", "1"], "CreamFL (4 image clients, Dirichlet 0.1)": ["--rounds", "1"]}
REUSE = False


def sets(over: list[str]) -> list[str]:
    return [a for o in over for a in ("--set", o)]


def cell(out: Path, seed: int, name: str, config: str, over: list[str], dp: bool) -> dict:
    slug = name.lower().replace(" ", "_").replace("(", "").replace(")", "").replace("-", "_") + ("_dp" if dp else "")
    base = [*over, f"seed={seed}", "threads=1", f"output_dir={str(out)!r}", f"name={slug!r}"]
    js = out / f"{slug}.audit.json"
    if REUSE and js.is_file() and (out / slug / "summary.json").is_file():  # finished before: read it back
        summary = json.loads((out / slug / "summary.json").read_text())
        return {"name": name, "dp": json.loads(js.read_text())["dp"] or "off", "audit": json.loads(js.read_text()),
                "accuracy": summary.get("final_accuracy"), "epsilon": epsilon_of(out / slug)}
    tried = []
    modes = ["local", "sample", "rows"] if dp else [None]
    if REUSE and (out / slug / "summary.json").is_file() and dp:  # the run finished before: audit it only
        cfg = (out / slug / "config.toml").read_text()
        modes = [m for m in ("local", "sample", "rows") if f'mode = "{m}"' in cfg][:1] or [None]
    for mode in modes:
        if REUSE and (out / slug / "summary.json").is_file():
            break
        cmd = [*MMFL, "run", config, *sets(base + (DP[mode] if mode else [])), "--no-progress", "--overwrite"]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode == 0:
            break
        tried.append(f"{mode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    else:
        return {"name": name, "dp": "refused", "why": "; ".join(tried)}
    a = subprocess.run([*MMFL, "audit", str(out / slug), *AUDIT.get(name, ["--rounds", "2"]), "--json", str(js)],
                       cwd=ROOT, capture_output=True, text=True)
    if a.returncode != 0:
        return {"name": name, "dp": mode or "off", "why": "audit failed: " + a.stderr.strip()[-300:]}
    summary = json.loads((out / slug / "summary.json").read_text())
    return {"name": name, "dp": mode or "off", "audit": json.loads(js.read_text()),
            "accuracy": summary.get("final_accuracy", summary.get("final", {}).get("accuracy")),
            "epsilon": epsilon_of(out / slug)}


def epsilon_of(run: Path) -> float | None:
    """The run's last ``dp/epsilon`` (None without DP)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    eps = [r["dp/epsilon"] for r in rows if "dp/epsilon" in r]
    return eps[-1] if eps else None


def merge_dp_rows(old: str, rows: list[dict], seed: int) -> str:
    """``old`` (leakage.md) with each DP row of the algorithms in ``rows`` replaced by the new one."""
    new = {r["name"]: line for r, line in zip(rows, table(rows, seed, "").split("\n")[-len(rows) - 1:-1])}
    out = []
    attacks = next(x for x in table(rows, seed, "").splitlines() if x.startswith("Attacks ("))
    for line in old.splitlines():
        if line.startswith("Attacks ("):  # the text naming the DP mechanisms
            line = attacks
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[1] in new and cells[2] not in ("off", "DP"):
            line = new[cells[1]]
        out.append(line)
    return "\n".join(out) + "\n"


def dp_eps(r: dict) -> str:
    """`` (ε = 12.3)`` after a DP cell's mode (the run's last dp/epsilon at delta 1e-5), else ''."""
    return f" (ε = {r['epsilon']:.3g})" if r.get("epsilon") is not None else ""


def fmt(v, pct=False):
    if v is None:
        return "—"
    return f"{100 * v:.1f}" if pct else f"{v:.3f}"


def table(rows: list[dict], seed: int, cmd: str) -> str:
    head = ("| algorithm | DP | model accuracy % | labels from updates: majority hit % (chance) | Spearman | "
            "inversion cosine (random) | shared/cut rows: label probe % (majority) | reconstruction, centred "
            "cosine (0 = the auxiliary mean) | membership AUC | advantage |\n|" + "---|" * 10)
    lines = [head]
    for r in rows:
        if "audit" not in r:
            why = r.get("why", "").split("; supported")[0].removeprefix("local: ")  # the first refusal, short
            lines.append(f"| {r['name']} | {r['dp']} | — | {why} | | | | | | |")
            continue
        a = r["audit"]
        u, m = a["labels_from_updates"] or {}, a["membership"] or {}
        s = a["shared_rows"] or a["cut_activations"] or {}
        lines.append(
            f"| {r['name']} | {r['dp']}{dp_eps(r)} | {fmt(r['accuracy'], True)} | "
            + (f"{fmt(u.get('majority_class_hit_rate'), True)} ({fmt(u.get('chance'), True)})" if u else "—")
            + f" | {fmt(u.get('spearman_mean'))} | "
            + (f"{fmt(u.get('inversion_cosine'))} ({fmt(u.get('inversion_chance'))})" if "inversion_cosine" in u
               else "—")
            + " | " + (f"{fmt(s.get('label_accuracy'), True)} ({fmt(s.get('label_chance'), True)})" if s else "—")
            + " | " + (f"{fmt(s.get('reconstruction_cosine'))}" if "reconstruction_cosine" in s else "—")
            + f" | {fmt(m.get('auc'))} | {fmt(m.get('advantage'))} |")
    return (f"# What the server learns: `mmfl audit` per algorithm, with and without DP\n\n"
            f"Command: `{cmd}` (seed {seed}; one run per cell: these are measurements of one run each, "
            f"not orderings).\n\n"
            "Attacks (docs/security.md, 'What the server learns'): the server's view of rounds 1-2 replayed "
            "bit for bit (`mmfl audit RUN --rounds 2`), the updates of round 2 attacked; labels from the classifier's bias update (iDLG / LLG-style; hit = the client's "
            "majority class predicted, over the clients of round 2); gradient inversion of 2 clients' "
            "updates (Geiping et al. 2020, cosine of the reconstruction to the nearest true row, a random "
            "input's in brackets); shared rows (PartialFL's x/<m>) and cut activations (split learning, with "
            "the client-side weights the server sent): a logistic-regression label probe and a ridge "
            "reconstruction of the private modality (PartialFL) or of the raw input (split; both centred on the "
            "auxiliary mean row, so 0 = nothing beyond the average row), fit on the run's "
            "test split as the server's auxiliary data; membership: loss threshold (Yeom et al. 2018) on the "
            "final model, 0.5 = nothing. DP: local (each reply clipped to norm 1, noise z = 1) where the "
            "algorithm takes it, else DP-SGD (z = 1, clip 1; FedCMI and CreamFL: batch-level clipping), else the "
            "per-row Gaussian mechanism (`dp.mode = \"rows\"`, z = 1, clip 1: PartialFL, split learning); the DP "
            "cell gives the run's final epsilon at delta 1e-5 (docs/dp.md). The DP rows of FedCMI, CreamFL, "
            "PartialFL and split learning: `python benchmarks/leakage/run.py --dp-only --only FedCMI CreamFL "
            "PartialFL \"split learning\" \"split learning (U-shaped)\"` (seed 0).\n\n" + "\n".join(lines) + "\n")


def reps_block(rows: list[dict], seed: int, cmd: str, old: str = "") -> str | None:
    """CreamFL: what its public-set representations reveal of each client's label histogram
    (``mmfl audit``'s shadow-client attack, mmfl/audit/label_skew.py), per client. ``old``: the
    block as leakage.md has it; the rows and commands of cells not run now are kept."""
    got = [r for r in rows if "audit" in r and r["audit"].get("public_representations")]
    if not got:
        return None
    names = {r["name"] for r in got}
    keep = [ln for ln in old.splitlines() if ln.startswith("| ") and not ln.startswith("| algorithm")
            and ln.split(" | ")[0][2:] not in names]
    cmds = [ln for ln in old.splitlines() if ln.startswith("- ") and ln[2:].split(":")[0] not in names]
    lines = ["| algorithm | DP | client | modalities | round | true top-class share | TV (uniform) | "
             "top class hit (chance) |\n|---|---|---|---|---|---|---|---|", *keep]
    for r in got:
        rep = r["audit"]["public_representations"]
        for cid, c in rep["per_client"].items():
            lines.append(f"| {r['name']} | {r['dp']} | {cid} | {'+'.join(c['modalities'])} | {c['round'] + 1} | "
                         f"{c['true_top_share']:.2f} | {c['tv']:.3f} ({c['tv_uniform']:.3f}) | "
                         f"{'yes' if c['top_hit'] else 'no'} ({100 * c['top_chance']:.0f}%) |")
        lines.append(f"| {r['name']} | {r['dp']} | mean of {rep['clients']} | | | | {rep['tv_mean']:.3f} "
                     f"({rep['tv_uniform_mean']:.3f}) | {100 * rep['top_hit_rate']:.0f}% "
                     f"({100 * rep['top_chance']:.0f}%) |")
        cmds.append(f"- {r['name']}: `{cmd}` (seed {seed}; {rep['shadows']} shadow clients per client structure)")
    return ("<!-- reps -->\n## CreamFL: the label distribution from public-set representations\n\n"
            "Each client's first reply (`rep/<m>`; the audit replays round 1, `mmfl audit RUN --rounds 1`: the "
            "clients of its cohort) against shadow clients the server runs itself: the client's own code, "
            "architecture, round and message on auxiliary rows (the test split of the client's data set) drawn "
            "with known label histograms (one per class, the rest Dirichlet with beta log-uniform in [0.05, 20]), "
            "a ridge meta-model from the flattened representations to the histogram, projected onto the simplex "
            "(property inference with shadow models: Ateniese et al. 2015, Ganju et al. 2018; docs/security.md). "
            "TV = total variation distance to the client's true histogram, next to the uniform histogram's (the "
            "no-information baseline); top class hit = the predicted majority class is the client's, chance "
            "1/C. One run per cell (measurements, not orderings). Commands:\n\n"
            + "\n".join(cmds) + "\n\n" + "\n".join(lines) + "\n<!-- /reps -->\n")


def write_block(text: str, start: str, end: str) -> None:
    """Replace the block ``start``...``end`` of leakage.md with ``text`` (appended when absent)."""
    path = ROOT / "benchmarks" / "results" / "leakage.md"
    doc = path.read_text()
    if start in doc:
        pre, _, rest = doc.partition(start)
        doc = pre + text + rest.partition(end + "\n")[2]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    path.write_text(doc)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(ROOT / "runs" / "leakage"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", nargs="*")
    p.add_argument("--reuse", action="store_true", help="read back the cells audited before (their .audit.json)")
    p.add_argument("--dp-only", action="store_true", help="only the DP cells, merged into the existing table")
    p.add_argument("--write-reps", action="store_true",
                   help="with --only: write the CreamFL representation block into leakage.md")
    a = p.parse_args()
    global REUSE
    REUSE = a.reuse
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(n, c, o, dp) for n, c, o in CELLS for dp in (False, True) if (not a.only or n in a.only)
            and (dp or not a.dp_only)]
    with ThreadPoolExecutor(a.workers) as ex:
        rows = list(ex.map(lambda j: cell(out, a.seed, *j), jobs))
    for r in rows:
        print(r["name"], r["dp"], "ok" if "audit" in r else r.get("why"), flush=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    cmd = "python benchmarks/leakage/run.py" + (f" --seed {a.seed}" if a.seed else "")
    path = ROOT / "benchmarks" / "results" / "leakage.md"
    if a.dp_only:  # merged into the existing table; the other blocks stay as they are
        path.write_text(merge_dp_rows(path.read_text(), rows, a.seed))
    elif not a.only:  # the table anew; the blocks of seeds.py and of the representation attack are kept
        old = path.read_text() if path.is_file() else ""
        keep = "".join(m + old.partition(m)[2].partition(e)[0] + e + "\n" for m, e in
                       (("<!-- reps -->", "<!-- /reps -->"), ("<!-- seeds -->", "<!-- /seeds -->")) if m in old)
        path.write_text(table(rows, a.seed, cmd) + ("\n" + keep if keep else ""))
    print(table(rows, a.seed, cmd))
    doc = (ROOT / "benchmarks" / "results" / "leakage.md").read_text()
    reps = reps_block(rows, a.seed, cmd + (" --only " + " ".join(map(repr, a.only)) + " --write-reps" if a.only else ""),
                      doc.partition("<!-- reps -->")[2].partition("<!-- /reps -->")[0])
    if reps and (not a.only or a.write_reps):
        write_block(reps, "<!-- reps -->", "<!-- /reps -->")
        print(reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
