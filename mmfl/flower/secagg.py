"""Secure aggregation of the train round on Flower: SecAgg+ with Flower's own components,
used through Flower's public API the way Flower documents SecAgg+.

With a ``[secure_aggregation]`` table (:class:`mmfl.schema.SecureAggregationConfig`) the
``train`` route of a :class:`~mmfl.flower.transport.FlowerTransport` does not send and
collect the clients' messages directly: :meth:`SecureAggregation.send` runs one round of
Flower's ``DefaultWorkflow`` whose fit step is ``flwr.server.workflow.SecAggPlusWorkflow``,
driven by a public ``Strategy`` (:class:`_Strategy`) in a ``LegacyContext``, over a ``Grid``
restricted to the send's SuperNodes (:class:`_StageGrid`). Every SuperNode answers the four
stages with a ``ClientApp`` of a ``Client`` wrapped by ``flwr.client.mod.secaggplus_mod``
(:func:`mmfl.flower.secagg_node.client_stage`):

1. ``setup``: the workflow sends the protocol's parameters; each node answers two public keys;
2. ``share_keys``: the server forwards the neighbours' public keys; each node answers its
   secrets' Shamir shares, encrypted for each neighbour;
3. ``collect_masked_vectors``: the server forwards those shares with the strategy's FitIns
   (marked :data:`MARK`), to which the grid adds **mmfl's train messages** (the global
   model, as in a plain send). The node trains its clients (mmfl's ClientApp handler), and
   :func:`~mmfl.flower.secagg_node.node_update` turns their replies into one vector, the ``num_examples``-weighted
   mean of their updates ``w_k - w^t`` (a key the server did not send, or an integer buffer,
   is handled as said below); the ``Client``'s ``fit`` answers it. The mod weights it by the
   node's ``num_examples / max_weight``, quantizes it, adds its masks and sends only the
   masked integers; it clears every array of the reply. The clients' scalars
   (``num_examples``, ``train_loss``, ...) travel in the clear, in mmfl's records;
4. ``unmask``: the nodes send the shares the server needs to remove the masks of the sum.

The workflow then hands the weighted mean to the strategy's ``aggregate_fit``;
:meth:`SecureAggregation.send` adds ``w^t`` back and returns, for every client that took
part, a reply holding that mean and its own scalars: the algorithm's server (FedAvg's
weighted mean of identical models) gets the secure aggregate, exactly as Flower's own
strategies do behind the workflow. No record layout of Flower's is read or written: the
grid finds the collect stage by the strategy's marker, the node by mmfl's ``"mmfl"`` record.

Integer entries (BatchNorm's ``num_batches_tracked``) cannot be averaged by a sum that the
server then divides; as ``weighted_mean`` takes their maximum, each node sends the maximum
of its clients' in the clear (step counts, which ``num_examples`` already tell).

Bytes: the train route counts the messages down as in a plain run and, up, only what the
replies carry in the clear (scalars); route ``secagg`` counts the protocol's records both ways
(keys, encrypted shares, masked vectors, node lists, shares), per SuperNode, on its lowest
client id of the round.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import torch
from flwr.app import Context, Message as FlowerMessage, RecordDict
from flwr.common import FitIns, Parameters, bytes_to_ndarray, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid

from mmfl.core.message import Message
from mmfl.errors import MMFLError
from mmfl.flower.records import META, decode, encode
from mmfl.flower.secagg_node import COLLECT

log = logging.getLogger("mmfl.flower")
ROUTE = "train"  # the route whose sum SecAgg+ computes
PROTOCOL_ROUTE = "secagg"  # CommLog route of the protocol's own records
MARK = "mmfl.secagg"  # in the config of the strategy's FitIns: how the grid finds the collect stage
STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")  # SecAggPlusWorkflow's sends, in order


# ----------------------------------------------------------------------------- the server

class _Strategy(Strategy):
    """The strategy the workflow drives (a public Flower ``Strategy``): every node of the send
    gets a FitIns marked with :data:`MARK` (mmfl's messages join it in the collect stage,
    :class:`_StageGrid`); ``aggregate_fit`` keeps the unmasked weighted mean; no evaluation."""

    def __init__(self, nodes: list[int]):
        self.nodes = set(nodes)
        self.aggregate: list[np.ndarray] | None = None

    def initialize_parameters(self, client_manager):
        return Parameters(tensors=[], tensor_type="")  # the model travels in mmfl's own records

    def configure_fit(self, server_round, parameters, client_manager):
        proxies = sorted((p for p in client_manager.all().values() if p.node_id in self.nodes), key=lambda p: p.node_id)
        return [(p, FitIns(parameters, {MARK: True})) for p in proxies]

    def aggregate_fit(self, server_round, results, failures):
        if not results:
            return None, {}
        params = results[0][1].parameters
        self.aggregate = parameters_to_ndarrays(params)
        return params, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


def _no_evaluation(grid, context) -> None:
    """DefaultWorkflow's evaluate step: none (mmfl evaluates in its own round loop)."""


