"""The mmfl ``ClientApp``: runs an algorithm's client part on a SuperNode.

Which clients a SuperNode hosts comes from its ``--node-config``:

- ``partition-id=K num-partitions=P``: the mmfl clients ``c`` with
  ``c % P == K`` (one client per SuperNode when ``P`` equals the run's
  ``partition.num_clients``; Flower's simulation engine sets these keys too);
- or ``client-ids="3,7,9"``: exactly those clients;
- ``data.<key>=<value>`` / ``partition.<key>=<value>``: override that value of
  the run's config on this node only (e.g. ``data.root="/mnt/fmnist"``, where
  this machine keeps the data set). ``modalities.*`` keys are refused: the
  server assigns modalities from the same config, so the run config's
  ``[modalities]`` table decides (``explicit`` lists each client's).

The SuperNode builds its clients' data itself, from the run's ``[data]``,
``[partition]`` and ``[modalities]`` config and seed (the same deterministic
split and modality assignment the server and the simulator make); no client
data ever comes from the server. Its hello reply carries each hosted client's
data fingerprint and modalities, which the server checks against its own.
The run config's ``[privacy]`` rules are enforced here, on the node: every reply is
checked against its client's data before it leaves (:mod:`mmfl.engine.privacy`), and a
breach fails the ClientApp, hence the run. Node config cannot change the rules.
Persistent client state (``ctx.state``) lives in Flower's ``context.state``,
one ``ArrayRecord`` per hosted client, or, on a SuperNode started with
``--node-config 'state-dir="DIR"'``, in files under ``DIR`` (:mod:`mmfl.flower.node_state`),
which outlive the Flower run and the SuperNode process, so the run can be resumed.
Every message is delivered by
:func:`mmfl.engine.client_runtime.run_client`, as in the simulator.

Each SuperNode computes on ITS machine's device: the run config's ``device`` is resolved
where the ClientApp runs (``auto``: this machine's GPU if it has one, else the CPU; an
explicit ``cuda`` on a machine without one fails the ClientApp with one line). Its clients'
data is placed there once; each incoming message's arrays and each client's stored state
are moved onto it, and each reply (and state) is moved back to the CPU before it becomes a
Flower record. ``precision = "bf16"`` autocasts there; replies travel as fp32.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from typing import Callable

import torch
from flwr.app import ConfigRecord, Context, Message as FlowerMessage, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from mmfl.config import ExperimentConfig, apply_overrides, resolve
from mmfl.core.device import CPU, place_federation, precision_context, resolve_device, to_cpu, to_device
from mmfl.core.evaluation import PERSONAL_ROUTE
from mmfl.core.message import Message
from mmfl.engine.attack import make_attack
from mmfl.engine.client_runtime import ModelPool, run_client
from mmfl.engine.privacy import federation_modalities, make_checker
from mmfl.errors import MMFLError
from mmfl.core.training import train_for_run
from mmfl.flower.node_state import NODE_KEY, NodeStateDir
from mmfl.flower.records import decode, encode, record_to_state, state_to_record

CONFIG_KEY = "mmfl-config"  # run config: the resolved mmfl config, as TOML text
SET_KEY = "mmfl-set"  # run config: "key=value ..." overrides of it (an app of `mmfl flower new`)
STATE = "mmfl.state."  # context.state: one ArrayRecord per client (+ ".odd" config of viewed dtypes)


EVAL_ROUTES = ("evaluate", PERSONAL_ROUTE)  # routes only evaluations send (they compute in fp32)


@dataclass
class RunEnv:
    """What the clients of a run need on this machine (built once per process and run)."""

    cfg: ExperimentConfig
    spec: object
    federation: object
    make_model: Callable[..., nn.Module]
    model: ModelPool = None  # models per (key, client structure)
    privacy: object = None  # the [privacy] rules' PrivacyChecker (None: no rules)
    attack: object = None  # the [attack] (mmfl.engine.attack.Attack; None: every client honest)
    device: torch.device = CPU  # this machine's device for the run (the config's ``device`` resolved here)

    def __post_init__(self):
        self.model = ModelPool(self.make_model)
        self.privacy = make_checker(self.cfg.privacy, federation_modalities(self.federation))
        self.attack = make_attack(self.cfg.attack, self.federation.num_clients, self.cfg.run.seed)


@dataclass
class NodeEnv:
    """A run's environment and the clients this SuperNode hosts."""

    run: RunEnv
    cids: list[int]


_RUNS: dict[str, RunEnv] = {}  # one entry: a process serves one run at a time (a Ray actor, many nodes)


