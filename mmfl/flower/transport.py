"""The Flower transport: ``send(route, {cid: Message})`` through a Flower ``Grid``.

mmfl client ids map to Flower node ids through each SuperNode's answer to a
``query.mmfl_hello`` message: the ClientApp replies with the client ids it
hosts (derived from its ``--node-config``, see :mod:`mmfl.flower.client_app`),
a fingerprint of each client's data slice and the modalities each client holds,
which must equal the server's.
A send groups the messages by node (one Flower message per node, holding the
messages of all its clients) with message type ``train.<route>`` (or
``evaluate.<route>`` for routes named ``evaluate*``) and the route, round,
client ids and call indices in the ``"mmfl"`` config record, so multi-phase
algorithms work through routes with no special case.

Replies that do not arrive within ``reply_timeout`` seconds, from a node that
left the federation meanwhile, or that report an unavailable node, are dropped
or fail the run, per ``on_missing_reply``. A node that missed a reply is not
used again until Flower has seen it leave; if it comes back (restarted), it
answers a new hello at the start of a round and its clients rejoin. A
ClientApp that raised fails the run, as the same exception does in the simulator.

With ``state_file`` (the run folder's ``flower_state.json``) every message carries
the run's client-state id, made when the run folder is new and kept on resume, under
which SuperNodes started with a ``state-dir`` keep their clients' state
(:mod:`mmfl.flower.node_state`); the file also lists the clients that kept state and
from which round, so that a resumed run fails with one line on a SuperNode that lacks it.

Replies come off the wire as CPU tensors; ``send`` moves them onto ``device`` (the server's
run device, ``Experiment.device``) before the algorithm's server sees them. What goes out is
moved to the CPU by :mod:`mmfl.flower.records`.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Message as FlowerMessage, RecordDict

from mmfl.algorithms.multimodal import present_counts
from mmfl.core.device import CPU, fp32_messages, to_device
from mmfl.core.message import Message
from mmfl.engine import runfiles
from mmfl.engine.simulation import CommLog
from mmfl.errors import MMFLError
from mmfl.flower.records import decode, encode

log = logging.getLogger("mmfl.flower")
HELLO = "query.mmfl_hello"
POLL_S = 0.1  # between pulls of replies
ONLINE_CHECK_S = 1.0  # between checks that the SuperNodes still owing a reply are online


def unanswered(grid, replies: dict[int, FlowerMessage]) -> set[int]:
    """The nodes of ``replies`` whose reply is an error the node did not write: the SuperLink
    answers for a node that left (or a message that expired), so the message will never be
    answered, as silent as a node that never answered. Read from public fields only: the
    reply's ``src_node_id`` is not the node asked, or the node is no longer among
    ``grid.get_node_ids()``. An error the node wrote (its ClientApp raised) is not in it."""
    errors = {n for n, rep in replies.items() if rep.has_error()}
    if not errors:
        return set()
    online = set(grid.get_node_ids())
    return {n for n in errors if replies[n].metadata.src_node_id != n or n not in online}


def message_type(route: str) -> str:
    if not route.isidentifier():
        raise MMFLError(f"route {route!r}: Flower needs routes that are Python identifiers")
    return f"{'evaluate' if route.startswith('evaluate') else 'train'}.{route}"


def fingerprint(data) -> list[int]:
    """Size and label checksum of a client's data slice (server and node must agree)."""
    y = data.label_array().astype(np.int64)
    return [int(y.size), int(y.sum()), int((y * (1 + np.arange(y.size) % 7)).sum())]


def presence(data, modalities) -> str:
    """Rows of a client's slice holding each modality, ``"features:35,image:48"`` (its per-sample
    ``present/<m>`` masks; a modality without a mask counts every row)."""
    return ",".join(f"{m}:{n}" for m, n in present_counts(data, modalities).items())


