"""Progress of a run on the terminal: a bar over rounds and, inside a round, a bar over the
clients of each send (clients done / cohort, with tqdm's ETA of the round), plus the run's
ETA on the rounds bar from the first client on (before round 1 ends, tqdm has no rate).

The transport calls :meth:`RunProgress.begin_send` and :meth:`RunProgress.advance` as clients
finish (:class:`~mmfl.engine.simulation.SimulationTransport`, and :func:`~mmfl.engine.batched_delivery.send_batched`
per trained group); the runner calls :meth:`begin_round` / :meth:`end_round`. The inner bar is
drawn only when stderr is a terminal (tqdm's ``disable=None``), and the rounds bar is redrawn
between rounds only there too, so a log file gets one line per round, not one per client.
"""

from __future__ import annotations

import sys
import time


def _fmt(seconds: float) -> str:
    from tqdm import tqdm

    return tqdm.format_interval(max(0.0, seconds))


def run_eta(elapsed_run: float, rounds_done: int, elapsed_round: float, round_frac: float,
            rounds_left: int) -> float | None:
    """Seconds left in the run (the current round included), or None when nothing is known yet.

    ``rounds_done`` rounds took ``elapsed_run - elapsed_round`` seconds; the current round is
    ``round_frac`` (in (0, 1]) done after ``elapsed_round`` s; ``rounds_left`` counts the rounds
    after the current one. Finished rounds give the mean round time; before the first one
    ends, the current round's pace does."""
    if rounds_done > 0:
        per_round = (elapsed_run - elapsed_round) / rounds_done
        this_left = max(per_round - elapsed_round, 0.0)
    elif round_frac > 0:
        per_round = elapsed_round / round_frac
        this_left = per_round - elapsed_round
    else:
        return None
    return this_left + rounds_left * per_round


class RunProgress:
    """The rounds bar (rounds ``start..total``) and the clients bar inside each round."""

    def __init__(self, desc: str, start: int, total: int):
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self.tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=start, desc=desc, unit="round", dynamic_ncols=True)
        self.total, self.done = total, 0  # rounds finished in this process
        self.rnd = start
        self.t_run = self.t_round = time.perf_counter()
        self.inner = None
        self.postfix: dict[str, str] = {}
        self.first = (0, 0)  # (done, size) of the round's first send: the round's share done

    # --- rounds (runner) -------------------------------------------------
    def begin_round(self, rnd: int) -> None:
        self.rnd, self.t_round, self.first = rnd, time.perf_counter(), (0, 0)

    def end_round(self, row: dict) -> None:
        self._close_inner()
        self.done += 1
        self.postfix.pop("run ETA", None)  # tqdm's own ETA takes over once a round has finished
        if "accuracy" in row:
            self.postfix["acc"] = f"{row['accuracy']:.4f}"
        elif "r1_sum" in row:
            self.postfix["r1_sum"] = f"{row['r1_sum']:.2f}"
        self.bar.set_postfix(self.postfix, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self._close_inner()
        self.bar.close()

    # --- clients (transport) ---------------------------------------------
    def begin_send(self, route: str, n: int) -> None:
        """A send to ``n`` clients starts (the inner bar restarts at 0/n)."""
        if self.first == (0, 0):
            self.first = (0, n)
        if self.inner is None:
            self.inner = self._tqdm(total=n, desc=f"  round {self.rnd + 1} {route}", unit="client",
                                    leave=False, disable=None, dynamic_ncols=True, position=1)
        else:
            self.inner.reset(total=n)
            self.inner.set_description(f"  round {self.rnd + 1} {route}", refresh=False)

    def advance(self, k: int = 1) -> None:
        """``k`` more clients of the current send are done."""
        if self.inner is not None:
            self.inner.update(k)
        done, size = self.first
        if size and done < size:
            self.first = (min(done + k, size), size)
        if self.done == 0:  # before a round has finished: the run's ETA from this round's pace
            now = time.perf_counter()
            d, n = self.first
            eta = run_eta(now - self.t_run, 0, now - self.t_round, d / n if n else 0.0,
                          self.total - self.rnd - 1)
            if eta is not None:
                self.postfix["run ETA"] = f"~{_fmt(eta)}"
                self.bar.set_postfix(self.postfix, refresh=self.tty)

    def _close_inner(self) -> None:
        if self.inner is not None:
            self.inner.close()
            self.inner = None