def node_overrides(node_config: dict) -> list[str]:
    """``data.*``/``partition.*`` node-config entries as ``--set`` overrides."""
    for k in node_config:
        if k.split(".", 1)[0] in ("modalities", "case"):
            raise MMFLError(f"node config {k}: which modalities a client holds comes from the run config's "
                            "[modalities] table, which the server uses too (e.g. name = \"explicit\" with "
                            "holds = [...] per client); it cannot be set per SuperNode")
    return [f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in sorted(node_config.items())
            if k.split(".", 1)[0] in ("data", "partition") and "." in k]


def hosted_clients(node_config: dict, num_clients: int) -> list[int]:
    if "client-ids" in node_config:
        raw = str(node_config["client-ids"]).replace(",", " ").split()
        try:
            return sorted({int(c) for c in raw})
        except ValueError:
            raise MMFLError(f"node config client-ids={node_config['client-ids']!r}: expected ids like \"0,3,7\"") from None
    if "partition-id" not in node_config:
        raise MMFLError("node config has no partition-id (start the SuperNode with "
                        "--node-config \"partition-id=K num-partitions=P\")")
    k = int(node_config["partition-id"])
    p = int(node_config.get("num-partitions", num_clients))
    if not 0 <= k < p:
        raise MMFLError(f"node config partition-id={k} is not in [0, num-partitions={p})")
    return [c for c in range(num_clients) if c % p == k]


def run_config_text(run_config, fallback: str | None = None) -> str:
    """The mmfl config (TOML text) of a Flower run: its ``mmfl-config`` (else ``fallback``) with
    the ``mmfl-set`` overrides (``key=value`` pairs, shell quoting) applied. The ServerApp and
    every ClientApp call this on the same run config, so they agree on the experiment."""
    import shlex

    text = run_config.get(CONFIG_KEY) or fallback
    if not text:
        raise MMFLError(f"the run config has no {CONFIG_KEY!r}: submit the run with `mmfl flower submit CONFIG` "
                        "(or flwr run --run-config FILE with that key, or an app of `mmfl flower new`)")
    extra = str(run_config.get(SET_KEY, "") or "").strip()
    if not extra:
        return text
    try:
        pairs = shlex.split(extra)
    except ValueError as e:
        raise MMFLError(f"run config {SET_KEY}={extra!r}: {e}") from None
    return resolve(apply_overrides(tomllib.loads(text), pairs)).to_toml()


def node_env(config_text: str, node_config: dict) -> NodeEnv:
    """This node's environment for a run (the data set is built once per process)."""
    overrides = node_overrides(node_config)
    key = hashlib.sha256((config_text + repr(overrides)).encode()).hexdigest()
    if key not in _RUNS:
        from mmfl.algorithms import ALGORITHMS
        from mmfl.data.federation import build_federation
        from mmfl.models.factory import model_factory

        cfg = resolve(apply_overrides(tomllib.loads(config_text), overrides))
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        spec = ALGORITHMS.get(cfg.algorithm.name).factory
        device = resolve_device(cfg.run.device)  # on THIS machine: "auto" is its GPU if it has one
        fed = place_federation(build_federation(cfg, pooled=spec.pooled), device)  # on the device once
        _RUNS.clear()
        _RUNS[key] = RunEnv(cfg, spec, fed, model_factory(cfg, fed.meta, device), device=device)
    run = _RUNS[key]
    return NodeEnv(run, hosted_clients(node_config, run.federation.num_clients))


def load_state(state: RecordDict, cid: int) -> dict:
    rec = state.array_records.get(f"{STATE}{cid}")
    if rec is None:
        return {}
    odd = state.config_records.get(f"{STATE}{cid}.odd")
    return record_to_state(rec, list(odd["odd"]) if odd else None)


def save_state(state: RecordDict, cid: int, tensors: dict) -> None:
    for k in (f"{STATE}{cid}", f"{STATE}{cid}.odd"):
        if k in state:
            del state[k]
    if tensors:
        rec, odd = state_to_record(tensors)
        state[f"{STATE}{cid}"] = rec
        if odd:
            state[f"{STATE}{cid}.odd"] = ConfigRecord({"odd": odd})


def handle(msg: FlowerMessage, context: Context, config_text: str | None = None) -> FlowerMessage:
    """Deliver one Flower message: a stage of secure aggregation goes through Flower's
    ``secaggplus_mod`` (:mod:`mmfl.flower.secagg_node`), which calls :func:`handle_plain`."""
    from mmfl.flower.secagg_node import client_stage, is_secagg

    if is_secagg(msg):
        return client_stage(msg, context, lambda m, c: handle_plain(m, c, config_text))
    return handle_plain(msg, context, config_text)


