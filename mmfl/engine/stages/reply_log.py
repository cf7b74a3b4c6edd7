"""The replies of a round: every transport's replies checked against the server's reply schema
(:mod:`mmfl.core.replies`, ``run.on_bad_reply``), and what the byte log saw recorded in the row:
the training conversation's bytes (taken before an evaluation resets the log), the clients
dropped and the replies rejected in training and evaluation, and a round whose every reply was
dropped (``run.on_no_valid_reply``, :mod:`mmfl.engine.learning_check`)."""

from __future__ import annotations

from mmfl.core.replies import check_reply
from mmfl.engine.learning_check import no_valid_reply
from mmfl.engine.stages.base import Round, Stage


class TrainReplies(Stage):
    """After training: the byte log's summary, dropped and rejected clients so far (``r.train_comm``,
    ``r.dropped``, ``r.rejected``); ``no_valid_reply`` when replies came and none was kept. Its
    :meth:`make` hands the transport's log the reply check."""

    @classmethod
    def make(cls, exp) -> "TrainReplies":
        stage = cls(exp)
        exp.transport.log.check = stage.check
        exp.transport.log.on_bad_reply = exp.cfg.run.on_bad_reply
        return stage

    def check(self, route: str, cid: int, reply) -> str | None:
        """Why client ``cid``'s ``reply`` on ``route`` does not fit the server's schema (None:
        it fits, or the server declares none for the route); its counts are bounded by the
        client's training rows."""
        schema = self.exp.server.reply_schema(route, cid)
        if schema is None:
            return None
        clients = self.exp.federation.clients
        size = len(clients[cid]) if 0 <= cid < len(clients) else None
        return check_reply(schema, reply, size)

    def round(self, r: Round) -> None:
        log = self.exp.transport.log
        r.train_comm = log.summary()
        r.dropped = list(log.dropped)  # before the evaluation resets the log
        r.rejected = list(getattr(log, "rejected", ()))
        if r.dropped and getattr(log, "accepted", None) == 0:  # replies came, none was kept
            r.row["no_valid_reply"] = no_valid_reply(self.exp.cfg.run.on_no_valid_reply, r.rnd, r.dropped)


class TrainBytes(Stage):
    """The training conversation's bytes (``bytes_up``, ``bytes_down``, per route and client)."""

    def round(self, r: Round) -> None:
        r.row.update(r.train_comm)


class Dropped(Stage):
    """``dropped`` (clients) and ``replies_rejected`` / ``rejected``, training and evaluation together."""

    def round(self, r: Round) -> None:
        log = self.exp.transport.log
        r.dropped += [c for c in log.dropped if c not in r.dropped]  # + dropped in evaluation
        if r.dropped:
            r.row["dropped"] = r.dropped
        if r.evaluated:  # + rejected in evaluation (without one, the log still holds training's)
            r.rejected += list(getattr(log, "rejected", ()))
        if r.rejected:
            r.row["replies_rejected"] = len(r.rejected)
            r.row["rejected"] = r.rejected
