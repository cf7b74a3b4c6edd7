"""Batched delivery (the runtime side of :mod:`mmfl.core.batched`): when a transport's
``batch_clients`` is on and every client of a ``send`` can be batched, train them together
with :func:`~mmfl.core.batched.train_stacked`; otherwise say once why not and let the
transport deliver the messages one by one."""

from __future__ import annotations

import logging
from typing import Any

from mmfl.algorithms.base import ClientContext
from mmfl.core.batched import MAX_GROUP, capability_blocker, model_blocker, train_stacked
from mmfl.core.message import Message
from mmfl.core.training import seed_torch, train_at_round
from mmfl.seeds import derive_seed

log = logging.getLogger("mmfl")


# ----------------------------------------------------------------------------- the transport hook

def send_batched(transport, route: str, messages: dict[int, Message]) -> tuple[dict[int, Message], dict[int, Message]]:
    """Train what can be batched; return ``(replies, messages left for sequential delivery)``.

    All-or-nothing per call: either every message is handled here or none is
    (so replies keep the sequential order, by client id). Records on
    ``transport.batch_info`` how many clients were batched, or why not.
    """
    if not getattr(transport, "batch_clients", False) or len(messages) < 2:
        return {}, messages
    reason = _blocker(transport, route, messages)
    if reason is not None:
        _fallback(transport, reason)
        return {}, messages
    fed = transport.federation
    train = train_at_round(transport.train, transport.rnd)
    cids = sorted(messages)
    clients, ctxs, tasks, calls = [], [], [], []
    for cid in cids:
        call = transport._calls[cid]
        ctx = ClientContext(
            cid=cid, rnd=transport.rnd, seed=derive_seed(transport.seed, transport.rnd, cid, route, call),
            data=fed.clients[cid], test_data=fed.test, meta=fed.meta, train=train,
            state=transport.store.load(cid), model_pool=transport._model, init_model=transport.make_model)
        client = transport.spec.client(transport.params, ctx)
        task = client.batched_task(route, messages[cid])
        if task is None:
            _fallback(transport, f"{type(client).__name__} does not batch route '{route}'")
            return {}, messages
        clients.append(client), ctxs.append(ctx), tasks.append(task), calls.append(call)
    ref = {n: (t.shape, t.dtype) for n, t in tasks[0].start.items()}
    if any({n: (t.shape, t.dtype) for n, t in task.start.items()} != ref for task in tasks):
        _fallback(transport, "the clients' models differ in shape")
        return {}, messages
    groups: dict[Any, list[int]] = {}
    for j, task in enumerate(tasks):
        groups.setdefault(task.group, []).append(j)
    groups = {(key, s): members[s:s + MAX_GROUP] for key, members in groups.items()
              for s in range(0, len(members), MAX_GROUP)}
    template = transport._model("batched")
    results: dict[int, tuple] = {}
    for members in groups.values():
        outs = train_stacked(template, clients[members[0]], [tasks[j] for j in members],
                             [ctxs[j].data for j in members], [ctxs[j].generator() for j in members],
                             train)
        for j, o in zip(members, outs):
            results[j] = o
        if getattr(transport, "progress", None) is not None:  # the runner's clients bar
            transport.progress.advance(len(members))
    for cid, call in zip(cids, calls):
        transport._calls[cid] = call + 1
    replies: dict[int, Message] = {}
    for j, cid in enumerate(cids):
        msg = messages[cid]
        state, stats = results[j]
        seed_torch(ctxs[j].seed)  # as sequential delivery does before the client runs
        reply = clients[j].batched_finish(route, msg, state, stats)
        privacy = getattr(transport, "privacy", None)
        if privacy is not None:  # before the reply leaves its client, as run_client does for sequential ones
            privacy.check(reply, fed.clients[cid], cid=cid, route=route, num_classes=fed.meta_of(cid).num_classes)
        if not transport.log.admit(route, cid, msg, reply, transport.on_nonfinite, transport.rnd):
            continue
        transport.store.save(cid, ctxs[j].state)
        replies[cid] = reply
    info = getattr(transport, "batch_info", None)
    if info is not None:
        info["batched_clients"] = info.get("batched_clients", 0) + len(cids)
    return replies, {}


def _blocker(transport, route: str, messages) -> str | None:
    dp = getattr(transport, "dp", None)
    if dp is not None and dp.mode == "sample":
        return "DP-SGD clients ([dp] mode = \"sample\") are trained one by one"
    attack = getattr(transport, "attack", None)
    if attack is not None and any(attack.is_malicious(c) for c in messages):
        return "malicious clients ([attack]) are simulated one by one"
    if transport.federation.client_sources is not None:
        return "clients hold different data sets ([[client_data]])"
    if transport.federation.client_groups is not None:
        return "clients build different models ([[client_models]])"
    if transport.federation.client_modalities is not None:
        return "clients hold different modalities (different model structures)"
    if any(k.startswith("present/") for k in transport.federation.clients[0].features):
        return "samples miss modalities (present/<m> masks)"
    return capability_blocker(transport.spec.client) or model_blocker(transport._model("batched"), transport.train)


def _fallback(transport, reason: str) -> None:
    seen = transport.__dict__.setdefault("_batch_reasons", set())
    if reason not in seen:
        seen.add(reason)
        log.warning("batch_clients: training clients sequentially: %s", reason)
    info = getattr(transport, "batch_info", None)
    if info is not None:
        info["batched_fallback"] = reason
