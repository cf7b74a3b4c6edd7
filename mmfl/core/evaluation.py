"""Evaluation as a protocol of its own: the kinds of evaluation, what they need, and how the
engine runs them.

An algorithm's server **declares** its evaluations, ``Server.evaluations = {kind: prefix}``
(default ``{"global": ""}``), and has one method per kind, ``evaluate_<kind>(ctx)``. The
engine (:class:`mmfl.engine.runner.Experiment`) builds an :class:`EvalContext` after each
evaluated round and calls :func:`run_evaluations`; every metric of kind ``k`` is reported
as ``prefix + name``. Nothing is read off the transport: what an evaluation needs is in
the context.

The kinds (:data:`KINDS`):

- ``global``: the server's model on the shared test set (:func:`global_metrics`: accuracy,
  loss, and for a multimodal model the per-modality ``accuracy/<m>``, ``uar``, ...; a head's
  ``accuracy/<m>`` over the rows holding ``m``). A test set with ``present/<m>`` masks also gets
  the accuracy and row count per missingness pattern, ``pattern/complete/accuracy``,
  ``pattern/no_<m>/accuracy``, ``pattern/<name>/n`` (:mod:`mmfl.core.patterns`); so does the
  ``personalized`` kind, pooled over the devices' rows.
- ``personalized``: every client's model on test rows that follow its own label
  distribution, with only the modalities it holds (:func:`personalized_metrics`, the
  protocol of :mod:`mmfl.core.personal`). Where the clients' data is in this process (the
  simulation) the engine passes the per-client test rows and the server scores its own
  copies of the client models; otherwise (Flower) each client gets an
  ``evaluate_personal`` message with its model (or a flag to use its own, kept in its
  state) and answers with its metrics, computed on rows it draws itself from its own
  training labels. Both give the same numbers (``tests/test_evaluation.py``).
- ``retrieval``: cross-modal retrieval (Recall@K) of the server's model
  (:mod:`mmfl.core.retrieval`; CreamFL and its baselines).

``run.personal_eval = true`` adds the ``personalized`` kind (under ``personal/``) to any
algorithm that does not declare it: the default personalized model of a client is the global
model restricted to the modalities it holds (``Server.personal_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn

from mmfl.core.message import Message
from mmfl.core.patterns import PATTERN
from mmfl.core.retrieval import evaluate_retrieval, pairs_to_retrieval
from mmfl.core.personal import combine_devices, device_metrics, evaluate_devices, held_test_set, own_test_indices
from mmfl.core.training import evaluate_model, load_into, state_of
from mmfl.data.base import ArrayDataset

KINDS = {
    "global": "the server's model on the shared test set (with per-modality metrics)",
    "personalized": "each client's model on test rows following its label distribution, its modalities only",
    "retrieval": "cross-modal retrieval Recall@K of the server's model",
    "clients": "each client's own model on its evaluation set, through messages (SOLO): mean and std",
}
PERSONAL_ROUTE = "evaluate_personal"  # the clients' route of the personalized evaluation
PERSONAL_CHUNK = 256  # clients per send of the personalized evaluation's message route (memory bound)
PERSONAL_PREFIX = "personal/"  # where run.personal_eval reports it for an algorithm that does not declare it
OWN = "model/"  # a client's own model in its state (the convention of the personalized clients)


@dataclass
class EvalContext:
    """What an evaluation gets from the engine."""

    rnd: int  # 0-based round just finished
    test: ArrayDataset  # the shared test set (held by the server)
    seed: int  # the run seed (the personalized test rows are drawn from it)
    num_classes: int
    num_clients: int
    modalities_of: Callable[[int], tuple[str, ...]]  # what each client holds
    send: Callable[[str, dict[int, Message]], dict[int, Message]]  # to the clients (the transport's send)
    # each client's personalized test rows (indices into ``test``) where the clients' data is in
    # this process (the simulation); None: the clients draw their own rows (message route)
    personal_rows: Callable[[], list[np.ndarray]] | None = None
    batch_size: int = 1000


def run_evaluations(server, kinds: dict[str, str], ctx: EvalContext) -> dict:
    """Run ``server.evaluate_<kind>(ctx)`` for each ``kind`` of ``kinds`` (in order); one row with
    every metric under its kind's prefix."""
    row: dict = {}
    for kind, prefix in kinds.items():
        fn = getattr(server, f"evaluate_{kind}", None)
        if fn is None:
            raise NotImplementedError(f"{type(server).__name__} declares the evaluation {kind!r} "
                                      f"but has no evaluate_{kind}(ctx)")
        row.update({prefix + k: v for k, v in fn(ctx).items()})
    return row


# ----------------------------------------------------------------------------- the kinds

HEAD_METRICS = ("accuracy", "uar", "class_accuracy")  # <name>/<m>: what the head of modality m scores


def global_metrics(model: nn.Module, test: ArrayDataset, num_classes: int, modality_heads: bool = True) -> dict:
    """``global``: :func:`mmfl.core.training.evaluate_model` of ``model`` on ``test``; without
    ``modality_heads`` (an algorithm that never trains ``heads[m]``: ``Server.trains_heads``) the
    heads' ``accuracy/<m>``, ``uar/<m>``, ``class_accuracy/<m>`` are left out (untrained heads
    score about chance, which read as a result)."""
    row = evaluate_model(model, test, num_classes=num_classes)
    if not modality_heads:
        heads = getattr(model, "heads", None) or {}
        row = {k: v for k, v in row.items()
               if not (k.partition("/")[0] in HEAD_METRICS and k.partition("/")[2] in heads)}
    return row


