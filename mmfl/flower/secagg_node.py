"""The SuperNode's side of SecAgg+ (:mod:`mmfl.flower.secagg` has the protocol and the server's
side): each stage answered by a ``ClientApp`` of a ``Client`` wrapped by Flower's
``secaggplus_mod``, as Flower documents it; in the collect stage mmfl's handler trains the
node's clients and :func:`node_update` turns their replies into the one vector the mod masks."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Context, Message as FlowerMessage, RecordDict
from flwr.client import Client, ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitIns, FitRes, Status, ndarray_to_bytes, ndarrays_to_parameters

from mmfl.core.message import Message
from mmfl.errors import MMFLError
from mmfl.flower.records import META, decode, encode

TRAIN = "train"  # Flower's MessageType.TRAIN: the only message type secaggplus_mod acts on
EXAMPLES = "examples/"  # mmfl.algorithms.fedavg.MODULE_WEIGHT (per-module data weights)
COLLECT = "secagg.collect"  # in the "mmfl" record of mmfl's messages joined to the collect stage


def is_secagg(msg: FlowerMessage) -> bool:
    """Whether ``msg`` is a stage of the SecAgg+ protocol (for :func:`client_stage`): a train
    message that holds no mmfl record (setup, share_keys, unmask: the workflow's own), or
    mmfl's messages joined to the collect stage."""
    if msg.metadata.message_type != TRAIN:
        return False
    return META not in msg.content or COLLECT in msg.content[META]


class _NodeClient(Client):
    """Flower's ``Client`` of one SuperNode for one collect stage: ``fit`` answers the vector
    and weight :func:`node_update` computed (``secaggplus_mod`` masks them)."""

    def __init__(self, box: dict):
        self.box = box

    def fit(self, ins: FitIns) -> FitRes:
        vector, total = self.box["fit"]
        return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(vector), total, {})


def client_stage(msg: FlowerMessage, context: Context, plain) -> FlowerMessage:
    """Answer one SecAgg+ stage as Flower documents it: a ``ClientApp`` of a ``Client`` with
    ``secaggplus_mod``. In the collect stage an inner mod calls ``plain(msg, context)`` (mmfl's
    handler: trains the node's clients), hands :func:`node_update`'s vector to the Client's
    ``fit`` and adds the clients' scalars (in the clear) to the reply."""
    box: dict = {}

    def with_clear_part(m: FlowerMessage, c: Context, call_next) -> FlowerMessage:
        vector, total, clear = node_update(m, plain(m, c))
        box["fit"] = (vector, total)
        out = call_next(m, c)
        if not out.has_error():
            for name, record in clear.items():
                out.content[name] = record
        return out

    app = ClientApp(client_fn=lambda _: _NodeClient(box), mods=[secaggplus_mod, with_clear_part])
    return app(msg, context)


def node_update(request: FlowerMessage, reply: FlowerMessage) -> tuple[list[np.ndarray], int | float, RecordDict]:
    """The node's update for the mod: one vector, ``sum_k n_k (w_k - w^t) / sum_k n_k`` over its
    clients with finite replies (``n_k``: ``num_examples``; float64), its weight ``sum_k n_k``,
    and a record dict of the clients' scalars and how to read the vector (in the clear)."""
    sent, req_meta = decode(request.content)
    replies, meta = decode(reply.content)
    clip, max_weight = float(req_meta["secagg.clip"]), float(req_meta["secagg.max_weight"])
    ok = {c: r for c, r in sorted(replies.items()) if r.nonfinite_key() is None}
    if not ok:
        raise MMFLError(f"secure aggregation: no finite reply from client(s) {sorted(replies)} on this SuperNode")
    first = next(iter(ok))
    names = sorted(ok[first].arrays)
    floats = [k for k in names if ok[first].arrays[k].is_floating_point()]
    ints = [k for k in names if k not in floats]
    delta = [k for k in floats if _same_shape(sent[first].arrays.get(k), ok[first].arrays[k])]
    acc = {k: torch.zeros(ok[first].arrays[k].shape, dtype=torch.float64,
                        device=ok[first].arrays[k].device) for k in floats}
    top: dict[str, torch.Tensor] = {}
    total = 0.0
    for cid, r in ok.items():
        n = _weight(cid, r)
        if sorted(r.arrays) != names or any(r.arrays[k].shape != ok[first].arrays[k].shape for k in names):
            raise MMFLError(f"secure aggregation sums one vector per SuperNode: clients {first} and {cid} reply "
                            "different entries (clients holding other modalities); every client must hold every "
                            "module ([modalities] name = \"all\")")
        for k in floats:
            x = r.arrays[k].to(torch.float64)
            acc[k] += n * (x - sent[cid].arrays[k].to(torch.float64) if k in delta else x)
        for k in ints:
            top[k] = r.arrays[k] if k not in top else torch.maximum(top[k], r.arrays[k])
        total += n
    vector = [(acc[k] / total if total > 0 else acc[k]).numpy() for k in floats]
    ratio = total / max_weight
    if any(v.size and float(np.abs(v).max()) * ratio > clip for v in vector):
        raise MMFLError(f"secure aggregation: an entry of this SuperNode's weighted update exceeds clipping_range "
                        f"= {clip:g}, which SecAgg+ would clip; raise secure_aggregation.clipping_range")
    out = encode({c: Message(scalars=dict(r.scalars)) for c, r in replies.items()},
                 route=meta["route"], rnd=meta["rnd"])
    info = out[META]
    for key, value in meta.items():  # the handler's other bookkeeping (e.g. "kept-state")
        if key not in info and key != "cids" and not key.endswith(".odd"):
            info[key] = value
    info["secagg.names"] = floats
    info["secagg.shapes"] = ["x".join(map(str, ok[first].arrays[k].shape)) for k in floats]
    info["secagg.dtypes"] = [str(ok[first].arrays[k].dtype).removeprefix("torch.") for k in floats]
    for key, values in (("secagg.delta", delta), ("secagg.excluded", [c for c in replies if c not in ok]),
                        ("secagg.ints", ints)):
        if values:
            info[key] = values
    if ints:
        info["secagg.int_values"] = [ndarray_to_bytes(top[k].numpy()) for k in ints]
    return vector, int(total) if float(total).is_integer() else total, out


def _same_shape(sent, got) -> bool:
    return sent is not None and sent.is_floating_point() and sent.shape == got.shape


def _weight(cid: int, reply: Message) -> float:
    if "num_examples" not in reply.scalars:
        raise MMFLError(f"secure aggregation: client {cid}'s reply has no num_examples to weight it by")
    n = float(reply.scalars["num_examples"])
    if any(k.startswith(EXAMPLES) and float(v) != n for k, v in reply.scalars.items()):
        raise MMFLError(f"secure aggregation: client {cid} weighs modules by their own data sizes (samples "
                        "missing a modality); SecAgg+ sums one weight per SuperNode")
    return n
