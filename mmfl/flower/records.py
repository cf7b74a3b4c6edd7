"""mmfl :class:`~mmfl.core.message.Message` <-> Flower ``RecordDict``.

One Flower message carries the mmfl messages of one or more clients hosted by
the same SuperNode. For client ``cid`` the record dict holds

- ``"{cid}.arrays"``: an ``ArrayRecord``, one ``Array`` per tensor (numpy
  serialisation: dtype and shape round-trip exactly; dtypes numpy lacks, e.g.
  bfloat16, travel as a same-width integer view and are restored);
- ``"{cid}.metrics"``: a ``MetricRecord`` of the int and float scalars;
- ``"{cid}.config"``: a ``ConfigRecord`` of the str and bool scalars;

and the whole message has one ``ConfigRecord`` ``"mmfl"`` of bookkeeping
(route, round, client ids, call indices, views of odd dtypes). Bookkeeping is
not part of any mmfl message, so :meth:`Message.nbytes` of a decoded message
equals that of the original and byte accounting matches the simulator.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from mmfl.core.message import Message
from mmfl.errors import MMFLError

META = "mmfl"
# torch dtypes numpy cannot hold -> an integer dtype of the same width to view them as
_VIEW_AS = {torch.bfloat16: torch.int16}
for _name, _view in (("float8_e4m3fn", torch.uint8), ("float8_e5m2", torch.uint8)):
    if hasattr(torch, _name):
        _VIEW_AS[getattr(torch, _name)] = _view
_DTYPE_BY_NAME = {str(d).removeprefix("torch."): d for d in _VIEW_AS}


def tensor_to_array(t: Tensor) -> tuple[Array, str | None]:
    """An ``Array`` of ``t`` (exact dtype and shape) and the torch dtype name if viewed.
    ``t`` may be on any device: it is copied to the CPU first (numpy needs CPU memory)."""
    t = t.detach().cpu()
    odd = None
    if t.dtype in _VIEW_AS:
        odd = str(t.dtype).removeprefix("torch.")
        t = t.contiguous().view(_VIEW_AS[t.dtype])
    return Array(t.contiguous().numpy()), odd


def array_to_tensor(a: Array, odd: str | None = None) -> Tensor:
    arr = a.numpy()
    t = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    if odd is not None:
        t = t.view(_DTYPE_BY_NAME[odd])
    return t


def put_message(rd: RecordDict, key: str, msg: Message, meta: ConfigRecord) -> None:
    """Store ``msg`` under ``key`` in ``rd`` (odd dtypes noted in ``meta``)."""
    arrays, odd = {}, []
    for name, t in msg.arrays.items():
        arrays[name], view = tensor_to_array(t)
        if view is not None:
            odd += [f"{key}/{name}", view]
    if odd:
        meta[f"{key}.odd"] = odd
    rd[f"{key}.arrays"] = ArrayRecord(arrays) if arrays else ArrayRecord()
    metrics, config = {}, {}
    for name, v in msg.scalars.items():
        if isinstance(v, (bool, np.bool_)):
            config[name] = bool(v)
        elif isinstance(v, str):
            config[name] = v
        elif isinstance(v, (int, np.integer)):
            metrics[name] = int(v)
        elif isinstance(v, (float, np.floating)):
            metrics[name] = float(v)
        else:
            raise MMFLError(f"message scalar {name!r}: {type(v).__name__} is not a float, int, bool or str")
    if metrics:
        rd[f"{key}.metrics"] = MetricRecord(metrics)
    if config:
        rd[f"{key}.config"] = ConfigRecord(config)


def get_message(rd: RecordDict, key: str, meta: ConfigRecord) -> Message:
    """The mmfl message stored under ``key`` by :func:`put_message`."""
    odd_list = list(meta.get(f"{key}.odd", []))
    odd = dict(zip(odd_list[::2], odd_list[1::2]))
    arrays = {}
    if f"{key}.arrays" in rd:
        for name, a in rd[f"{key}.arrays"].items():
            arrays[name] = array_to_tensor(a, odd.get(f"{key}/{name}"))
    scalars: dict = {}
    if f"{key}.metrics" in rd:
        scalars.update(rd[f"{key}.metrics"])
    if f"{key}.config" in rd:
        scalars.update(rd[f"{key}.config"])
    return Message(arrays=arrays, scalars=scalars)


def encode(messages: dict[int, Message], **bookkeeping) -> RecordDict:
    """A ``RecordDict`` holding ``messages`` (keyed by client id) and bookkeeping."""
    rd = RecordDict()
    meta = ConfigRecord({"cids": [int(c) for c in messages], **bookkeeping})
    for cid, msg in messages.items():
        put_message(rd, str(cid), msg, meta)
    rd[META] = meta
    return rd


def decode(rd: RecordDict) -> tuple[dict[int, Message], ConfigRecord]:
    """The client messages and the bookkeeping record of :func:`encode`."""
    if META not in rd:
        raise MMFLError("not an mmfl message (no 'mmfl' config record)")
    meta = rd[META]
    return {int(c): get_message(rd, str(c), meta) for c in meta["cids"]}, meta


def state_to_record(state: dict[str, Tensor]) -> tuple[ArrayRecord, list[str]]:
    arrays, odd = {}, []
    for name, t in state.items():
        arrays[name], view = tensor_to_array(t)
        if view is not None:
            odd += [name, view]
    return ArrayRecord(arrays), odd


def record_to_state(rec: ArrayRecord, odd: list[str] | None = None) -> dict[str, Tensor]:
    views = dict(zip((odd or [])[::2], (odd or [])[1::2]))
    return {name: array_to_tensor(a, views.get(name)) for name, a in rec.items()}
