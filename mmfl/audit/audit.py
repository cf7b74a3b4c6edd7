"""``mmfl audit RUN``: what an honest-but-curious server learns from a finished run.

The server's view of the run's first rounds is replayed bit for bit (:mod:`mmfl.audit.replay`),
and the attacks of :mod:`mmfl.audit.attacks` run on it, each where it applies:

- **labels from updates** (every reply holding the model's classifier, ``model/*``: FedAvg,
  MOON, FedProx, FedCMI, ...): the predicted majority class per client (hit rate, chance
  ``1/C``) and the Spearman correlation of the bias update with the client's class counts;
- **gradient inversion** of the first ``invert`` clients' updates: cosine of the
  reconstruction to the nearest true row, next to a random input's (chance);
- **shared rows** (PartialFL's ``x/<m>``) and **cut activations** (split learning's
  ``act/<m>``, with the client-side weights the server itself sent in ``sl_begin``): label
  probe and reconstruction of the private modality (PartialFL) or of the modality's raw
  input (split), fit on the run's **test split as the server's auxiliary data**;
- **membership** of training rows in the final model (loss threshold).

- **public-set representations** (CreamFL's ``rep/<m>``): each client's private label
  histogram inferred by shadow clients the server runs on its auxiliary data with known label
  skews and a ridge meta-model (:mod:`mmfl.audit.label_skew`): total variation distance and
  top-class hit per client, next to the uniform histogram's and chance.
"""

from __future__ import annotations

from contextlib import nullcontext

import json
from pathlib import Path

import numpy as np
import torch

from mmfl.audit.attacks import (bias_update, invert_update, label_inference, membership_auc, nearest_cosine,
                                per_sample_loss, probe_rows)
from mmfl.audit.label_skew import representation_attack
from mmfl.audit.replay import ServerView, replay
from mmfl.errors import MMFLError
from mmfl.seeds import derive_seed


def _flat(x: torch.Tensor) -> np.ndarray:
    return x.reshape(len(x), -1).double().cpu().numpy()


def update_attacks(view: ServerView, invert: int = 2, steps: int = 300) -> dict | None:
    """The updates of the last replayed round (round 1 of MOON equals FedAvg's: its previous
    model is the global one, so its contrastive term is constant)."""
    fed, c = view.federation, view.federation.meta.num_classes
    hits, rhos, inv = [], [], []
    last = max((e.round for e in view.exchanges if e.route == "train"), default=0)
    for e in view.train_replies(last):
        sent = {k: v for k, v in e.sent.arrays.items()}
        reply = {k: v for k, v in e.reply.arrays.items()}
        db = bias_update(sent, reply, c)
        if db is None:
            continue
        y = fed.clients[e.client].label_array()  # numpy
        li = label_inference(db, np.bincount(y, minlength=c))
        hits.append(li["hit"])
        rhos.append(li["spearman"])
        if len(inv) < invert:
            x, _ = fed.clients[e.client].get()
            like = {m: t[:1].float() for m, t in x.items()}
            model = view.make_model(fed.modalities_of(e.client), fed.group_of(e.client), fed.meta_of(e.client))
            rec = invert_update(model, sent, reply, like, li["predicted"], steps=steps)
            g = torch.Generator().manual_seed(1)
            for m, r in rec.items():
                rand = torch.randn(r.shape, generator=g)
                inv.append((nearest_cosine(r, x[m].float()), nearest_cosine(rand, x[m].float())))  # on the CPU
    if not hits:
        return None
    out = {"clients": len(hits), "majority_class_hit_rate": float(np.mean(hits)), "chance": 1.0 / c,
           "spearman_mean": float(np.nanmean(rhos))}
    if inv:
        ok = [a for a, _ in inv if np.isfinite(a)]  # an inversion can diverge (a noised update): counted apart
        out["inversion_cosine"] = float(np.mean(ok)) if ok else float("nan")
        if len(ok) < len(inv):
            out["inversion_diverged"] = len(inv) - len(ok)
        out["inversion_chance"] = float(np.mean([b for _, b in inv]))
    return out