class FlowerTransport:
    """A :class:`~mmfl.algorithms.base.Transport` over a Flower ``Grid``."""

    clients_in_process = False  # the clients' data is on the SuperNodes: they evaluate there

    def __init__(self, grid, federation, run_cfg, wait_for_nodes_s: float | None = None,
                 state_file: str | Path | None = None, device=CPU):
        self.grid = grid
        self.device = device  # the server's device: replies are moved there
        self.federation = federation
        self.num_clients = federation.num_clients
        self.timeout = float(run_cfg.reply_timeout)
        self.on_missing = run_cfg.on_missing_reply
        self.on_nonfinite = run_cfg.on_nonfinite
        self.wait_for_nodes_s = self.timeout if wait_for_nodes_s is None else wait_for_nodes_s
        self.log = CommLog()
        self.batch_info: dict = {}  # clients are never trained batched across SuperNodes
        self.rnd = 0
        self.node_of: dict[int, int] = {}  # mmfl client id -> Flower node id
        self.dead: set[int] = set()  # node ids that missed a reply: not used while Flower lists them online
        self.known: set[int] = set()  # node ids that answered a hello
        self._calls: dict[int, int] = defaultdict(int)
        self.state_file = None if state_file is None else Path(state_file)
        self.state_id: str | None = None  # the run's client-state id (see mmfl.flower.node_state)
        self.stateful: dict[int, int] = {}  # client -> first round after which it kept state
        self.persistent: dict[int, bool] = {}  # node -> started with a state-dir
        self._expect: set[int] = set()  # clients that must find their state (the first round of a resume)
        self.secure = None  # mmfl.flower.secagg.SecureAggregation: its route's sends go through SecAgg+
        self.discover(wait=True)

    # --- node discovery ---------------------------------------------------------
    def discover(self, wait: bool = False) -> None:
        """Say hello to SuperNodes not seen yet; with ``wait``, until every client has one."""
        deadline = time.monotonic() + (self.wait_for_nodes_s if wait else 0.0)
        while True:
            online = set(self.grid.get_node_ids())
            for n in [n for n in self.dead if n not in online]:  # gone for good: if it comes back
                self.dead.discard(n)                             # (restarted), it gets a new hello
                self.known.discard(n)
                self.node_of = {c: m for c, m in self.node_of.items() if m != n}
            new = [n for n in online if n not in self.known and n not in self.dead]
            if new:
                self._hello(new)
            missing = [c for c in range(self.num_clients) if self.node_of.get(c) in (None, *self.dead)]
            if not missing or not wait or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if wait and missing:
            text = f"{len(missing)} of {self.num_clients} clients have no SuperNode (e.g. {missing[:5]}) " \
                   f"after {self.wait_for_nodes_s:.0f}s"
            if self.on_missing == "fail":
                raise MMFLError(text + "; start a flower-supernode for each partition-id "
                                "(or set on_missing_reply = \"drop\")")
            log.warning("%s; they are dropped", text)

    def _hello(self, nodes: list[int]) -> None:
        msgs = [FlowerMessage(RecordDict({"mmfl": ConfigRecord({"hello": 1})}), dst_node_id=n,
                              message_type=HELLO, ttl=self.timeout + 60) for n in nodes]
        replies, silent = self._exchange(msgs, self.timeout)
        # a node that left between answering and our pull gets an "unavailable" error reply
        # from the SuperLink instead of its answer: as silent as one that never answered
        silent += sorted(unanswered(self.grid, replies))
        self.dead.update(silent)  # not asked again until Flower saw it leave (see discover)
        for node, rep in replies.items():
            if node in silent:
                continue
            if rep.has_error():
                raise MMFLError(f"SuperNode {node} could not start the mmfl ClientApp: {rep.error.reason}")
            info = rep.content["mmfl"]
            held = list(info["modalities"]) if "modalities" in info else [None] * len(info["cids"])
            present = list(info["present"]) if "present" in info else [None] * len(info["cids"])
            for cid, fp, mods, pres in zip(info["cids"], _chunks(list(info["fingerprints"]), 3), held, present):
                if not 0 <= cid < self.num_clients:
                    raise MMFLError(f"SuperNode {node} hosts client {cid}, but the run has "
                                    f"{self.num_clients} clients (check num-partitions/client-ids)")
                if cid in self.node_of and self.node_of[cid] != node and self.node_of[cid] not in self.dead:
                    raise MMFLError(f"client {cid} is hosted by two SuperNodes ({self.node_of[cid]} and {node}); "
                                    "give each SuperNode its own partition-id")
                mine = fingerprint(self.federation.clients[cid])
                if list(fp) != mine:
                    raise MMFLError(f"client {cid} on SuperNode {node} has a different data slice "
                                    f"(size/checksums {list(fp)}, server expects {mine}): the node's data set "
                                    "or [data]/[partition] config differs from the server's")
                expected = "+".join(self.federation.modalities_of(cid))
                if mods is not None and mods != expected:
                    raise MMFLError(f"client {cid} on SuperNode {node} holds modalities {mods}, the server "
                                    f"expects {expected}: the node's data set or [data]/[modalities] config "
                                    "differs from the server's")
                ours = presence(self.federation.clients[cid], self.federation.modalities_of(cid))
                if pres is not None and pres != ours:  # its copy lacks other cells or files: it trains on its own
                    log.warning("client %d on SuperNode %d: rows holding each modality %s, the server's copy of "
                                "the data %s; the node trains on its own data's missing cells", cid, node, pres, ours)
                self.node_of[cid] = node
            self.persistent[node] = bool(info["state-dir"]) if "state-dir" in info else False
            self.known.add(node)

    # --- the transport interface -------------------------------------------------
    def begin_round(self, rnd: int) -> None:
        self.rnd = rnd
        self.log.reset()
        self._calls.clear()
        if any(self.node_of.get(c) in (None, *self.dead) for c in range(self.num_clients)):
            self.discover()  # a SuperNode may have (re)joined
        if self.state_file is not None:
            self._client_state_round(rnd)

    def _client_state_round(self, rnd: int) -> None:
        """The run's client-state id (new with a new run folder, read back on resume), and
        on resume the check that every client that kept state can find it."""
        if self.state_id is None:
            saved = json.loads(self.state_file.read_text()) if self.state_file.is_file() else {}
            self.state_id = saved.get("state_id") or uuid.uuid4().hex
            self.stateful = {int(c): int(r) for c, r in saved.get("stateful", {}).items()}
            if rnd > 0:  # a resume: the clients that kept state before round rnd must still have it
                self._expect = {c for c, r in self.stateful.items() if r < rnd}
                lacking = sorted({self.node_of[c] for c in self._expect
                                  if c in self.node_of and not self.persistent.get(self.node_of[c])})
                if lacking:
                    cids = sorted(c for c in self._expect if self.node_of.get(c) in lacking)
                    raise MMFLError(f"cannot resume: client(s) {cids[:5]} keep state between rounds, which Flower "
                                    f"keeps per run in memory, and SuperNode(s) {lacking[:5]} were started without "
                                    "a state-dir: start every SuperNode with --node-config '... state-dir=\"DIR\"' "
                                    "(see docs/flower.md, Resuming a Flower run)")
                if not saved:
                    log.warning("resume: no %s in the run folder; clients start from empty state", self.state_file.name)
        else:
            self._expect = set()
        runfiles.note(self.state_file)  # what --overwrite may delete (mmfl.engine.runfiles)
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps({"state_id": self.state_id,
                                   "stateful": {str(c): r for c, r in sorted(self.stateful.items())}}))
        os.replace(tmp, self.state_file)

    def group_by_node(self, messages: dict) -> tuple[dict[int, list[int]], list[int], dict[int, int]]:
        """The clients of ``messages`` by SuperNode (``{node: [cid]}``), those with no live node
        (``missing``), and each client's call index for this send (``calls``, counted up here)."""
        by_node: dict[int, list[int]] = defaultdict(list)
        missing: list[int] = []
        calls: dict[int, int] = {}
        for cid in sorted(messages):
            calls[cid] = self._calls[cid]
            self._calls[cid] += 1
            node = self.node_of.get(cid)
            if node is None or node in self.dead:
                missing.append(cid)
            else:
                by_node[node].append(cid)
        return by_node, missing, calls

    def send(self, route: str, messages: dict[int, Message]) -> dict[int, Message]:
        """Send ``messages`` to their clients' SuperNodes; the accepted replies, on ``device``."""
        messages = fp32_messages(messages)  # precision = "bf16": a server's messages leave as fp32
        if self.secure is not None and route == self.secure.route:
            replies = self.secure.send(self, messages)
        else:
            replies = self._send(route, messages)
        return {c: Message(to_device(r.arrays, self.device), r.scalars) for c, r in replies.items()}

    def _send(self, route: str, messages: dict[int, Message]) -> dict[int, Message]:
        mtype = message_type(route)
        by_node, missing, calls = self.group_by_node(messages)
        out = []
        for node, cids in by_node.items():
            content = encode({c: messages[c] for c in cids}, route=route, rnd=self.rnd,
                             calls=[calls[c] for c in cids])
            if self.state_id is not None:
                content["mmfl"]["state-id"] = self.state_id
                expect = [c for c in cids if c in self._expect and calls[c] == 0]
                if expect:
                    content["mmfl"]["expect-state"] = expect
            out.append(FlowerMessage(content, dst_node_id=node, message_type=mtype,
                                     group_id=str(self.rnd + 1), ttl=self.timeout + 60))
        got, _ = self._exchange(out, self.timeout)
        gone = unanswered(self.grid, got)
        decoded: dict[int, Message] = {}
        for node, cids in by_node.items():
            rep = got.get(node)
            if rep is None or node in gone:
                self.dead.add(node)
                missing.extend(cids)
                continue
            if rep.has_error():
                raise MMFLError(f"client(s) {cids} on SuperNode {node} failed on route {route} "
                                f"(round {self.rnd + 1}): {rep.error.reason}")
            msgs, meta = decode(rep.content)
            decoded.update(msgs)
            for cid in (meta["kept-state"] if "kept-state" in meta else []):
                self.stateful.setdefault(int(cid), self.rnd)
        if missing:
            self._missing(route, sorted(missing), messages)
        replies: dict[int, Message] = {}
        for cid in sorted(decoded):
            reply = decoded[cid]
            if not self.log.admit(route, cid, messages[cid], reply, self.on_nonfinite, self.rnd):
                continue  # the ClientApp did not keep its state either
            replies[cid] = reply
        return replies

    def _missing(self, route: str, cids: list[int], messages: dict[int, Message]) -> None:
        if self.on_missing == "fail":
            raise MMFLError(f"no reply from client(s) {cids} on route {route} (round {self.rnd + 1}) within "
                            f"{self.timeout:g}s: their SuperNode is down or too slow; raise reply_timeout or "
                            "set on_missing_reply = \"drop\" to continue without them")
        log.warning("round %d, route %s: no reply from client(s) %s; dropped", self.rnd + 1, route, cids)
        for cid in cids:
            self.log.record(route, cid, messages[cid].nbytes(), 0)  # sent, never answered
            self.log.dropped.append(cid)

    def _exchange(self, msgs: list[FlowerMessage], timeout: float) -> tuple[dict[int, FlowerMessage], list[int]]:
        """Push ``msgs`` and pull replies until all arrived, ``timeout`` passed, or the
        nodes still owing one left the federation; ``{node: reply}`` and the silent nodes.

        A SuperNode that stops (shutdown, SIGTERM) leaves at once, one that crashes
        when Flower's heartbeat expires (about a minute): either ends the wait for it.
        """
        if not msgs:
            return {}, []
        ids = list(self.grid.push_messages(msgs))
        pending = {mid: m.metadata.dst_node_id for mid, m in zip(ids, msgs) if mid}
        silent = [m.metadata.dst_node_id for mid, m in zip(ids, msgs) if not mid]
        replies: dict[int, FlowerMessage] = {}
        deadline = time.monotonic() + timeout
        next_check, gone = time.monotonic() + ONLINE_CHECK_S, set()
        while pending:
            for rep in self.grid.pull_messages(list(pending)):
                node = pending.pop(rep.metadata.reply_to_message_id, None)
                if node is not None:
                    replies[node] = rep
            for mid in [m for m, n in pending.items() if n in gone]:  # left, and nothing came in a last pull
                silent.append(pending.pop(mid))
            now = time.monotonic()
            if not pending or now >= deadline:
                break
            if now >= next_check:
                online = set(self.grid.get_node_ids())
                gone = {n for n in pending.values() if n not in online}
                next_check = now + ONLINE_CHECK_S
            time.sleep(POLL_S)
        return replies, silent + list(pending.values())


def _chunks(xs: list, n: int) -> list[list]:
    return [xs[i:i + n] for i in range(0, len(xs), n)]
