"""Attackers cannot stop a robust rule (issue 27, item 4): 1, 3 or 5 of 10 clients send invalid
replies (``inflate_examples``: ``num_examples`` = 1e9, dropped by reply validation), which leaves
fewer replies than Krum/Multi-Krum sized for f = 3 (9) or Bulyan for f = 1 (7) need. Every rule
finishes the run; a rule short of replies lowers f with one warning line per round
(docs/robust.md, "Too few updates")."""

from __future__ import annotations

import pytest
import torch

from helpers import rows as read_rows, config, experiment


BASE = ["data.name=digits", "partition.num_clients=10", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "train.batch_size=128", "threads=1", "rounds=2",
        'attack.kind="inflate_examples"']
PARAMS = {"krum": ["algorithm.aggregation_params.f=3"], "multi_krum": ["algorithm.aggregation_params.f=3"],
          "bulyan": ["algorithm.aggregation_params.f=1"], "norm_clip": ["algorithm.aggregation_params.clip_norm=0.5"]}
RULES = ["median", "trimmed_mean", "krum", "multi_krum", "bulyan", "norm_clip", "norm_clip_adaptive"]


def lowered(rule: str, attackers: int) -> str | None:
    """The f the rule falls back to with ``10 - attackers`` replies (None: it has enough)."""
    n = 10 - attackers
    if rule in ("krum", "multi_krum"):
        return None if n >= 9 else str((n - 3) // 2)
    if rule == "bulyan":
        return None if n >= 7 else str((n - 3) // 4)
    return None


@pytest.mark.parametrize("attackers", [1, 3, 5])
@pytest.mark.parametrize("rule", RULES)
def test_invalid_reply_attackers_never_stop_a_rule(tmp_path, capsys, rule, attackers):
    exp = experiment(config(tmp_path, rule, f"algorithm.aggregation={rule}", *PARAMS.get(rule, []),
                            f"attack.fraction={attackers / 10}", base=BASE, rounds=None))
    capsys.readouterr()
    exp.run()  # no error: the run finishes
    err = capsys.readouterr().err.splitlines()
    rows = read_rows(exp)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["replies_rejected"] == attackers and r["clients_replied"] == 10 - attackers for r in rows)
    assert all(torch.isfinite(v).all() for v in exp.server.model.state_dict().values() if v.is_floating_point())
    lines = [line for line in err if "aggregation rule" in line]
    f = lowered(rule, attackers)
    if f is None:
        assert lines == []
    else:
        assert len(lines) == 2 and all(f"f lowered to {f} for this round" in line for line in lines), err
