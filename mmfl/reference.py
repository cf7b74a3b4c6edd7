"""References beside a federated result: ``mmfl run CONFIG --reference``, the ``[reference]``
table, ``mmfl.run(cfg, reference=True)`` (docs/reference.md).

After the federated run, on the same split and features, in sub-folders of the run folder:

- ``reference/centralized/``: the same model, the same ``[train]`` and rounds, trained on every
  client's rows pooled (the run's own pooled variant where one is registered with its server
  and client classes, e.g. PartialFL's ``pfl_centralized``; else ``centralized``);
- ``reference/local/``: ``local``, every client its own model, every client every round;
- ``reference/sklearn.json``: scikit-learn logistic regression (and a random forest where the
  flattened features are few) on the pooled training rows (:mod:`mmfl.reference_sklearn`);
- ``reference/summary.json``: one row per reference (what ``mmfl report`` shows).

What is compared depends on the family, read from the server's declared evaluations
(:data:`mmfl.core.evaluation.KINDS`): ``global`` -> test accuracy; ``personalized`` -> the
personalized mean accuracy (each client's test rows); ``clients`` (the run is ``local``) ->
test accuracy; ``retrieval`` -> R@1 sum, and the reference is the server alone (the server's
declared ``alone`` table with no client reached); classifiers do not apply there.

The references train on pooled data: **simulation only** (``mmfl flower`` refuses them). The
child runs drop ``[privacy]``, ``[system]``, ``[attack]``, ``[dp]``, ``[secure_aggregation]`` and
``[tracking]``: a reference is the clean, non-private bound. Each is resumable and is skipped
when already finished with the same config.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, fields
from pathlib import Path

from mmfl.errors import ConfigError, MMFLError
from mmfl.report import final_best

CAVEAT = "reference (pooled data, simulation only)"
METRICS = {"classification": ("accuracy", "test accuracy"),
           "clients": ("accuracy", "test accuracy (clients' models: mean)"),
           "personalized": ("accuracy", "personalized mean accuracy (each client's test rows)"),
           "retrieval": ("r1_sum", "R@1 sum (i2t + t2i, %)")}
DROPPED = ("privacy", "system", "attack", "dp", "secure_aggregation", "tracking", "reference")


def _note(msg: str) -> None:
    print(f"mmfl: note: {msg}", file=sys.stderr, flush=True)


def family(spec) -> str:
    """``classification``, ``personalized``, ``clients`` or ``retrieval``: what the run's main
    metric is, from its server's declared evaluations (the kind reported without a prefix)."""
    kinds = spec.server.evaluations
    main = next((k for k, prefix in kinds.items() if prefix == ""), "global")
    return {"retrieval": "retrieval", "personalized": "personalized", "clients": "clients"}.get(main, "classification")


def _params_table(entry, run_params) -> dict:
    """``entry``'s [algorithm] table carrying the run's values of the fields both have, except the
    fields ``entry``'s params set themselves (a preset such as ``pfl_centralized``'s ``align``)."""
    if entry.params is None or run_params is None:
        return {"name": entry.name}
    from dataclasses import is_dataclass

    preset = any(is_dataclass(b) for b in entry.params.__bases__)  # mmfl.algorithms.registry.preset
    own = set(vars(entry.params).get("__annotations__", {})) if preset else set()
    names = {f.name for f in fields(entry.params)} - own
    ours = asdict(run_params)
    return {"name": entry.name, **{k: ours[k] for k in names if k in ours}}


def centralized_table(cfg) -> dict | None:
    """The [algorithm] table of the centralized reference (None: the run is pooled itself)."""
    from mmfl.algorithms import ALGORITHMS

    spec = ALGORITHMS.get(cfg.algorithm.name).factory
    if spec.pooled:
        return None
    for entry in ALGORITHMS.entries():
        s = entry.factory
        if s.pooled and s.server is spec.server and s.client is spec.client:
            return _params_table(entry, cfg.algorithm.params)
    return {"name": "centralized"}


def alone_table(cfg) -> dict | None:
    """The [algorithm] table of the retrieval family's "server alone" (None: its server declares none)."""
    from mmfl.algorithms import ALGORITHMS

    alone = ALGORITHMS.get(cfg.algorithm.name).factory.server.alone
    if alone is None:
        return None
    name = alone.get("name", cfg.algorithm.name)
    table = _params_table(ALGORITHMS.get(name), cfg.algorithm.params)
    return {**table, **alone}


