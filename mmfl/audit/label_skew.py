"""What a client's public-set representations (CreamFL's ``rep/<m>``) reveal of its private
label distribution: a shadow-model property-inference attack.

The method is the shadow-model meta-classifier of property inference (Ateniese et al. 2015,
"Hacking smart machines with smarter ones"; Ganju et al. 2018, "Property inference attacks on
fully connected neural networks using permutation invariant representations", CCS; in
federated learning with auxiliary data, Melis et al. 2019, "Exploiting unintended feature
leakage in collaborative learning", S&P), with the property being the label histogram and a
regressor instead of a classifier:

1. *Shadow clients.* The server knows everything of a client's round but its private data:
   the algorithm and its parameters, the client's architecture (``[[client_models]]``), the
   initial weights, the message it sent (the global representations) and the reply's
   ``num_examples``. For ``shadows`` label histograms ``h_k`` (one single-class histogram per
   class, the rest ``~ Dir(beta_k)``, ``beta_k`` log-uniform in [0.05, 20]: from one class to
   balanced) it draws ``num_examples`` rows of
   its **auxiliary data** (the run's test split of the client's data set, as the other probes
   of ``mmfl audit``) with those proportions and runs the *client's own code* on them
   (:func:`mmfl.engine.client_runtime.run_client`, same round, same message, empty state):
   the representations ``R_k = rep(h_k)`` a client with that histogram would have sent.
2. *Meta-model.* Row for row the representations are of the same public samples, so the
   flattened, centred ``R_k`` are comparable features: a ridge regression
   ``h ~ W vec(R)`` (ridge penalty by leave-one-out, ``RidgeCV``) fit on the shadows.
3. *Attack.* ``h_hat = proj_simplex(W vec(R_client))`` (Duchi et al. 2008, "Efficient projections
   onto the l1-ball", fig. 1) for each client's first reply
   (the round it first trains: its state is empty, as the shadows').

Scored per client against its true histogram ``h``: the total variation distance
``TV = 0.5 * |h_hat - h|_1`` and whether ``argmax h_hat`` is the client's majority class, next
to the no-information baseline (the uniform histogram's TV; a top class guessed at chance, 1/C).
"""

from __future__ import annotations

import numpy as np

REP = "rep/"


def shadow_histograms(num_classes: int, shadows: int, rng: np.random.Generator) -> np.ndarray:
    """``[shadows, C]`` label histograms from one class to balanced: one single-class histogram
    per class first (the corners of the simplex, where ``shadows >= 2 C``), then ``Dir(beta)``,
    ``beta`` log-uniform in [0.05, 20]."""
    corners = np.eye(num_classes) if shadows >= 2 * num_classes else np.zeros((0, num_classes))
    beta = np.exp(rng.uniform(np.log(0.05), np.log(20.0), size=shadows - len(corners)))
    return np.concatenate([corners, np.stack([rng.dirichlet(np.full(num_classes, b)) for b in beta])])