def shared_row_attacks(view: ServerView) -> dict | None:
    """PartialFL: ``x/<m>`` (the client's shareable rows, in its row order)."""
    fed = view.federation
    test_x, test_y = fed.test.get()
    res = []
    for e in view.exchanges:
        for key, got in e.reply.arrays.items():
            if not key.startswith("x/") or got.dim() < 2:
                continue
            m = key[2:]
            x, y = fed.clients[e.client].get()
            if len(got) != len(y) or m not in test_x:
                continue
            private = [p for p in x if p != m and p in test_x and not p.startswith(("present/", "length/"))]
            p = private[0] if private else None
            res.append(probe_rows(_flat(test_x[m]), _flat(test_x[p]) if p else None, test_y.cpu().numpy(), _flat(got),
                                  _flat(x[p]) if p else None, y.cpu().numpy()))
    return _mean(res) if res else None


def activation_attacks(view: ServerView) -> dict | None:
    """Split learning: the first ``act/<m>`` batch of each client, with the client-side weights the
    server sent it in ``sl_begin`` (exactly the weights of that batch)."""
    from mmfl.algorithms.split_cut import client_forward
    from mmfl.core.dp_rows import fixed_batchnorm

    fed = view.federation
    test_x, test_y = fed.test.get()
    res, seen = [], set()
    begins = {(e.round, e.client): e.sent for e in view.exchanges if e.route == "sl_begin"}
    for e in view.exchanges:
        if e.route != "sl_forward" or (e.round, e.client) in seen or (e.round, e.client) not in begins:
            continue
        seen.add((e.round, e.client))
        model = view.make_model(fed.modalities_of(e.client), fed.group_of(e.client), fed.meta_of(e.client))
        state = model.state_dict()
        for k, v in begins[(e.round, e.client)].arrays.items():
            if k in state:
                state[k] = v
        model.load_state_dict(state)
        model.train()  # as the client computed its activations (BatchNorm on the batch), dropout off
        for mod in model.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.eval()
        u = bool(getattr(view.config.algorithm.params, "u_shaped", False))
        dp_rows = getattr(view.config, "dp", None) is not None and view.config.dp.mode == "rows"
        x, y = fed.clients[e.client].get()
        with torch.no_grad(), (fixed_batchnorm(model) if dp_rows else nullcontext()):  # as the client ran it
            aux = client_forward(model, {k: v for k, v in test_x.items()}, u)
            mine = client_forward(model, x, u)
        for key, got in e.reply.arrays.items():
            if not key.startswith("act/"):
                continue
            m = key[4:]
            # the auditor's ground truth: which of the client's rows each activation is
            d = torch.cdist(got.double().reshape(len(got), -1).cpu(), mine[m].double().reshape(len(mine[m]), -1).cpu())
            rows = d.argmin(1).to(y.device)
            if dp_rows:  # noised rows match no clean one: the rows of the client's seeded schedule instead
                rows = _first_batch_rows(view, e, len(y), e.reply.arrays.get("present/" + m)).to(y.device)
            res.append(probe_rows(_flat(aux[m]), _flat(test_x[m]), test_y.cpu().numpy(), _flat(got),
                                  _flat(x[m][rows]), y[rows].cpu().numpy()))
    return _mean(res) if res else None


def _first_batch_rows(view: ServerView, e, n: int, present) -> torch.Tensor:
    """The rows of client ``e.client``'s first batch in round ``e.round`` (the auditor's ground truth,
    for activations under ``[dp] mode = "rows"``, whose noise defeats nearest-row matching): its seeded
    schedule as ``SplitClient.sl_begin`` draws it (the first ``randperm`` of the generator seeded by
    the sl_begin message, its first message of the round: ``derive_seed(seed, round, client,
    "sl_begin", 0)``), the first ``batch_size`` positions, the rows holding the modality (``present``)."""
    from mmfl.seeds import derive_seed

    g = torch.Generator(device="cpu").manual_seed(derive_seed(view.config.run.seed, e.round, e.client, "sl_begin", 0))
    rows = torch.randperm(n, generator=g, device="cpu")[:view.config.train.batch_size]
    return rows if present is None else rows[present.to(torch.bool).reshape(-1).cpu()]


