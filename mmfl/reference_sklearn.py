"""The scikit-learn references of ``mmfl run --reference`` (:mod:`mmfl.reference`,
docs/reference.md): logistic regression (and a random forest where the features are few) on
the flattened features of the federation's pooled training rows, scored on the run's test set.

Flattening: every feature tensor of the pooled training set (each modality, and its
``present/<m>`` mask as a 0/1 column and ``length/<m>`` where they exist), in sorted key order,
reshaped to ``[N, -1]`` and concatenated. A key the test set lacks is filled there with ones for
a ``present/`` mask (the modality is there) and zeros otherwise. Logistic regression sees the
columns standardised (``StandardScaler`` in a ``Pipeline``); the forest sees them as they are.
Beyond ``sklearn_max_rows`` training rows both train on a seeded subset of that size.
"""

from __future__ import annotations

import time

import numpy as np

from mmfl.data.base import PRESENT, ArrayDataset
from mmfl.seeds import derive_seed

NOT_RETRIEVAL = "does not apply to retrieval (no class labels to fit; the references are the server alone)"


def flat_columns(data: ArrayDataset, keys: list[str], widths: list[int] | None = None) -> np.ndarray:
    """``data``'s rows as one float32 matrix: the tensors of ``keys`` flattened and concatenated
    (a key ``data`` lacks: ``widths`` columns of ones for a ``present/`` mask, zeros otherwise)."""
    feats, _ = data.get()
    n = len(data)
    cols = []
    for i, k in enumerate(keys):
        if k in feats:
            cols.append(feats[k].detach().reshape(n, -1).float().cpu().numpy())
        else:
            width = widths[i] if widths else 1
            cols.append(np.full((n, width), 1.0 if k.startswith(PRESENT) else 0.0, dtype=np.float32))
    return np.concatenate(cols, axis=1) if cols else np.zeros((n, 0), dtype=np.float32)


def training_matrix(train: ArrayDataset, seed: int, max_rows: int) -> tuple[np.ndarray, np.ndarray, list[str], int]:
    """``(X, y, keys, rows in the pooled set)`` of the pooled training rows (a seeded subset of
    ``max_rows`` when there are more)."""
    keys = sorted(train.features)
    total = len(train)
    if total > max_rows:
        rng = np.random.default_rng(derive_seed(seed, "reference", "sklearn-rows"))
        train = train.subset(np.sort(rng.choice(total, size=max_rows, replace=False)))
    return flat_columns(train, keys), train.label_array(), keys, total


def _scores(y: np.ndarray, pred: np.ndarray, personal_rows) -> dict:
    from sklearn.metrics import balanced_accuracy_score

    out = {"accuracy": float((pred == y).mean()) if len(y) else float("nan"),
           "uar": float(balanced_accuracy_score(y, pred)) if len(y) else float("nan")}
    if personal_rows is not None:
        out["personal_accuracy"] = personal_mean(pred, y, personal_rows)
    return out


def personal_mean(pred: np.ndarray, y: np.ndarray, personal_rows) -> float | None:
    """The mean over clients (with test rows) of the accuracy on each client's personalized test
    rows (:func:`mmfl.core.personal.personal_test_indices`): the personalized family's metric."""
    accs = [float((pred[r] == y[r]).mean()) for r in personal_rows if len(r)]
    return float(np.mean(accs)) if accs else None


def sklearn_references(train: ArrayDataset, test: ArrayDataset, seed: int, settings, methods: list[str],
                       threads: int = 0, personal_rows=None, log=print) -> dict:
    """``{"logistic_regression": {...}, "random_forest": {...}}`` for the requested ``methods``: each
    its accuracy and UAR on ``test`` (and ``personal_accuracy`` with ``personal_rows``), the rows
    and columns it trained on and its seconds, or ``{"skipped": why}``."""
    from contextlib import nullcontext

    from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

    with threadpool_limits(threads) if threads else nullcontext():  # the run's `threads` (0: the default)
        return _fit(train, test, seed, settings, methods, threads, personal_rows, log)


def _fit(train, test, seed, settings, methods, threads, personal_rows, log) -> dict:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y, keys, total = training_matrix(train, seed, settings.sklearn_max_rows)
    widths = [int(np.prod(train.features[k].shape[1:])) for k in keys]
    Xt = flat_columns(test, keys, widths)
    yt = test.label_array()
    shape = {"train_rows": int(X.shape[0]), "pooled_rows": int(total), "features": int(X.shape[1]),
             "columns": keys}
    out: dict = {}
    if len(np.unique(y)) < 2:
        why = f"the pooled training rows hold one class ({int(y[0]) if len(y) else '-'}): nothing to fit"
        return {m: {"skipped": why} for m in methods if m in ("logistic_regression", "random_forest")}
    if "logistic_regression" in methods:
        t0 = time.perf_counter()
        log(f"reference logistic_regression: {X.shape[0]} rows x {X.shape[1]} features")
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
        import warnings

        from sklearn.exceptions import ConvergenceWarning

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            model.fit(X, y)
        converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
        out["logistic_regression"] = {**_scores(yt, model.predict(Xt), personal_rows), **shape,
                                      "converged": converged, "seconds": time.perf_counter() - t0}
    if "random_forest" in methods:
        if X.shape[1] > settings.forest_max_features:
            out["random_forest"] = {"skipped": f"{X.shape[1]} flattened features > reference.forest_max_features "
                                               f"= {settings.forest_max_features}"}
        else:
            t0 = time.perf_counter()
            log(f"reference random_forest: {X.shape[0]} rows x {X.shape[1]} features, {settings.forest_trees} trees")
            forest = RandomForestClassifier(n_estimators=settings.forest_trees, n_jobs=threads or None,
                                            random_state=derive_seed(seed, "reference", "random_forest") % 2**32)
            forest.fit(X, y)
            out["random_forest"] = {**_scores(yt, forest.predict(Xt), personal_rows), **shape,
                                    "seconds": time.perf_counter() - t0}
    return out