def sample_rows(labels: np.ndarray, hist: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` row positions of ``labels`` whose classes follow ``hist`` (classes absent from the
    auxiliary data are left out; rows drawn with replacement where a class has too few)."""
    have = np.array([np.any(labels == c) for c in range(len(hist))])
    p = hist * have
    p = p / p.sum() if p.sum() > 0 else have / have.sum()
    counts = rng.multinomial(n, p)
    rows = []
    for c, k in enumerate(counts):
        if k:
            pool = np.flatnonzero(labels == c)
            rows.append(rng.choice(pool, size=k, replace=k > len(pool)))
    return np.concatenate(rows) if rows else np.zeros(0, np.int64)


def features(reply_arrays: dict, keys: list[str]) -> np.ndarray:
    """The representations of ``keys`` flattened into one float64 row."""
    return np.concatenate([reply_arrays[k].detach().double().cpu().reshape(-1).numpy() for k in keys])


def simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` onto the probability simplex (Duchi et al. 2008, fig. 1)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    rho = np.nonzero(u * np.arange(1, len(v) + 1) > css - 1)[0][-1]
    return np.maximum(v - (css[rho] - 1) / (rho + 1), 0)


def fit_and_predict(shadow_x: np.ndarray, shadow_h: np.ndarray, target_x: np.ndarray) -> np.ndarray:
    """Ridge meta-model (features standardised, penalty by leave-one-out) from shadow features to
    histograms; the targets' predicted histograms, projected onto the simplex."""
    from sklearn.linear_model import RidgeCV

    mu, sd = shadow_x.mean(0), shadow_x.std(0) + 1e-8
    reg = RidgeCV(alphas=np.logspace(-2, 6, 17)).fit((shadow_x - mu) / sd, shadow_h)
    return np.stack([simplex(p) for p in reg.predict((np.atleast_2d(target_x) - mu) / sd)])


def score(pred: np.ndarray, counts: np.ndarray) -> dict:
    """TV distance and top-class hit of ``pred`` against the true ``counts``, with the
    uniform histogram's TV and the chance of a guessed top class beside them."""
    h = counts / max(counts.sum(), 1)
    c = len(h)
    return {"tv": float(0.5 * np.abs(pred - h).sum()), "tv_uniform": float(0.5 * np.abs(1.0 / c - h).sum()),
            "top_hit": bool(int(np.argmax(pred)) == int(np.argmax(h))), "top_chance": 1.0 / c,
            "true_top_share": float(h.max()), "predicted": [round(float(v), 4) for v in pred]}


def representation_attack(view, shadows: int = 32, seed: int = 0) -> dict | None:
    """The attack on every client's first ``rep/*`` reply in the replayed rounds (None: no run
    of this kind, or no transport to run shadow clients on)."""
    from mmfl.engine.client_runtime import run_client

    tr = getattr(view, "transport", None)
    fed = view.federation
    first: dict[int, object] = {}
    for e in view.exchanges:
        if e.route == "train" and any(k.startswith(REP) for k in e.reply.arrays) and e.client not in first:
            first[e.client] = e
    if not first or not hasattr(tr, "spec") or shadows < 2:
        return None
    rng = np.random.default_rng(seed)
    # one set of shadows per (round, message, the client's structure): clients sharing it share them
    groups: dict[tuple, list[int]] = {}
    for cid, e in sorted(first.items()):
        key = (e.round, id(e.sent), fed.modalities_of(cid), fed.group_of(cid), fed.source_of(cid))
        groups.setdefault(key, []).append(cid)
    per_client = {}
    for key, cids in groups.items():
        rnd, _, holds, group, source = key
        e0 = first[cids[0]]
        keys = sorted(k for k in e0.reply.arrays if k.startswith(REP))
        meta, aux = fed.meta_of(cids[0]), fed.test_of(cids[0])
        c = meta.num_classes
        aux = aux.with_features([k for k in aux.features if k in fed.clients[cids[0]].features])
        ys = aux.label_array()
        sizes = [int(first[cid].reply.scalars.get("num_examples", len(fed.clients[cid]))) for cid in cids]
        hists = shadow_histograms(c, shadows, rng)
        xs = []
        for k, h in enumerate(hists):
            n = int(rng.integers(min(sizes), max(sizes) + 1))
            rows = sample_rows(ys, h, max(n, 2), rng)
            data = aux.subset(rows)
            reply, _ = run_client(
                tr.spec, tr.params, cid=cids[0], rnd=rnd, route="train", call=1000 + k, msg=e0.sent,
                data=data, test_data=None, meta=meta, train=tr.train, seed=tr.seed, state={},
                model_pool=tr._model, init_model=tr.make_model, holds=holds, group=group, source=source,
                public=fed.public, dp=tr.dp, device=tr.device)
            if getattr(tr, "local_dp", None) is not None:  # the client's randomizer, as its real reply had, with
                reply = tr.local_dp(rnd, 1_000_000 + k, e0.sent, reply)  # noise of its own (not the client's)
            xs.append(features(reply.arrays, keys))
            hists[k] = np.bincount(ys[rows], minlength=c) / len(rows)  # the histogram it really trained on
        targets = np.stack([features(first[cid].reply.arrays, keys) for cid in cids])
        preds = fit_and_predict(np.stack(xs), hists, targets)
        for cid, pred in zip(cids, preds):
            counts = np.bincount(fed.clients[cid].label_array(), minlength=c)
            per_client[cid] = {"round": rnd, "modalities": list(holds), **score(pred, counts)}
    rows = list(per_client.values())
    return {"clients": len(rows), "shadows": shadows,
            "tv_mean": float(np.mean([r["tv"] for r in rows])),
            "tv_uniform_mean": float(np.mean([r["tv_uniform"] for r in rows])),
            "top_hit_rate": float(np.mean([r["top_hit"] for r in rows])),
            "top_chance": float(np.mean([r["top_chance"] for r in rows])),
            "per_client": {str(k): v for k, v in sorted(per_client.items())}}