class _StageGrid(Grid):
    """The Grid the workflow sees (a public Flower ``Grid``): its nodes are the send's; it sends
    through the transport (its timeouts and liveness checks), adds mmfl's messages to the
    collect stage, keeps the collect replies and counts the protocol's bytes."""

    def __init__(self, transport, contents: dict[int, RecordDict]):
        self.t = transport
        self.contents = contents
        self.collected: dict[int, FlowerMessage] = {}
        self.bytes: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        self.layout: tuple | None = None
        self.sends = 0

    # the Grid interface: the transport's grid, restricted to the send's nodes
    def set_run(self, run_id: int) -> None:
        self.t.grid.set_run(run_id)

    @property
    def run(self):
        return self.t.grid.run

    def create_message(self, *args, **kwargs):
        return self.t.grid.create_message(*args, **kwargs)

    def get_node_ids(self):
        return sorted(self.contents)

    def push_messages(self, messages):
        return self.t.grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.t.grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if not messages:
            return []
        stage = STAGES[self.sends] if self.sends < len(STAGES) else f"send {self.sends + 1}"
        self.sends += 1
        collect = any(MARK in rec for rec in messages[0].content.config_records.values())
        for m in messages:
            node = m.metadata.dst_node_id
            self.bytes[node][0] += _protocol_bytes(m.content)
            if collect:
                for name, record in self.contents[node].items():
                    m.content[name] = record
        from mmfl.flower.transport import unanswered

        got, _ = self.t._exchange(messages, self.t.timeout)
        gone = unanswered(self.t.grid, got)
        out = []
        for node, rep in got.items():
            if node in gone:
                continue  # left the federation: SecAgg+ treats it as dropped
            if rep.has_error():
                raise MMFLError(f"SuperNode {node} failed in the secure aggregation stage {stage} "
                                f"(round {self.t.rnd + 1}): {rep.error.reason}")
            self.bytes[node][1] += _protocol_bytes(rep.content)
            if collect:
                self._check_layout(node, rep)
                self.collected[node] = rep
            out.append(rep)
        return out

    def _check_layout(self, node: int, rep: FlowerMessage) -> None:
        if META not in rep.content:
            raise MMFLError(f"secure aggregation (round {self.t.rnd + 1}): SuperNode {node}'s masked update came "
                            "without mmfl's record (a SuperNode running another ClientApp?)")
        meta = rep.content[META]
        layout = tuple(tuple(meta.get(k, [])) for k in ("secagg.names", "secagg.shapes", "secagg.dtypes",
                                                         "secagg.delta", "secagg.ints"))
        if self.layout is None:
            self.layout = layout
        elif layout != self.layout:
            raise MMFLError(f"secure aggregation (round {self.t.rnd + 1}): SuperNode {node} sends other entries "
                            "than the others (clients holding other modalities); every client must hold every "
                            "module")


def _protocol_bytes(content: RecordDict) -> int:
    """Payload bytes of the protocol's config records in ``content``: all but mmfl's own (the
    ``"mmfl"`` record, the clients' ``"{cid}.config"`` scalars, the FitIns marker)."""
    ours = set()
    if META in content:
        ours = {META, *(f"{c}.config" for c in content[META].get("cids", []))}
    return sum(record_bytes(rec) for name, rec in content.config_records.items()
               if name not in ours and MARK not in rec)


