"""The PartialFL report's prose read off the grid and the numbers: each setting's scale and the
findings."""

from __future__ import annotations

import numpy as np

from mmfl.bench import load_sibling

_r = load_sibling(__file__, "readings")
PRIMARY, METRICS, VARIANTS = _r.PRIMARY, _r.METRICS, _r.VARIANTS
fig_names, _vals, num_clients, base_raw, modalities_of = _r.fig_names, _r._vals, _r.num_clients, _r.base_raw, _r.modalities_of


def findings(s, raw) -> list[str]:
    """Statements read off the numbers (no interpretation)."""
    LABEL = s["label"]
    out = []
    for setting in s["settings"]:
        prim = PRIMARY[setting]
        name = dict(METRICS)[prim]
        for variant in VARIANTS:
            m = {k: _vals(raw, fig_names(setting, k, variant, s), prim) for k in s["methods"]}
            m = {k: v for k, v in m.items() if v}
            if not m:
                continue
            mean = {k: 100 * float(np.mean(v)) for k, v in m.items()}
            std = {k: 100 * float(np.std(v)) for k, v in m.items()}
            fl = [k for k in ("pfl_fedavg", "pfl_fedprox") if k in mean]
            pf = [k for k in ("partialfl", "partialfl_prox") if k in mean]
            parts = []
            if fl and pf:
                best_fl, best_pf = max(fl, key=mean.get), max(pf, key=mean.get)
                parts.append(f"best PartialFL ({LABEL[best_pf]}, {mean[best_pf]:.1f} ± {std[best_pf]:.1f}) vs best "
                             f"FL ({LABEL[best_fl]}, {mean[best_fl]:.1f} ± {std[best_fl]:.1f}): "
                             f"{mean[best_pf] - mean[best_fl]:+.1f} points")
            for ref in ("pfl_centralized", "split_learning"):
                if ref in mean and pf:
                    best_pf = max(pf, key=mean.get)
                    parts.append(f"{LABEL[ref]} {mean[ref]:.1f} ± {std[ref]:.1f}, {mean[ref] - mean[best_pf]:+.1f} "
                                 f"vs best PartialFL")
            if parts:
                out.append(f"- **{setting}, {variant}** ({name}): " + "; ".join(parts) + ".")
        # multimodal vs uni-modal global model
        diffs = []
        for k in s["methods"]:
            a = _vals(raw, fig_names(setting, k, "both", s), prim)
            b = _vals(raw, fig_names(setting, k, "private", s), prim)
            if a and b:
                diffs.append(f"{LABEL[k]} {100 * (np.mean(a) - np.mean(b)):+.1f}")
        if diffs:
            out.append(f"- **{setting}**: multimodal − uni-modal global model ({name}, points): "
                       + ", ".join(diffs) + ".")
        sl = _vals(raw, fig_names(setting, "split_learning", "private", s), "_mb_round")
        su = _vals(raw, fig_names(setting, "split_learning_u", "private", s), "_mb_round")
        fa = _vals(raw, fig_names(setting, "pfl_fedavg", "private", s), "_mb_round")
        pfb = _vals(raw, fig_names(setting, "partialfl", "private", s), "_mb_total")
        fab = _vals(raw, fig_names(setting, "pfl_fedavg", "private", s), "_mb_total")
        if sl and fa:
            out.append(f"- **{setting}** bytes, uni-modal: split learning {np.mean(sl):.2f} MB / round vs FedAvg "
                       f"{np.mean(fa):.2f} MB / round ({np.mean(sl) / np.mean(fa):.2f}x)"
                       + (f", U-shaped split learning {np.mean(su):.2f} MB / round "
                          f"({np.mean(su) / np.mean(fa):.2f}x)" if su else "")
                       + (f"; PartialFL's whole run {np.mean(pfb):.1f} MB vs FedAvg's {np.mean(fab):.1f} MB "
                          f"({np.mean(pfb) / np.mean(fab):.2f}x)" if pfb and fab else "") + ".")
    return out


def scale_lines(s) -> list[str]:
    from mmfl.config import resolve

    out = []
    for setting in s["settings"]:
        cfg = resolve(base_raw(setting, s))
        share, priv = modalities_of(setting, s)
        part = cfg.partition
        pdesc = part.name + (f", beta {part.params.beta}" if hasattr(part.params, "beta") else "")
        k = num_clients(setting, s)
        mv = cfg.model.values
        a = cfg.algorithm.params
        dp = ", ".join(f"{kk}={v}" for kk, v in vars(cfg.data.params).items()
                       if kk in ("num_train", "num_test", "label", "public_fraction"))
        out.append(f"- **{setting}** (`{s['config'][setting]}`): data `{cfg.data.name}` ({dp}); "
                   f"private `{priv}`, shareable `{share}`; {k} clients ({pdesc}), {cfg.run.clients_per_round} per "
                   f"round; {cfg.run.rounds} rounds; model multimodal feat_dim {mv.get('feat_dim')}, "
                   + ", ".join(f"{kk} {mv[kk]}" for kk in ("cnn_channels", "mlp_hidden") if kk in mv)
                   + f", fusion {mv.get('fusion')}; {cfg.train.optimizer} lr {cfg.train.lr}, batch "
                   f"{cfg.train.batch_size}, {cfg.train.local_epochs} local epoch; PartialFL beta {a.beta}, "
                   f"tau {a.tau}, server lr {a.server_lr}; FedProx mu 0.01.")
    return out
