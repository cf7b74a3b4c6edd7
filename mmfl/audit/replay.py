"""What the server received in a run, replayed: the messages of its first rounds, bit for bit.

A run is seeded end to end (model init, partition, cohorts, batches: mmfl.seeds), so running
its config again for ``rounds`` rounds in a temporary folder gives exactly the replies the
server received in those rounds of the original run (the kill-and-resume tests prove the
same determinism). :func:`replay` does that with the in-process simulator, streaming off,
and keeps every ``(round, route, client, message sent, reply received)``: the server's view,
after local DP and the privacy check, as a curious server would store it. On Flower, the
tap (``MMFL_FLOWER_TAP``, :mod:`mmfl.flower.tap`) records the same view during the run itself.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mmfl.core.message import Message


@dataclass
class Exchange:
    round: int  # 0-based
    route: str
    client: int
    sent: Message  # what the server sent the client
    reply: Message  # what the server received


@dataclass
class ServerView:
    """A replayed run: its config, federation, model factory and every exchange."""
    config: object
    federation: object
    make_model: object
    exchanges: list[Exchange] = field(default_factory=list)
    transport: object = None  # the replay's simulation transport (shadow clients run on its spec and models)

    def train_replies(self, rnd: int = 0) -> list[Exchange]:
        return [e for e in self.exchanges if e.route == "train" and e.round == rnd]


class _Enough(Exception):
    """Raised by the recorder once the asked rounds are recorded: the replay stops there."""


def _recording(view: ServerView, transport, rounds: int):
    """``transport`` with its ``send`` wrapped to keep every exchange of the first ``rounds``
    rounds in ``view``; the first send of a later round stops the run (:class:`_Enough`)."""
    send = transport.send

    def recorded(route: str, messages: dict[int, Message]) -> dict[int, Message]:
        rnd = int(getattr(transport, "rnd", 0))
        if rnd >= rounds:
            raise _Enough
        replies = send(route, messages)
        for cid, reply in sorted(replies.items()):
            view.exchanges.append(Exchange(rnd, route, int(cid), messages[cid], reply))
        return replies

    transport.send = recorded
    transport.streams = lambda n: False  # every reply whole, as the list path hands it to the server
    return transport


def replay(cfg, rounds: int = 1) -> ServerView:
    """Run ``cfg`` (an ``ExperimentConfig``) in a temporary folder (nothing of the original run
    folder is touched) until its first ``rounds`` rounds are done; the server's view of them.
    The config is the run's, rounds and learning-rate schedule included, so the replies are
    the ones the original run's server received."""
    import copy

    from mmfl.engine.runner import Experiment

    c = copy.deepcopy(cfg)
    c.tracking = None
    with tempfile.TemporaryDirectory(prefix="mmfl-audit-") as tmp:
        c.run.output_dir = tmp
        exp = Experiment(c, progress=False)
        view = ServerView(cfg, exp.federation, exp.make_model, transport=exp.transport)
        _recording(view, exp.transport, max(1, int(rounds)))
        try:
            exp.run()
        except _Enough:
            pass
    return view