class _RoundLogFilter(logging.Filter):
    """Drops DefaultWorkflow's per-run bookkeeping lines ([INIT], [ROUND 1], [SUMMARY], its
    empty history) from Flower's log: mmfl runs one workflow round per train send."""

    LINES = {"", "[INIT]", "[ROUND %s]", "[SUMMARY]", "Run finished %s round(s) in %.2fs", "%s", "\t%s",
             "Using initial global parameters provided by strategy", "Starting evaluation of initial global parameters",
             "Evaluation returned no results (`None`)"}

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.LINES


class _quiet_round_log:
    def __enter__(self):
        self.f = _RoundLogFilter()
        logging.getLogger("flwr").addFilter(self.f)

    def __exit__(self, *exc):
        logging.getLogger("flwr").removeFilter(self.f)


def record_bytes(record) -> int:
    """Payload bytes of a Config/Metric record: bytes and strings by length, numbers 8 bytes."""
    def size(v) -> int:
        if isinstance(v, (bytes, bytearray)):
            return len(v)
        if isinstance(v, str):
            return len(v.encode())
        if isinstance(v, (list, tuple)):
            return sum(size(x) for x in v)
        return 8
    return sum(size(v) for v in record.values())


class SecureAggregation:
    """Runs Flower's ``SecAggPlusWorkflow`` for each send of the train route of a FlowerTransport."""

    route = ROUTE

    def __init__(self, cfg, federation):
        self.cfg = cfg
        self.sizes = [len(c) for c in federation.clients]

    def workflow(self, max_weight: float, timeout: float) -> SecAggPlusWorkflow:
        c = self.cfg
        return SecAggPlusWorkflow(c.num_shares, c.reconstruction_threshold, max_weight=max_weight,
                                  clipping_range=c.clipping_range, quantization_range=c.quantization_range,
                                  modulus_range=c.modulus_range, timeout=timeout)

    def send(self, t, messages: dict[int, Message]) -> dict[int, Message]:
        """The replies of ``messages`` (route ``train``) through SecAgg+: every client that took part
        gets the secure weighted mean as its arrays and keeps its own scalars."""
        rnd = t.rnd
        by_node, missing, calls = t.group_by_node(messages)
        cfg = self.cfg
        if len(by_node) < 2:
            raise MMFLError(f"secure aggregation (round {rnd + 1}): {len(by_node)} SuperNode(s) in the round; "
                            "the sum of one node's update is that update (SecAgg+ needs at least 2)")
        if len(by_node) * cfg.quantization_range >= cfg.modulus_range:
            raise MMFLError(f"secure aggregation (round {rnd + 1}): {len(by_node)} SuperNodes x quantization_range "
                            f"{cfg.quantization_range} >= modulus_range {cfg.modulus_range}: the sum would wrap")
        contents = {}
        for node, cids in by_node.items():  # mmfl's messages, as a plain send makes them
            contents[node] = encode({c: messages[c] for c in cids}, route=ROUTE, rnd=rnd, calls=[calls[c] for c in cids])
            if getattr(t, "state_id", None) is not None:  # the clients' state folder on the node (resume)
                contents[node][META]["state-id"] = t.state_id
                expect = [c for c in cids if c in t._expect and calls[c] == 0]
                if expect:
                    contents[node][META]["expect-state"] = expect
        max_weight = cfg.max_weight or float(max(sum(self.sizes[c] for c in cids) for cids in by_node.values()))
        for content in contents.values():  # the collect stage's: how the node checks its update
            content[META].update({COLLECT: True, "secagg.clip": float(cfg.clipping_range),
                                  "secagg.max_weight": float(max_weight)})
        grid = _StageGrid(t, contents)
        strategy = _Strategy(sorted(by_node))
        # one round of Flower's DefaultWorkflow with SecAggPlusWorkflow as its fit step, as Flower
        # documents SecAgg+ (its round counter is this workflow's own: always 1)
        ctx = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            config=ServerConfig(num_rounds=1), strategy=strategy)
        with _quiet_round_log():
            DefaultWorkflow(fit_workflow=self.workflow(max_weight, t.timeout), evaluate_workflow=_no_evaluation)(grid, ctx)
        if strategy.aggregate is None:
            raise MMFLError(f"secure aggregation halted in round {rnd + 1}: fewer SuperNodes than "
                            f"reconstruction_threshold answered ({len(grid.collected)} of {len(by_node)} sent their "
                            "masked update); see the ServerApp log")
        arrays = self.mean(grid, strategy.aggregate, messages, by_node)
        replies = self.replies(t, grid, arrays, messages)
        missing += [c for node, cids in by_node.items() if node not in grid.collected for c in cids]
        if missing:
            t._missing(ROUTE, sorted(missing), messages)
        for node, (down, up) in sorted(grid.bytes.items()):
            t.log.record(PROTOCOL_ROUTE, min(by_node[node]), down, up)
        return replies

    def mean(self, grid: _StageGrid, vector: list[np.ndarray], messages, by_node) -> dict[str, torch.Tensor]:
        """The global arrays: the unmasked mean (+ ``w^t`` where the nodes sent differences) and
        the integer entries' maximum."""
        names, shapes, dtypes, delta, ints = grid.layout
        sent = [messages[c] for node in grid.collected for c in by_node[node]]
        out = {}
        for name, shape, dtype, v in zip(names, shapes, dtypes, vector):
            x = torch.from_numpy(np.asarray(v, dtype=np.float64)).reshape([int(s) for s in shape.split("x") if s])
            if name in delta:
                ref = sent[0].arrays[name]
                if any(m.arrays.get(name) is not ref and not torch.equal(m.arrays[name], ref) for m in sent[1:]):
                    raise MMFLError(f"secure aggregation: the clients received different '{name}'; the server "
                                    "adds one w^t back to the mean of the differences")
                x = x + ref.to(device="cpu", dtype=torch.float64)  # the sum came off the wire (CPU)
            out[name] = x.to(getattr(torch, dtype))
        for i, name in enumerate(ints):
            values = [torch.from_numpy(bytes_to_ndarray(bytes(rep.content[META]["secagg.int_values"][i])))
                      for rep in grid.collected.values()]
            out[name] = torch.stack(values).max(0).values
        return out

    def replies(self, t, grid: _StageGrid, arrays: dict[str, torch.Tensor], messages) -> dict[int, Message]:
        replies = {}
        for node, rep in sorted(grid.collected.items()):
            clear, meta = decode(rep.content)
            excluded = set(meta.get("secagg.excluded", []))
            for cid in (meta["kept-state"] if "kept-state" in meta else []):
                t.stateful.setdefault(int(cid), t.rnd)
            for cid, m in sorted(clear.items()):
                if cid in excluded:  # its node left it out of the sum (NaN/inf): as CommLog.admit does
                    if t.on_nonfinite == "fail":
                        raise MMFLError(f"client {cid} sent a non-finite value (round {t.rnd + 1}, route {ROUTE}); "
                                        "set on_nonfinite = \"drop\" to skip such clients")
                    log.warning("round %d: dropped client %d's reply on route %s: it holds NaN/inf (left out "
                                "of the secure sum by its SuperNode)", t.rnd + 1, cid, ROUTE)
                    t.log.record(ROUTE, cid, messages[cid].nbytes(), m.nbytes())
                    t.log.dropped.append(cid)
                    continue
                reply = Message(arrays=dict(arrays), scalars=dict(m.scalars))
                accepted = t.log.admit(ROUTE, cid, messages[cid], reply, t.on_nonfinite, t.rnd)
                # admit counted the reply's arrays up; they never travelled (the node sent them masked,
                # counted on route "secagg"): keep only what came in the clear
                t.log.record(ROUTE, cid, 0, m.nbytes() - reply.nbytes())
                if accepted:
                    replies[cid] = reply
        return replies