def personalized_metrics(ctx: EvalContext, model_of: Callable[[int], nn.Module] | None,
                         state_of_client: Callable[[int], dict[str, Tensor] | None] | None,
                         over_own: bool = False) -> dict:
    """``personalized``: the mean over clients of each one's metrics on its own test rows
    (:func:`mmfl.core.personal.combine_devices`).

    ``model_of(cid)``: the server's copy of client ``cid``'s model (None: the server has none,
    the clients evaluate their own). ``state_of_client(cid)``: the tensors of that model to send
    on the message route (None: the client's own model, ``model/*`` in its state; with
    ``over_own`` the sent tensors replace only their entries of the client's own model). The server's
    copies are scored here when ``ctx.personal_rows`` is given; otherwise every client gets a
    :data:`PERSONAL_ROUTE` message and answers with :func:`client_personal_metrics`, sent
    :data:`PERSONAL_CHUNK` clients at a time (memory bounded by a chunk's messages, not the client
    count; the same numbers as one send: each client's reply depends on its message only).
    """
    if model_of is not None and ctx.personal_rows is not None:
        return evaluate_devices(model_of, ctx.personal_rows(), ctx.modalities_of, ctx.test, ctx.num_classes,
                                ctx.batch_size)
    per = []
    for lo in range(0, ctx.num_clients, PERSONAL_CHUNK):  # a chunk's messages at a time, not every client's
        msgs = {}
        for cid in range(lo, min(lo + PERSONAL_CHUNK, ctx.num_clients)):
            arrays = state_of_client(cid)
            msgs[cid] = Message(arrays=dict(arrays or {}), scalars={
                "seed": int(ctx.seed), "num_classes": int(ctx.num_classes), "own": arrays is None or over_own,
                "batch_size": int(ctx.batch_size)})
        replies = ctx.send(PERSONAL_ROUTE, msgs)
        for cid in sorted(msgs):
            s = replies[cid].scalars if cid in replies else {}
            per.append({k: s[k] for k in s if k in ("accuracy", "uar", "test_loss", "rows") or k.startswith(PATTERN)}
                       if s.get("rows", 0) > 0 else None)
        del msgs, replies
    return combine_devices(per)


def client_personal_metrics(ctx, msg: Message) -> Message:
    """A client's answer on :data:`PERSONAL_ROUTE` (``ctx``: its ClientContext): its model (the
    message's tensors, over its own ``model/*`` state when ``own`` is set, or the run's initial
    weights) on its own test rows (:func:`mmfl.core.personal.own_test_indices`), its
    modalities only. ``rows = 0``: it has no test rows."""
    seed, num_classes = int(msg.scalars["seed"]), int(msg.scalars["num_classes"])
    idx = own_test_indices(ctx.test_data, ctx.data, ctx.cid, seed, num_classes)
    if len(idx) == 0:
        return Message(scalars={"rows": 0})
    model = ctx.model("personal_eval")
    arrays = {}
    if msg.scalars.get("own", False):
        own = {k[len(OWN):]: v for k, v in ctx.state.items() if k.startswith(OWN)}
        arrays = own if own else state_of(ctx.init_model())
    arrays = {**arrays, **msg.arrays}
    load_into(model, arrays)
    data = held_test_set(ctx.test_data, ctx.modalities, idx)
    m = device_metrics(model, data, num_classes, int(msg.scalars.get("batch_size", 1000)))
    return Message(scalars=m)


def retrieval_scores(img: Tensor, txt: Tensor, test: ArrayDataset, meta) -> dict:
    """``retrieval``: image-to-text and text-to-image Recall@1/5/10 of the representations
    ``img``/``txt`` ``[len(test), d]`` of the test rows (:func:`mmfl.core.retrieval.evaluate_retrieval`):
    the 1K protocol for 5,000 test images, else plain; rows paired by instance (or several
    captions per image via ``meta.info["image_index"]``), or by class for class-paired sets.
    One row per pair (emoji, mfeat): 1K + 5K for 5,000 rows, else ``"fifths"`` (the plain keys
    over all rows, ``fold_*`` over 5 strided fifths, ``rsum_authors`` the four-term R@1 sum of
    the CreamFL paper's Table 1)."""
    pairing = (meta.info or {}).get("pairing", "instance")
    index = ((meta.info or {}).get("image_index") or {}).get("test")
    if pairing == "class":
        labels = test.get()[1]
        out = evaluate_retrieval(img, txt, None, "plain", class_level=True, img_labels=labels, txt_labels=labels)
    elif index is not None and int(index.numel()) == len(test):
        img, txt, t2i = pairs_to_retrieval(img, txt, index)
        out = evaluate_retrieval(img, txt, t2i)
    else:  # instance pairs: 1K + 5K for 5,000 pairs, else their small-set analogue (5 strided fifths + all)
        n = len(test)
        protocol = "1k" if n == 5000 else "fifths" if n >= 5 else "plain"
        out = evaluate_retrieval(img, txt, torch.arange(n, device=img.device), protocol)
        if meta.num_classes > 1:  # also by class: a hit is an item of the query's class
            labels = test.get()[1]
            by_class = evaluate_retrieval(img, txt, None, "plain", class_level=True, img_labels=labels,
                                          txt_labels=labels)
            out.update({f"class_{k}": v for k, v in by_class.items() if isinstance(v, float)})
    return {k: v for k, v in out.items() if isinstance(v, float)}
