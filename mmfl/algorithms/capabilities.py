"""What an algorithm can do, declared once: :class:`Capabilities`, computed from its
:class:`~mmfl.algorithms.base.AlgorithmSpec` by :func:`capabilities` and read by the engine
(batched training, streamed aggregation, ``[dp]`` and ``[secure_aggregation]`` validation)
and by ``mmfl list algorithm --capabilities``.

A family declares what it can do with class attributes (``dp_capable``, ``secagg_capable``,
``evaluations`` and ``streams`` on the server, ``stateful`` on the client, ``flower`` on the
server); what is not declared is inferred here, in :func:`_infer` and nowhere else, from the
methods the classes override (e.g. a FedAvg server that overrides ``aggregate`` needs the whole
list of replies; one overriding only ``server_step`` still streams).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

DP_MODES = ("central", "local", "sample", "rows")
FLAGS = ("batched", "streaming", "secagg", "flower", "personalized_eval", "stateful_clients")


@dataclass(frozen=True)
class Capabilities:
    """What a registered algorithm supports (``why_not[name]``: the one-line reason for a
    capability it lacks, used in the engine's refusal and fallback lines)."""

    batched: bool  # run.batch_clients trains its clients stacked (mmfl.core.batched)
    streaming: bool  # run.stream_aggregation folds its train replies one at a time (default rule)
    secagg: bool  # [secure_aggregation]: its server needs only the weighted sum of the replies
    flower: bool  # runs on Flower (mmfl flower ...)
    dp_modes: tuple[str, ...]  # the [dp] modes it accepts: central, local (client-level), sample (DP-SGD), rows
    personalized_eval: bool  # its main evaluation is each client's own model on its own test rows
    stateful_clients: bool  # its clients keep state between rounds (ctx.state, checkpointed)
    why_not: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def reason(self, name: str) -> str | None:
        """Why the algorithm lacks capability ``name`` (None: it has it, or no reason recorded)."""
        return dict(self.why_not).get(name)

    def flags(self) -> str:
        """One line: the names of what it supports, e.g. ``batched streaming dp:central,local``."""
        out = [n.replace("_eval", "").replace("_clients", "") for n in FLAGS
               if n not in ("personalized_eval", "stateful_clients") and getattr(self, n)]
        if self.dp_modes:
            out.append("dp:" + ",".join(self.dp_modes))
        out += [s for n, s in (("personalized_eval", "personalized"), ("stateful_clients", "stateful"))
                if getattr(self, n)]
        return " ".join(out) or "-"


def _streams(server: type) -> tuple[bool, str | None]:
    """Inferred: the class that gives ``train_accumulator`` is not the base Server, and no class
    below it overrides ``aggregate`` or ``aggregate_train`` (it would need the whole list)."""
    from mmfl.algorithms.base import Server

    for klass in server.__mro__:
        if "train_accumulator" in vars(klass):
            if klass is Server:
                return False, f"{server.__name__} aggregates the whole list of replies (no train_accumulator)"
            return True, None
        changed = [m for m in ("aggregate", "aggregate_train") if m in vars(klass)]
        if changed:
            return False, f"{klass.__name__} overrides {', '.join(changed)}"
    return False, f"{server.__name__} is not a Server"


def _infer(server: type, client: type, pooled: bool) -> Capabilities:
    """The one place capabilities are inferred, from declarations first and overrides second."""
    from mmfl.core.batched import capability_blocker

    why: dict[str, str] = {}
    batch_why = capability_blocker(client)
    if batch_why:
        why["batched"] = batch_why
    declared_stream = getattr(server, "streams", None)
    streaming, stream_why = (bool(declared_stream), None) if declared_stream is not None else _streams(server)
    if not streaming:
        why["streaming"] = stream_why or f"{server.__name__} declares streams = False"
    averages = not pooled and bool(getattr(server, "dp_capable", False))
    secagg = not pooled and bool(getattr(server, "secagg_capable", getattr(server, "dp_capable", False)))
    if not secagg:
        why["secagg"] = "it needs more from its clients than the weighted sum of their models"
    dp_modes: tuple[str, ...] = ()
    blocker = getattr(client, "dpsgd_blocker", lambda: f"{client.__name__} is not a FedAvg-family client")()
    server_why = "its server uses more of the replies than averaged models"
    if averages:
        dp_modes = ("central", "local") + (("sample",) if blocker is None else ())
    else:
        why["dp"] = "it trains on the pooled data" if pooled else server_why
    # modes a server declares itself (dp_extra_modes): DP-SGD with batch-level clipping (FedCMI, CreamFL),
    # the per-row Gaussian mechanism on the rows' vectors it receives (PartialFL, split learning); docs/dp.md
    extra = () if pooled else tuple(getattr(server, "dp_extra_modes", ()))
    dp_modes = tuple(m for m in DP_MODES if m in dp_modes or m in extra)
    if "sample" not in dp_modes:  # the client's training first, as the refusal line has said
        why["dp:sample"] = "it trains on the pooled data" if pooled else blocker or server_why
    if "rows" not in dp_modes:
        why["dp:rows"] = ("it trains on the pooled data" if pooled else "its clients send model parameters, "
                          "not per-row vectors of their data" if averages or "sample" in dp_modes
                          else "it declares no per-row release")
    evaluations = getattr(server, "evaluations", {}) or {}
    return Capabilities(batched=batch_why is None, streaming=streaming, secagg=secagg,
                        flower=bool(getattr(server, "flower", True)), dp_modes=dp_modes,
                        personalized_eval="personalized" in evaluations or "clients" in evaluations,
                        stateful_clients=bool(getattr(client, "stateful", False)), why_not=tuple(why.items()))


@lru_cache(maxsize=None)
def _cached(server: type, client: type, pooled: bool) -> Capabilities:
    return _infer(server, client, pooled)


def capabilities(spec) -> Capabilities:
    """The :class:`Capabilities` of an :class:`~mmfl.algorithms.base.AlgorithmSpec` (computed once)."""
    return _cached(spec.server, spec.client, bool(spec.pooled))


@lru_cache(maxsize=None)
def server_streams(server: type) -> bool:
    """Whether a server class streams its train replies (:attr:`Capabilities.streaming`; for a
    server's own ``train_accumulator``, which has no spec at hand)."""
    declared = getattr(server, "streams", None)
    return bool(declared) if declared is not None else _streams(server)[0]


def algorithms_with(name: str) -> list[str]:
    """The registered algorithms having capability ``name`` (``dp:<mode>`` for a DP mode)."""
    from mmfl.algorithms.registry import ALGORITHMS

    def has(n: str) -> bool:
        caps = capabilities(ALGORITHMS.get(n).factory)
        return name[3:] in caps.dp_modes if name.startswith("dp:") else bool(getattr(caps, name))

    return [n for n in ALGORITHMS.names() if has(n)]
