"""The wireless grid's checkpointing (issue 26, item 1): one checkpoint after the last round changes no
result, and only the Fig. 3 runs keep every round's. (Its claims, paired by seed and made from 5 seeds
only: tests/test_bench_spec_wireless.py.)"""

from pathlib import Path

import pytest

# ----------------------------------------------------------------------------- checkpoints (issue 26, item 1)

GRID = Path(__file__).resolve().parent.parent / "benchmarks" / "wireless" / "grid.toml"
SMALL = ["data.name=mfeat", 'data.views=["pix", "fou", "kar"]', "modalities.name=mixed", "partition.num_clients=6",
         "model.name=multimodal", "model.feat_dim=16", "model.mlp_hidden=[32]", "train.local_epochs=1",
         "train.batch_size=64", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1", "rounds=4", "eval_every=2"]


def _timeless(exp):
    import json
    rows = [json.loads(x) for x in (exp.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rows]



@pytest.mark.parametrize("algo", [["algorithm.name=pfedwireless", "algorithm.k_hat=0.5", "algorithm.a_th=2"],
                                  ['algorithm={name="fedamp"}', "clients_per_round=3"]])
def test_checkpointing_once_gives_the_same_run_as_every_round(tmp_path, algo):
    """The grid's ``checkpoint_every = 30`` (one checkpoint, after the last round) against the
    default 1: the same metrics in every round and the same final server and client state, for the
    proposed method and a baseline with per-client state."""
    import torch

    from mmfl.config import load_config
    from mmfl.engine.runner import Experiment

    exps = []
    for every in (1, 30):
        cfg = load_config(None, [*SMALL, *algo, f"output_dir={tmp_path}", f"name=every{every}",
                                 f"checkpoint_every={every}"])
        exp = Experiment(cfg, progress=False)
        exp.run()
        exps.append(exp)
    a, b = exps
    assert _timeless(a) == _timeless(b) and len(_timeless(a)) == 4
    for sa, sb in ((a.server.state_dict(), b.server.state_dict()), (a.store.state_dict(), b.store.state_dict())):
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert sorted(p.name for p in (b.run_dir / "checkpoints").glob("round_*")) == ["round_00004"]


def test_grid_checkpoints_the_last_round_only_except_the_fig3_runs():
    from mmfl.bench import load_grid

    runs = load_grid(GRID).runs()
    fig3 = [r for r in runs if r.raw.get("keep_checkpoints", 1) > 1]
    assert fig3 and all(r.raw["checkpoint_every"] == 1 for r in fig3)  # Xi of every round (Fig. 3)
    rest = [r for r in runs if r not in fig3]
    assert rest and all(r.raw["checkpoint_every"] >= r.raw["rounds"] for r in rest)
