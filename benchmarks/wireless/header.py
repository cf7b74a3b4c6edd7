"""The wireless report's prose read off the grid and the numbers: the scale of each setting,
what each method's evaluation scores, and the findings."""

from __future__ import annotations

import dataclasses

import numpy as np

from mmfl.algorithms.fedavg import FedAvgParams
from mmfl.bench import load_sibling

_r = load_sibling(__file__, "readings")
PARTS, PART_LABEL, KHATS, PAPER_ETA = _r.PARTS, _r.PART_LABEL, _r.KHATS, _r.PAPER_ETA
names_of, make_run, num_devices, _final, _vals, _ms = _r.names_of, _r.make_run, _r.num_devices, _r._final, _r._vals, _r._ms
base_raw = _r.base_raw


def eval_section(s) -> list[str]:
    return [
        "| method | what is scored | where |", "|---|---|---|",
        "| Proposed (`pfedwireless`) | the model each device starts its next round from: W_k for the groups "
        "just aggregated for it, its own trained parameters otherwise (`eval_model = \"device\"`) | the run's "
        "own evaluation (final round) |",
        "| FedFomo, FedAMP | the server's copy of each device's latest model (= the device's own model) | the "
        "run's own evaluation (final round) |",
        "| FedAvg (`mfedavg`), FedProx (`mfedprox`) | the final global model, restricted to each device's "
        "modalities (`keep_only`) | the engine, `personal_eval = true` (final round, `personal/*`) |",
        "| Local training (`local`) | each device's own model (its client state) | the engine, "
        "`personal_eval = true` (final round, `personal/*`) |",
        "",
        "Every row is the engine's personalized evaluation (`mmfl.core.evaluation`) with the run seed: device "
        "k is scored on a seeded subset of the shared test set whose label distribution follows k's training labels "
        "(min(|test|, max(50, n_k)) rows), with only k's modalities; the accuracy is the mean over devices. "
        "The same seed gives every method the same test subsets. All devices train in every round of the "
        "proposed method and of local training; the other methods train K^ devices per round (a device that "
        "was never sampled would be scored with the initial weights; with these round counts every device "
        "is sampled).", ""]


def findings(s, raw) -> list[str]:
    """Statements read off the numbers."""
    LABEL = s["label"]
    out = []
    for setting in s["settings"]:
        for p in s["parts"]:
            got = {m: _vals(raw, names_of(setting, m, p, s)) for m in s["methods"]}
            got = {m: v for m, v in got.items() if v}
            if not got:
                continue
            best = max(got, key=lambda m: np.mean(got[m]))
            pw = got.get("pfedwireless")
            parts = [f"best {LABEL[best]} ({100 * np.mean(got[best]):.1f})"]
            if pw and best != "pfedwireless":
                parts.append(f"Proposed {100 * np.mean(pw):.1f} ({100 * (np.mean(pw) - np.mean(got[best])):+.1f} vs "
                             f"the best)")
            if "local" in got and pw:
                parts.append(f"Proposed − Local {100 * (np.mean(pw) - np.mean(got['local'])):+.1f}")
            if "mfedavg" in got and pw:
                parts.append(f"Proposed − FedAvg {100 * (np.mean(pw) - np.mean(got['mfedavg'])):+.1f}")
            out.append(f"- **{setting}, {PART_LABEL[p]}**: " + "; ".join(parts) + ".")
        ko = _vals(raw, [x for p in s["parts"] for x in names_of(setting, "fedfomo", p, s)], "_fomo_kept_own")
        if ko:
            out.append(f"- **{setting}**: FedFomo's devices kept their own model (every weight 0) in "
                       f"{100 * np.mean(ko):.0f}% of the cases in the final round, averaged over partitions and "
                       "seeds: there it acts as local training.")
        xs = _vals(raw, [x for p in s["parts"] for x in names_of(setting, "pfedwireless", p, s)], "_xi_self/shared")
        if xs:
            k = num_devices(setting, s)
            out.append(f"- **{setting}**: with the paper's eta^ = 0.01, the proposed method's mean xi~_kk of the "
                       f"shared group ends at {np.mean(xs):.4f} (1/K = {1 / k:.4f}): the coefficients stay "
                       "practically uniform, so its aggregation is a plain average over the round's uploaders "
                       "of each group.")
    if "t3" in s["groups"] and "digits" in s["settings"]:
        ratio = {seed: _final(raw, make_run("digits", "pfedwireless", "niid1", seed, s)[0]) for seed in s["seeds"]}
        same = []
        for a in s["alphas"]:
            n_same = n_all = 0
            for seed in s["seeds"]:
                r = _final(raw, make_run("digits", "pfedwireless", "niid1", seed, s, schedule="linear", alpha=a)[0])
                if r is None or ratio[seed] is None:
                    continue
                n_all += 1
                n_same += int(r["accuracy"] == ratio[seed]["accuracy"] and abs(r["_sim"] - ratio[seed]["_sim"]) < 1e-9)
            if n_all:
                same.append(f"alpha {a:g}: {n_same} of {n_all}")
        if same:
            out.append("- **Table III**: linear runs identical to the ratio run of the same seed (same accuracy and "
                       "simulated time): " + "; ".join(same) + ". While 1 − xi~_kk is the same for every device "
                       "(Xi uniform), both metrics rank the devices by latency alone and schedule the same uploads; "
                       "they differ only where alpha times the latency gap is smaller than the spread of 1 − xi~_kk.")
    if "t4" in s["groups"] and "digits" in s["settings"]:
        for part in s["parts"]:
            v = {kh: _vals(raw, names_of("digits", "pfedwireless", part, s, khat=kh)) for kh in s["khats"]}
            fa = {kh: _vals(raw, names_of("digits", "mfedavg", part, s, khat=kh)) for kh in s["khats"]}
            if all(v.values()) and all(fa.values()):
                out.append(f"- **digits, {PART_LABEL[part]}, K^**: Proposed " + ", ".join(
                    f"{kh} {100 * np.mean(v[kh]):.1f}" for kh in s["khats"]) + "; FedAvg " + ", ".join(
                    f"{kh} {100 * np.mean(fa[kh]):.1f}" for kh in s["khats"]) + ".")
    return out