def handle_plain(msg: FlowerMessage, context: Context, config_text: str | None = None) -> FlowerMessage:
    """Deliver one Flower message (the mmfl messages of one or more hosted clients)."""
    from mmfl.flower.transport import fingerprint, presence

    text = run_config_text(context.run_config, config_text)
    env = node_env(text, dict(context.node_config))
    run = env.run
    fed, cfg = run.federation, run.cfg
    if msg.metadata.message_type.startswith("query."):  # hello: which clients live here
        fps = [x for c in env.cids for x in fingerprint(fed.clients[c])]
        mods = ["+".join(fed.modalities_of(c)) for c in env.cids]  # the server checks both
        present = [presence(fed.clients[c], fed.modalities_of(c)) for c in env.cids]  # per-sample masks
        info = ConfigRecord({"cids": env.cids, "fingerprints": fps, "modalities": mods, "present": present,
                             NODE_KEY: int(bool(context.node_config.get(NODE_KEY)))})
        return FlowerMessage(RecordDict({"mmfl": info}), reply_to=msg)
    messages, meta = decode(msg.content)
    route, rnd = str(meta["route"]), int(meta["rnd"])
    disk = node_state_dir(context, meta, cfg)  # None: the state lives in context.state
    expect = set(meta["expect-state"]) if "expect-state" in meta else set()
    replies, kept = {}, []
    device = run.device
    for cid, call in zip(messages, meta["calls"]):
        if cid not in env.cids:
            raise MMFLError(f"this SuperNode does not host client {cid} (it hosts {env.cids})")
        state = disk.load(cid, rnd, int(call)) if disk is not None else load_state(context.state, cid)
        state = to_device(state, device)  # records and state files hold CPU tensors
        msg_in = Message(to_device(messages[cid].arrays, device), messages[cid].scalars)
        if cid in expect and disk is not None and not disk.has_state_before(cid, rnd):
            raise MMFLError(f"client {cid} kept state before round {rnd + 1} of this resumed run, but this "
                            f"SuperNode has none under {disk.dir}: start it with the state-dir of the "
                            "interrupted run (the same machine and folder)")
        # bf16 for what the server's round sends; evaluation in fp32, as the simulator evaluates
        precision = "fp32" if route in EVAL_ROUTES else cfg.run.precision
        with precision_context(device, precision):  # run_client returns bf16 arrays as fp32
            reply, new_state = run_client(
                run.spec, cfg.algorithm.params, cid=cid, rnd=rnd, route=route, call=int(call), msg=msg_in,
                data=fed.clients[cid], test_data=fed.test_of(cid), meta=fed.meta_of(cid),
                train=train_for_run(cfg.train, cfg.run.rounds),
                seed=cfg.run.seed, state=state, model_pool=run.model,
                init_model=run.make_model, holds=fed.modalities_of(cid), group=fed.group_of(cid),
                source=fed.source_of(cid), public=fed.public, privacy=run.privacy, attack=run.attack,
                dp=cfg.dp, device=device)
        reply = Message(to_cpu(reply.arrays), reply.scalars)  # the wire holds CPU tensors (fp32: run_client)
        new_state = to_cpu(new_state)
        if reply.nonfinite_key() is None:  # as in the simulator: a rejected reply keeps no state
            if disk is None:
                save_state(context.state, cid, new_state)
            elif new_state or state:  # stateless clients write nothing
                disk.save(cid, rnd, new_state)
        if new_state:
            kept.append(cid)
        replies[cid] = reply
    content = encode(replies, route=route, rnd=rnd)
    if kept:  # the server notes which clients keep state (a resume checks they still have it)
        content["mmfl"]["kept-state"] = kept
    return FlowerMessage(content, reply_to=msg)


def node_state_dir(context: Context, meta, cfg: ExperimentConfig) -> NodeStateDir | None:
    """This node's client-state folder for the run (``state-dir`` node config and the
    server's ``state-id``), or None: keep the state in Flower's ``context.state``."""
    root = context.node_config.get(NODE_KEY)
    if not root or "state-id" not in meta:
        return None
    return NodeStateDir(str(root), str(meta["state-id"]), keep=cfg.run.keep_checkpoints)


class MMFLClientApp(ClientApp):
    """A ClientApp that accepts every ``train.*``/``evaluate.*``/``query.*`` message
    type (mmfl routes are open-ended) and hands it to :func:`handle`."""

    def __init__(self, config_text: str | None = None):
        super().__init__()
        self.config_text = config_text

    def __call__(self, message: FlowerMessage, context: Context) -> FlowerMessage:
        return handle(message, context, self.config_text)


def make_client_app(config_text: str | None = None) -> ClientApp:
    """The ClientApp; ``config_text`` is used when the run config carries none
    (Flower's Python simulation API has no run config)."""
    return MMFLClientApp(config_text)
