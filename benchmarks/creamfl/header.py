"""The CreamFL report's setting text: each setting's scale read off its config (and the size of
its public set)."""

from __future__ import annotations

import os


def public_size(b, setting: str) -> int:
    """|P| of a setting's public set (loads the data set)."""
    from mmfl.config import resolve
    from mmfl.data import DATASETS

    cfg = resolve(b.config("t1", "creamfl", setting))
    bundle = DATASETS.get(cfg.data.name).factory(cfg.data.params)
    return len(bundle.public) if bundle.public is not None else 0


def scale_lines(b) -> list[str]:
    from mmfl.config import resolve

    out = []
    for st, se in b.grid.settings("t1").items():
        cfg = resolve(b.config("t1", "creamfl", st))  # the setting's config as it is (its algorithm is creamfl)
        mods = ", ".join(f"{g.modalities or g.clients}: " + ", ".join(
            f"{k}={v}" for k, v in g.model.values.items() if k in ("cnn_channels", "mlp_hidden", "feat_dim"))
            for g in cfg.client_models)
        extra = "; ".join(f"{e.data.name} ({e.partition.name}, {e.partition.params.num_clients} clients"
                          + (f", beta {e.partition.params.beta}" if hasattr(e.partition.params, "beta") else "")
                          + ")" for e in cfg.client_data)
        srv = ", ".join(f"{k}={v}" for k, v in cfg.model.values.items()
                        if k in ("cnn_channels", "mlp_hidden", "feat_dim"))
        out.append(f"- **{st}** (`{os.path.relpath(se.config[0], b.grid.root)}`): data `{cfg.data.name}` "
                   f"(|public| = {public_size(b, st)}), {cfg.partition.params.num_clients} paired clients "
                   f"({cfg.partition.name}); uni-modal clients: {extra}; {cfg.run.rounds} rounds, "
                   f"{cfg.run.clients_per_round} clients per round, {cfg.train.local_epochs} local epochs, "
                   f"{cfg.train.optimizer} lr {cfg.train.lr}, batch {cfg.train.batch_size}. Server [model]: {srv}; "
                   f"[[client_models]]: {mods or 'none'} (FedAvg/FedIoT: none, every client has the server's model).")
    return out
