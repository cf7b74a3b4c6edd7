"""Batched delivery (the runtime side of :mod:`mmfl.core.batched`): when a transport's
``batch_clients`` is on and every client of a ``send`` can be batched, train them together
with :func:`~mmfl.core.batched.train_stacked`; otherwise say once why not and let the
transport deliver the messages one by one."""

from __future__ import annotations

import logging
from typing import Any

from mmfl.algorithms.base import ClientContext
from mmfl.algorithms.capabilities import capabilities
from mmfl.core.batched import (MAX_GROUP, client_bytes, is_out_of_memory, model_blocker,
                               probe_activation_bytes, stack_size, train_stacked)
from mmfl.core.device import CPU, describe, free_memory
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
    if route not in getattr(transport.spec.client, "batched_routes", ("train",)):
        return {}, messages  # e.g. SOLO's evaluate route: delivered one by one, nothing to report
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
            state=transport.store.load(cid), model_pool=transport._model, init_model=transport.make_model,
            device=getattr(transport, "device", CPU))
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
    template = transport._model("batched")
    device = getattr(transport, "device", CPU)
    limit = _stack_limit(transport, template, tasks[0], ctxs[0].data, train, device)
    results: dict[int, tuple] = {}
    pending = [members for members in groups.values()]
    while pending:
        members = pending.pop(0)
        if len(members) > limit:
            pending[:0] = [members[s:s + limit] for s in range(0, len(members), limit)]
            continue
        try:
            outs = train_stacked(template, clients[members[0]], [tasks[j] for j in members],
                                 [ctxs[j].data for j in members], [ctxs[j].generator() for j in members],
                                 train)
        except Exception as e:  # noqa: BLE001 (only an accelerator's out-of-memory is retried)
            if not is_out_of_memory(e) or len(members) == 1:
                raise
            limit = max(1, (len(members) + 1) // 2)  # fresh generators on retry: the same batches
            transport.__dict__["_oom_limit"] = limit  # later sends start from what fitted
            _empty_cache(device)
            log.warning("batch_clients: out of memory on %s with %d clients stacked; retrying with %d",
                        device, len(members), limit)
            info = getattr(transport, "batch_info", None)
            if info is not None:
                info["batched_stack_oom"] = info.get("batched_stack_oom", 0) + 1
            pending.insert(0, members)
            continue
        for j, o in zip(members, outs):
            results[j] = o
        if getattr(transport, "progress", None) is not None:  # the runner's clients bar
            transport.progress.advance(len(members))
    info = getattr(transport, "batch_info", None)
    if info is not None and device.type != "cpu":  # on an accelerator: the largest stack it held
        info["batched_stack"] = max(info.get("batched_stack", 0), min(limit, max(map(len, groups.values()))))
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


def _stack_limit(transport, template, task, data, train, device) -> int:
    """Clients per stack on ``device``: :data:`MAX_GROUP` on the CPU; on an accelerator what its
    free memory holds (parameters, gradients, optimizer state, extras and one batch's activations per
    client, measured once per run), said once in the log."""
    learned = transport.__dict__.get("_oom_limit", MAX_GROUP)  # an earlier out-of-memory's split
    if device.type == "cpu":
        return learned
    cached = transport.__dict__.get("_stack_limit")
    if cached is None:
        act = probe_activation_bytes(template, data, train.batch_size, device)
        per = client_bytes(task, train, act)
        cached = stack_size(per, free_memory(device))
        transport.__dict__["_stack_limit"] = cached
        log.info("batch_clients: up to %d clients per stack on %s (%.1f MiB each)", cached, describe(device),
                 per / 2**20)
    return min(cached, learned)


def _empty_cache(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


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
    if any(k.startswith("present/") for c in transport.federation.clients for k in c.features):
        return "samples miss modalities (present/<m> masks)"
    caps = capabilities(transport.spec)
    return (None if caps.batched else caps.reason("batched")) or model_blocker(transport._model("batched"), transport.train)


def _fallback(transport, reason: str) -> None:
    seen = transport.__dict__.setdefault("_batch_reasons", set())
    if reason not in seen:
        seen.add(reason)
        log.warning("batch_clients: training clients sequentially: %s", reason)
    info = getattr(transport, "batch_info", None)
    if info is not None:
        info["batched_fallback"] = reason