def _fmt_cycles(c) -> str:
    return f"U[{c[0]:g}, {c[1]:g}]" if isinstance(c, (list, tuple)) else f"{c:g}"


def scale_lines(s) -> list[str]:
    LABEL = s["label"]
    from mmfl.config import resolve
    from mmfl.data.federation import build_federation

    out = []
    for setting in s["settings"]:
        raw = base_raw(setting, s)
        cfg = resolve(raw)
        fed = build_federation(cfg)
        combos: dict[str, int] = {}
        for c in range(fed.num_clients):
            key = "+".join(fed.modalities_of(c))
            combos[key] = combos.get(key, 0) + 1
        dp = ", ".join(f"{k}={v}" for k, v in vars(cfg.data.params).items()
                       if k in ("num_train", "num_test", "image_noise", "audio_noise", "views"))
        mv = cfg.model.values
        a = cfg.algorithm.params
        sy = cfg.system
        t = cfg.train
        out.append(f"- **{setting}** (`{s['config'][setting]}`): data `{cfg.data.name}` ({dp}; {len(fed.test)} test rows, "
                   f"{cfg.data.name != 'mfeat' and 'class-paired' or 'instance-paired'}); {fed.num_clients} devices "
                   f"holding " + ", ".join(f"{v}× {k}" for k, v in sorted(combos.items(), key=lambda x: -x[1]))
                   + f" (`[modalities] {cfg.modalities.name}`); {cfg.run.rounds} rounds; model multimodal feat_dim "
                   f"{mv.get('feat_dim')}, "
                   + ", ".join(f"{kk} {mv[kk]}" for kk in ("cnn_channels", "mlp_hidden") if kk in mv)
                   + f", fusion {mv.get('fusion')}; {t.optimizer} lr {t.lr} momentum {t.momentum}, batch "
                   f"{t.batch_size}, {t.local_epochs} local epoch(s); proposed: eta^ {a.eta_hat}, A^th {a.a_th}, "
                   f"grad_estimate {a.grad_estimate}; `[system]` bandwidth {sy.bandwidth_hz:g} Hz, f_k "
                   f"{_fmt_cycles(sy.cycles_per_s)} cycles/s, other values the defaults (docs/system.md).")
    defaults = []
    for m in ("mfedprox", "fedfomo", "fedamp"):
        raw = base_raw(s["settings"][0], s)
        raw["algorithm"] = {"name": m}
        p = resolve(raw).algorithm.params
        family = {f.name for f in dataclasses.fields(FedAvgParams)}  # the aggregation rule: FedAvg's, not the method's
        defaults.append(f"{LABEL[m]} " + ", ".join(f"{k} {v}" for k, v in vars(p).items()
                                                   if k not in family or v != getattr(FedAvgParams(), k)))
    out.append("- Baselines with their registered defaults (the paper gives none): " + "; ".join(defaults) + ".")
    return out
