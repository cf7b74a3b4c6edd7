"""In-process simulation transport: delivers messages by calling client code.

For each message it loads the client's state from the engine's store, builds
the client (clients are rebuilt per message, as on Flower), calls its handler,
checks the reply (the run's ``[privacy]`` rules, then NaN/inf, then the server's reply
schema, :mod:`mmfl.core.replies`), saves the state back and counts the bytes both ways.
A malicious client (``[attack]``, :mod:`mmfl.engine.attack`) changes its reply first.

Streaming (``run.stream_aggregation``, :meth:`SimulationTransport.send_stream`): a server that
can consume a route's replies one at a time gets each accepted reply as soon as it is made,
and the transport keeps none, so a round holds one model plus one reply, not the cohort's.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Callable

import torch
from torch import nn

from mmfl.algorithms.base import AlgorithmSpec
from mmfl.schema import TrainConfig
from mmfl.data.base import Federation
from mmfl.core.device import CPU, fp32_messages
from mmfl.engine.attack import make_attack
from mmfl.engine.batched_delivery import send_batched
from mmfl.engine.client_runtime import ModelPool, run_client
from mmfl.core.message import Message
from mmfl.engine.privacy import federation_modalities, make_checker
from mmfl.engine.state_store import ClientStateStore
from mmfl.errors import MMFLError

log = logging.getLogger("mmfl")

# stream_aggregation = "auto" streams sends to this many clients or more (the list path below:
# small cohorts keep their numerics bit for bit, mmfl.core.streaming)
STREAM_FROM = 1000

class CommLog:
    """Bytes per round, per route, per direction and per client."""

    def __init__(self):
        # the reply check (route, cid, reply) -> why the reply is bad, or None; set by the runner
        # from the server's reply schema (mmfl.core.replies); None: only NaN/inf are checked
        self.check = None
        self.on_bad_reply = "drop"
        self.reset()

    def reset(self):
        self.up: dict[int, int] = defaultdict(int)
        self.down: dict[int, int] = defaultdict(int)
        self.by_route: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.dropped: list[int] = []
        self.rejected: list[dict] = []  # replies that failed the check: client, route, reason
        self.accepted = 0  # replies admitted (a round with replies and none admitted stops: the runner)

    def record(self, route: str, cid: int, down: int, up: int):
        self.down[cid] += down
        self.up[cid] += up
        self.by_route[route][0] += down
        self.by_route[route][1] += up

    def admit(self, route: str, cid: int, msg: Message, reply: Message, on_nonfinite: str, rnd: int) -> bool:
        """Count a delivered message and its reply; decide whether the reply is used.

        A reply holding NaN/inf fails the run (``on_nonfinite = "fail"``) or is
        dropped (``"drop"``: listed in ``dropped``, and its client keeps no new
        state). Then a reply that does not fit the server's schema (:attr:`check`)
        fails the run with one line (``on_bad_reply = "fail"``) or is dropped with its
        reason logged and listed in ``rejected``. Every transport applies these same
        rules. Returns True to accept.
        """
        if not isinstance(reply, Message):
            why = f"reply is a {type(reply).__name__}, not a Message"
            return self._reject(route, cid, why, rnd)
        self.record(route, cid, msg.nbytes(), reply.nbytes())
        bad = reply.nonfinite_key()
        if bad is not None:
            if on_nonfinite == "fail":
                raise MMFLError(f"client {cid} sent a non-finite value in '{bad}' (round {rnd + 1}, route {route}); "
                                "set on_nonfinite = \"drop\" to skip such clients")
            log.warning("round %d: dropped client %d's reply on route %s: array or scalar '%s' holds NaN/inf",
                        rnd + 1, cid, route, bad)
            self.dropped.append(cid)
            return False
        why = self.check(route, cid, reply) if self.check is not None else None
        if why is None:
            self.accepted += 1
            return True
        return self._reject(route, cid, why, rnd)

    def _reject(self, route: str, cid: int, why: str, rnd: int) -> bool:
        if self.on_bad_reply == "fail":
            raise MMFLError(f"client {cid} sent a bad reply (round {rnd + 1}, route {route}): {why}; "
                            "set on_bad_reply = \"drop\" to skip such replies")
        log.warning("round %d: dropped client %d's reply on route %s: %s", rnd + 1, cid, route, why)
        self.dropped.append(cid)
        self.rejected.append({"client": cid, "route": route, "reason": why})
        return False

    def summary(self) -> dict:
        return {
            "bytes_down": sum(self.down.values()),
            "bytes_up": sum(self.up.values()),
            "bytes_by_route": {r: {"down": d, "up": u} for r, (d, u) in sorted(self.by_route.items())},
            "bytes_per_client": {str(c): {"down": self.down[c], "up": self.up[c]}
                                 for c in sorted(set(self.up) | set(self.down))},
        }


class SimulationTransport:
    """Runs client code in this process (a :class:`~mmfl.algorithms.base.Transport`)."""

    clients_in_process = True  # the clients' data is here: evaluations may use it directly
    progress = None  # the runner's RunProgress (mmfl.engine.progress): told as each client finishes

    def __init__(self, spec: AlgorithmSpec, params, federation: Federation, train: TrainConfig,
                 seed: int, make_model: Callable[[], nn.Module], store: ClientStateStore,
                 on_nonfinite: str = "fail", batch_clients: bool = False, privacy=None, local_dp=None,
                 attack=None, stream: str = "off", dp=None, device: torch.device = CPU):
        """``privacy``: the run's ``[privacy]`` rules (``cfg.privacy``; None: none). Every
        reply is checked against its client's data before the server sees it; a breach
        fails the run (:class:`~mmfl.engine.privacy.PrivacyError`). A rule naming a
        modality the data set lacks is a ConfigError here. ``attack``: the run's ``[attack]``
        (``cfg.attack``; None: every client honest, :mod:`mmfl.engine.attack`). ``stream``: the
        run's ``stream_aggregation`` ("auto", "on", "off"; :meth:`send_stream`). ``dp``: the run's
        ``[dp]``, handed to every client (mode "sample": DP-SGD in local training). ``device``: the
        run's device (every client's ``ctx.device``; the federation and store are already there)."""
        self.spec = spec
        self.params = params
        self.federation = federation
        self.train = train
        self.seed = seed
        self.make_model = make_model
        self.store = store
        self.on_nonfinite = on_nonfinite
        self.batch_clients = batch_clients  # train a send's clients together (mmfl.engine.batched_delivery)
        self.privacy = make_checker(privacy, federation_modalities(federation))  # None: no rules
        self.local_dp = local_dp  # [dp] mode = "local": mmfl.engine.dp_runtime.LocalDP, applied to train replies
        self.dp = dp  # [dp] (cfg.dp; None: none): the clients read it (mode "sample": DP-SGD)
        self.batch_info: dict = {}  # this round: clients trained batched, or why not
        self.num_clients = federation.num_clients
        self.attack = make_attack(attack, federation.num_clients, seed)  # None: no [attack]
        self.stream = stream
        self.device = device
        self.log = CommLog()
        self.rnd = 0
        self._model = ModelPool(make_model)  # models per (key, client structure)
        self._calls: dict[int, int] = defaultdict(int)  # messages per client this round (seed coordinate)

    def begin_round(self, rnd: int) -> None:
        self.rnd = rnd
        self.log.reset()
        self._calls.clear()
        self.batch_info = {}

    def _send_batched(self, route: str, messages: dict[int, Message]) -> tuple[dict[int, Message], dict[int, Message]]:
        """Replies of the messages trained batched, and the messages left to deliver one by one."""
        return send_batched(self, route, messages)

    def send(self, route: str, messages: dict[int, Message]) -> dict[int, Message]:
        messages = fp32_messages(messages)  # precision = "bf16": a server's messages leave as fp32
        sent = messages
        if self.progress is not None:
            self.progress.begin_send(route, len(messages))
        replies, messages = self._send_batched(route, messages)
        for cid in sorted(messages):
            reply = self._deliver(route, cid, messages[cid])
            if self.progress is not None:
                self.progress.advance()
            if reply is not None:
                replies[cid] = reply
        if self.local_dp is not None and route == "train":  # the client's randomizer, before its reply leaves
            replies = {cid: self.local_dp(self.rnd, cid, sent[cid], r) for cid, r in sorted(replies.items())}
        return replies

    def streams(self, n: int) -> bool:
        """Whether a send to ``n`` clients streams to a server that can take it (``stream``)."""
        return self.stream == "on" or (self.stream == "auto" and n >= STREAM_FROM)

    def send_stream(self, route: str, messages: dict[int, Message], accumulator) -> int | None:
        """:meth:`send`, but each accepted reply goes to ``accumulator.add(cid, reply)`` as soon as
        it is made (after the same checks, attack and local DP, in the same client order) and is
        not kept; returns the number added. None (nothing sent): this send is not streamed
        (``stream``), the caller uses :meth:`send`. Batched training (``batch_clients``) still
        makes its replies together, then hands them over one by one."""
        if not self.streams(len(messages)):
            return None
        messages = fp32_messages(messages)
        accumulator.begin()
        count = 0
        if self.progress is not None:
            self.progress.begin_send(route, len(messages))
        batched, messages_left = self._send_batched(route, messages)
        for cid in sorted(batched):
            self._hand_over(route, cid, messages[cid], batched.pop(cid), accumulator)
            count += 1
        for cid in sorted(messages_left):
            reply = self._deliver(route, cid, messages_left[cid])
            if self.progress is not None:
                self.progress.advance()
            if reply is not None:
                self._hand_over(route, cid, messages_left[cid], reply, accumulator)
                count += 1
        self.batch_info["replies_streamed"] = self.batch_info.get("replies_streamed", 0) + count
        return count

    def _hand_over(self, route: str, cid: int, msg: Message, reply: Message, accumulator) -> None:
        if self.local_dp is not None and route == "train":  # the client's randomizer, before its reply leaves
            reply = self.local_dp(self.rnd, cid, msg, reply)
        accumulator.add(cid, reply)

    def _deliver(self, route: str, cid: int, msg: Message) -> Message | None:
        """Run client ``cid`` on ``msg``; its reply if accepted (its state saved), else None."""
        fed = self.federation  # [privacy] is checked where each reply is made: run_client, send_batched
        call = self._calls[cid]
        self._calls[cid] += 1
        reply, state = run_client(
            self.spec, self.params, cid=cid, rnd=self.rnd, route=route, call=call, msg=msg,
            data=fed.clients[cid], test_data=fed.test_of(cid), meta=fed.meta_of(cid), train=self.train,
            seed=self.seed, state=self.store.load(cid), model_pool=self._model, init_model=self.make_model,
            holds=fed.modalities_of(cid), group=fed.group_of(cid), source=fed.source_of(cid),
            public=fed.public, privacy=self.privacy, attack=self.attack, dp=self.dp, device=self.device,
        )
        if not self.log.admit(route, cid, msg, reply, self.on_nonfinite, self.rnd):
            return None  # its state is not saved either: the round never happened for it
        self.store.save(cid, state)
        return reply
