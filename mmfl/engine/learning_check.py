"""Say once, in one line, when a run is not learning, and which ``[train]`` knob to turn.

Two signs, read from each round's ``train_loss`` (the clients' mean local cross-entropy, plus
whatever terms an algorithm adds):

- **stuck at chance:** ``train_loss`` within :data:`CHANCE_TOLERANCE` (5 %) of ln K, the loss
  of a uniform guess over K classes, for :data:`ROUNDS` (3) rounds in a row, and fallen by less
  than :data:`PLATEAU` (2 % of ln K) over them (a loss that starts at ln K and falls steadily,
  as SGD at lr 0.01 on the recipe benchmark's tweets, is learning slowly, not stuck);
- **rising:** ``train_loss`` higher than the round before by more than :data:`RISE_TOLERANCE`
  (1 %) for :data:`ROUNDS` rounds in a row (four rows, each above the last), counted only while
  it is above :data:`RISE_FLOOR` (5 %) of ln K: a fitted model's loss of 1e-4 jitters up and
  down, which is no sign (measured on the recipe benchmark's centralized runs). Not under a
  decaying lr (``train.lr_schedule = "cosine"``, the default of an untouched ``[train]``): the
  clients' mean local loss then rises by design as each round's lr shrinks (36 of the recipe
  benchmark's 90 cosine "after" runs rose for 3 rounds while their accuracy held or climbed).

- **exploded:** ``train_loss`` above :data:`EXPLODED` (100) x ln K in any round (raw inputs in
  the hundreds under SGD at lr 0.01: 8,398 for wine's 3 classes in round 1 of the recipe
  benchmark, then a model stuck at one class; no algorithm's added terms come near it).

Any of these prints one ``mmfl: note:`` line on stderr naming ``train.optimizer`` and ``train.lr``,
once per run (:class:`LearningCheck`). A centralized run whose update became NaN/inf is told
to lower ``train.lr`` (:func:`diverged`), not to drop clients: it has only one.
docs/getting-started.md#when-a-run-does-not-learn says the same for a reader.
"""

from __future__ import annotations

import math
import sys

from mmfl.errors import MMFLError

ROUNDS = 3              # rounds in a row before the note
CHANCE_TOLERANCE = 0.05  # |train_loss - ln K| <= 5 % of ln K counts as "at chance"
PLATEAU = 0.02          # ... having fallen by less than 2 % of ln K over those rounds
EXPLODED = 100.0         # train_loss above 100 x ln K
RISE_TOLERANCE = 0.01    # a rise of more than 1 % over the round before counts as "rising"
RISE_FLOOR = 0.05        # ... while train_loss is above 5 % of ln K
WHERE = "docs/getting-started.md#when-a-run-does-not-learn"


class LearningCheck:
    """Fed one metrics row per round (:meth:`update`); returns (and prints) the note once."""

    def __init__(self, num_classes: int, optimizer: str, lr: float, rounds: int = ROUNDS, stream=None,
                 decaying: bool = False):
        self.ln_k = math.log(num_classes) if num_classes >= 2 else None
        self.decaying = decaying  # a scheduled lr decay: a rising loss is no sign (module doc)
        self.optimizer, self.lr, self.rounds = optimizer, lr, rounds
        self.stream = stream
        self.at_chance = 0
        self.band: list[float] = []  # the last in-band losses
        self.rising = 0
        self.last: float | None = None
        self.said = False

    def advice(self) -> str:
        if self.optimizer == "sgd":
            return (f'try train.optimizer = "adam", train.lr = 1e-3, or a larger train.lr than {self.lr:g}; '
                    "standardize raw inputs (a manifest does unless data.normalize = false)")
        return (f"try another train.lr than {self.lr:g} (1e-3 is the default; 1e-4 if the loss rises, 3e-3 if "
                'it stays) or train.optimizer = "sgd" with train.lr = 0.01; standardize raw inputs '
                "(a manifest does unless data.normalize = false)")

    def update(self, row: dict) -> str | None:
        loss = row.get("train_loss")
        if self.said or not isinstance(loss, (int, float)) or not math.isfinite(loss):
            return None
        if self.ln_k is not None and abs(loss - self.ln_k) <= CHANCE_TOLERANCE * self.ln_k:
            self.at_chance += 1
            self.band = (self.band + [float(loss)])[-self.rounds:]
        else:
            self.at_chance, self.band = 0, []
        if not self.decaying and self.last is not None and self.ln_k is not None \
                and loss > self.last * (1 + RISE_TOLERANCE) and loss > RISE_FLOOR * self.ln_k:
            self.rising += 1
        else:
            self.rising = 0
        self.last = float(loss)
        if self.ln_k is not None and loss > EXPLODED * self.ln_k:
            what = (f"train_loss is {loss:.4g} in round {row.get('round')}, over {EXPLODED:g} x ln(K) = "
                    f"{EXPLODED * self.ln_k:.4g}")
        elif self.at_chance >= self.rounds and self.band[0] - self.band[-1] < PLATEAU * self.ln_k:
            what = (f"train_loss has stayed within {CHANCE_TOLERANCE:.0%} of ln({round(math.exp(self.ln_k))}) = "
                    f"{self.ln_k:.2f} (chance) for {self.rounds} rounds (round {row.get('round')}: {loss:.3f})")
        elif self.rising >= self.rounds:
            what = f"train_loss has risen for {self.rounds} rounds in a row (round {row.get('round')}: {loss:.3g})"
        else:
            return None
        self.said = True
        line = f"mmfl: note: {what}: the model is not learning; {self.advice()} ({WHERE})"
        print(line, file=self.stream or sys.stderr, flush=True)
        return line


def diverged(err: MMFLError, pooled: bool) -> MMFLError:
    """A centralized (pooled) run's "non-finite value" error, reworded: its one client diverged,
    so the remedy is a lower learning rate, not ``on_nonfinite = "drop"``. Other errors pass."""
    msg = str(err)
    if not pooled or "non-finite" not in msg or "on_nonfinite" not in msg:
        return err
    head = msg.split(";")[0]
    return MMFLError(f"{head}: centralized training diverged; lower train.lr (on_nonfinite = \"drop\" would "
                     f"drop its only client) ({WHERE})")


def no_valid_reply(policy: str, rnd: int, dropped: list[int]) -> bool:
    """A round in which replies came and every one was dropped (``run.on_no_valid_reply``): one
    line; ``"fail"``: an MMFLError (the runner stops before the round's checkpoint); ``"skip"``: a
    warning, the round kept with the model unchanged (returns True for the metrics row)."""
    ids = sorted(set(dropped))
    who = f"{len(dropped)} dropped: client(s) {', '.join(map(str, ids[:10]))}" + (", ..." if len(ids) > 10 else "")
    if policy == "fail":
        raise MMFLError(f"round {rnd + 1}: every client reply was dropped ({who}; the lines above say why); "
                        "nothing to learn from: stopped at the last checkpoint (fix the clients, then "
                        "--resume; or set on_no_valid_reply = \"skip\")")
    print(f"mmfl: warning: round {rnd + 1}: every client reply was dropped ({who}); the model is kept "
          "(on_no_valid_reply = \"skip\")", file=sys.stderr, flush=True)
    return True