def child_config(cfg, name: str, algorithm: dict, **run):
    """The reference run's config: the run's with another [algorithm], in ``<run>/reference/<name>``,
    the tables that change training for other reasons than the method dropped (:data:`DROPPED`)."""
    from mmfl.config import resolve

    d = cfg.to_dict()
    for key in DROPPED:
        d.pop(key, None)
    d.update(algorithm=algorithm, name=name, output_dir=str(cfg.run_dir / "reference"), **run)
    return resolve(d)


def _silent(exp):
    """A simulation transport that reaches no client: the server trains alone."""
    from mmfl.core.training import train_for_run
    from mmfl.engine.simulation import SimulationTransport

    class NoClients(SimulationTransport):
        def send(self, route, messages):
            return {}

        def send_stream(self, route, messages, accumulator):
            return None

    c = exp.cfg
    return NoClients(exp.spec, c.algorithm.params, exp.federation, train_for_run(c.train, c.run.rounds), c.run.seed,
                     exp.make_model, exp.store, device=exp.device)


def run_child(ccfg, progress: bool, transport=None) -> list[dict]:
    """Run (or resume, or skip when finished with the same config) a reference run; its rows."""
    from mmfl.engine.runner import Experiment
    from mmfl.report import load_metrics

    d = ccfg.run_dir
    if (d / "summary.json").is_file() and (d / "config.toml").is_file() \
            and (d / "config.toml").read_text() == ccfg.to_toml():
        print(f"reference {ccfg.run.name}: finished before ({d}); not retrained", flush=True)
        return load_metrics(d)
    resume = (d / "config.toml").is_file()
    print(f"reference {ccfg.run.name}: {ccfg.algorithm.name} ({'resumed' if resume else 'training'}) -> {d}",
          flush=True)
    exp = Experiment(ccfg, progress=progress, transport=transport)
    try:
        exp.run(resume=resume, overwrite=not resume)
    except ConfigError as e:
        if not resume or "differs from the saved run" not in str(e):
            raise
        _note(f"reference {ccfg.run.name}: its folder was made with another config; trained again")
        Experiment(ccfg, progress=progress, transport=transport).run(overwrite=True)
    return load_metrics(d)


def _predictions(ccfg, meta, test):
    """The finished reference run ``ccfg``'s final server model's class predictions on ``test``
    (``meta``: the pooled federation's, which built the run's model)."""
    import numpy as np
    import torch

    from mmfl.core.training import load_into
    from mmfl.engine import checkpoint
    from mmfl.models.factory import model_factory

    ckpt = checkpoint.latest(ccfg.run_dir / "checkpoints")
    if ckpt is None:
        raise MMFLError(f"{ccfg.run_dir}: the reference run saved no checkpoint")
    model = model_factory(ccfg, meta)()
    load_into(model, checkpoint.load(ckpt, lazy_clients=True)[0], prefix="model/")
    model.eval()
    preds = []
    with torch.no_grad():
        for inputs, _ in test.batches(1000, shuffle=False):
            preds.append(model(inputs)["logits"].argmax(1).cpu().numpy())
    return np.concatenate(preds) if preds else np.zeros(0, dtype=np.int64)