def membership(run_dir: Path, view: ServerView, max_rows: int = 2000) -> dict | None:
    from mmfl.api import load_run

    try:
        model = load_run(run_dir).model()
    except MMFLError:
        return None
    fed = view.federation
    per = max(1, max_rows // max(1, fed.num_clients))
    member, non = [], []
    try:  # each client's rows against as many test rows with the same modalities (a client may hold few)
        for c in range(fed.num_clients):
            if len(fed.clients[c].label_array()):
                keep = tuple(fed.modalities_of(c))
                member.append(per_sample_loss(model, fed.clients[c], per, seed=c, keep=keep))
                non.append(per_sample_loss(model, fed.test, len(member[-1]), seed=10_000 + c, keep=keep))
    except (KeyError, TypeError, RuntimeError):  # a model without class logits (retrieval)
        return None
    return membership_auc(np.concatenate(member), np.concatenate(non)) if member else None


def _mean(rows: list[dict]) -> dict:
    keys = rows[0].keys()
    return {"samples": len(rows), **{k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}}


def audit(run_dir: str | Path, rounds: int = 1, invert: int = 2, steps: int = 300, shadows: int = 32) -> dict:
    """The audit of a finished run folder (see the module's docstring)."""
    from mmfl.config import load_config

    run_dir = Path(run_dir).expanduser()
    if not (run_dir / "config.toml").is_file():
        raise MMFLError(f"{run_dir}: not an mmfl run folder (no config.toml)")
    cfg = load_config(run_dir / "config.toml")
    view = replay(cfg, rounds)
    return {"run": str(run_dir), "algorithm": cfg.algorithm.name,
            "dp": None if cfg.dp is None else cfg.dp.mode,
            "replayed_rounds": rounds, "attacked_round": rounds,
            "labels_from_updates": update_attacks(view, invert, steps),
            "shared_rows": shared_row_attacks(view),
            "cut_activations": activation_attacks(view),
            "public_representations": representation_attack(
                view, shadows, seed=derive_seed(cfg.run.seed, "audit", "shadows")),
            "membership": membership(run_dir, view)}


def lines(result: dict) -> list[str]:
    """The audit as a few readable lines."""
    out = [f"audit of {result['run']} ({result['algorithm']}, dp {result['dp'] or 'off'}; "
           f"the server's view of {result['replayed_rounds']} round(s) replayed; updates of round "
           f"{result['attacked_round']})"]
    u = result["labels_from_updates"]
    if u:
        out.append(f"  labels from updates: majority class of {100 * u['majority_class_hit_rate']:.0f}% of "
                   f"{u['clients']} clients (chance {100 * u['chance']:.0f}%), Spearman {u['spearman_mean']:.2f}")
        if "inversion_cosine" in u:
            out.append(f"  gradient inversion: cosine to the nearest true row {u['inversion_cosine']:.3f} "
                       f"(random input {u['inversion_chance']:.3f})")
    for name, title in (("shared_rows", "shared rows"), ("cut_activations", "cut activations")):
        s = result[name]
        if s:
            t = f"  {title}: label probe {100 * s['label_accuracy']:.1f}% (majority {100 * s['label_chance']:.1f}%)"
            if "reconstruction_cosine" in s:
                t += f", reconstruction cosine {s['reconstruction_cosine']:.3f} (centred on the auxiliary mean: 0 = none)"
            out.append(t)
    r = result.get("public_representations")
    if r:
        out.append(f"  public-set representations: label histogram of {r['clients']} clients from {r['shadows']} "
                   f"shadow clients, total variation {r['tv_mean']:.3f} (uniform {r['tv_uniform_mean']:.3f}), "
                   f"top class {100 * r['top_hit_rate']:.0f}% (chance {100 * r['top_chance']:.0f}%)")
    m = result["membership"]
    if m:
        out.append(f"  membership (loss threshold): AUC {m['auc']:.3f}, advantage {m['advantage']:.3f}")
    return out


def cmd_audit(args) -> int:
    result = audit(args.run, rounds=args.rounds, invert=args.invert, steps=args.steps, shadows=args.shadows)
    print("\n".join(lines(result)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0
