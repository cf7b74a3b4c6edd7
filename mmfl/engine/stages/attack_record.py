"""``[attack]`` in the round loop: the check that the algorithm exchanges what the attack changes,
and ``attack/kind`` / ``attack/clients`` (the cohort's malicious clients) in each row. The
attack itself acts in the clients' replies (:mod:`mmfl.engine.attack`, applied by the transport)."""

from __future__ import annotations

from mmfl.engine.stages.base import Round, Stage
from mmfl.errors import ConfigError
from mmfl.schema import REPRESENTATION_ATTACKS


class AttackRecord(Stage):
    @classmethod
    def make(cls, exp) -> "AttackRecord | None":
        cfg = exp.cfg
        if cfg.attack is not None and cfg.attack.kind in REPRESENTATION_ATTACKS \
                and not getattr(exp.server, "representation_replies", False):
            raise ConfigError(f"attack.kind: {cfg.attack.kind!r} changes exchanged representations; "
                              f"{cfg.algorithm.name} exchanges model weights (use sign_flip, scale, gaussian, "
                              "constant, label_flip or inflate_examples)")
        return None if exp.attack is None else cls(exp)

    def round(self, r: Round) -> None:
        attack = self.exp.attack
        r.row["attack/kind"] = attack.kind
        r.row["attack/clients"] = [c for c in r.cohort if attack.is_malicious(c)]