def run_references(cfg, progress: bool = True) -> dict:
    """Run the references of ``cfg`` (its ``[reference]`` table, defaults if absent) after its run;
    write and return ``<run>/reference/summary.json``."""
    from mmfl.algorithms import ALGORITHMS
    from mmfl.schema import ReferenceConfig

    settings = cfg.reference or ReferenceConfig()
    spec = ALGORITHMS.get(cfg.algorithm.name).factory
    fam = family(spec)
    key, label = METRICS[fam]
    rows: list[dict] = []
    out_dir = cfg.run_dir / "reference"
    from mmfl.engine import runfiles

    runfiles.note(out_dir, owned_dir=True)  # the run's (what --overwrite may delete)
    out_dir.mkdir(parents=True, exist_ok=True)
    methods = settings.methods
    personal = fam == "personalized"
    pooled = rows_of = None
    pooled_run = spec.pooled  # centralized itself: not federated
    if personal or (fam != "retrieval" and any(m in methods for m in ("logistic_regression", "random_forest"))):
        from mmfl.data.federation import build_federation

        pooled = build_federation(cfg, pooled=True)
        if personal:
            from mmfl.core.personal import personal_test_indices

            fed = build_federation(cfg)
            rows_of = personal_test_indices(fed, fed.test, cfg.run.seed, fed.meta.num_classes)
    if "centralized" in methods:
        if fam == "retrieval":
            table = alone_table(cfg)
            if table is None:
                rows.append(dict(method="server alone", note=f"{cfg.algorithm.name}'s server learns nothing "
                                                             "without clients: no server-alone reference"))
            else:
                r = run_child(child_config(cfg, "server_alone", table), progress, transport=_silent)
                rows.append(dict(method="server alone", folder="reference/server_alone", **final_best(r, key),
                                 note=f"{table['name']}'s server on its public set, no client"))
        else:
            table = centralized_table(cfg)
            if table is None:
                rows.append(dict(method="centralized", note="the run is centralized itself"))
            else:
                ccfg = child_config(cfg, "centralized", table)
                r = run_child(ccfg, progress)
                name = "centralized" if table["name"] == "centralized" else f"centralized ({table['name']})"
                row = dict(method=name, folder="reference/centralized", **final_best(r, "accuracy"))
                if personal:  # its final model on each client's personalized test rows
                    from mmfl.reference_sklearn import personal_mean

                    pred = _predictions(ccfg, pooled.meta, pooled.test)
                    y = pooled.test.label_array()
                    row.update(test_accuracy=row.get("final"), final=personal_mean(pred, y, rows_of), best=None,
                               uar=None, note="its final model on each client's test rows, every modality; "
                                              f"test accuracy {100 * (row.get('final') or 0):.2f}%")
                rows.append(row)
    if "local" in methods:
        if fam == "retrieval":
            rows.append(dict(method="local-only", note="does not apply to retrieval (clients' own models are "
                                                  "classifiers or encoders of their own; the server is scored)"))
        elif spec == ALGORITHMS.get("local").factory:
            rows.append(dict(method="local-only", note="the run is local-only itself"))
        else:
            r = run_child(child_config(cfg, "local", {"name": "local"}, sample_fraction=1.0, clients_per_round=0,
                                       personal_eval=personal), progress)
            rows.append(dict(method="local-only", folder="reference/local",
                             **final_best(r, "personal/accuracy" if personal else "accuracy", uar=not personal)))
    rows += _sklearn_rows(cfg, settings, fam, pooled, rows_of, out_dir)
    kind = "this run" if fam == "clients" or pooled_run else "federated"
    summary = {"caveat": CAVEAT, "family": fam, "metric": key, "metric_label": label,
               "federated": {"method": f"{cfg.algorithm.name} ({kind})", "metric": key}, "rows": rows}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    runfiles.seal(cfg.run_dir)  # what reference/ holds now is the run's, file by file (--overwrite)
    return summary


def _sklearn_rows(cfg, settings, fam: str, pooled, rows_of, out_dir: Path) -> list[dict]:
    from mmfl.reference_sklearn import NOT_RETRIEVAL, sklearn_references

    names = {"logistic_regression": "logistic regression", "random_forest": "random forest"}
    wanted = [m for m in names if m in settings.methods]
    if not wanted:
        return []
    if fam == "retrieval":
        return [dict(method=names[m], note=NOT_RETRIEVAL) for m in wanted]
    path = out_dir / "sklearn.json"
    d = cfg.to_dict()
    fingerprint = {k: d.get(k) for k in ("seed", "data", "partition", "modalities")}
    fingerprint["reference"] = {k: v for k, v in asdict(settings).items() if k != "enabled"}
    saved = json.loads(path.read_text()) if path.is_file() else {}
    if saved.get("fingerprint") == fingerprint and all(m in saved.get("results", {}) for m in wanted):
        print(f"reference sklearn: finished before ({path}); not refitted", flush=True)
        res = saved["results"]
    else:
        res = sklearn_references(pooled.clients[0], pooled.test, cfg.run.seed, settings, wanted,
                                 threads=cfg.run.threads, personal_rows=rows_of)
        path.write_text(json.dumps({"caveat": CAVEAT, "fingerprint": fingerprint, "results": res}, indent=1))
    out = []
    for m in wanted:
        r = res[m]
        if "skipped" in r:
            out.append(dict(method=names[m], note=f"skipped: {r['skipped']}"))
            continue
        final = r["personal_accuracy"] if fam == "personalized" else r["accuracy"]
        note = f"sklearn{', standardised' if m == 'logistic_regression' else ''}; {r['train_rows']} rows x " \
               f"{r['features']} features"
        if fam == "personalized":
            note += f"; test accuracy {100 * r['accuracy']:.2f}%; every modality"
        if r.get("converged") is False:
            note += "; did not converge in 1000 iterations"
        out.append(dict(method=names[m], final=final, best=None, uar=r["uar"] if fam != "personalized" else None,
                        note=note))
    return out
