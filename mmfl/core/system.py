"""The wireless system model: simulated latency of a synchronous round from the bytes the
transport counted and the FLOPs of each client's model.

Yin, Chen, Tao, "Aggregation Design for Personalized Federated Multi-Modal Learning over
Wireless Networks", sec. III-B and IV-A (docs/system.md maps every equation to code):

- placement: devices uniform in a disc of diameter D around the base station (sec. IV-A);
- path loss: PL(d) [dB] = 32.4 + 20 log10(f_c [GHz]) + 20 log10(d [m]) (sec. IV-A);
- channel: the amplitude g_{k,t} is Rayleigh with mean 10^(-PL(d_k)/20), redrawn every
  round (sec. IV-A); the same g_{k,t} serves download and upload;
- download (eq. 8): T^D_{k,t} = bits_down / (B log2(1 + p^ g^2 / (B N_0)));
- computation (eq. 9): T^cmp_{k,t} = N_k O_k / (f_k e_k), N_k iterations of O_k FLOPs;
- upload (Algorithm 1, line 6): T^U_{k,t} = bits_up / (B log2(1 + p_k g^2 / (B N_0)));
- synchronous rounds (Fig. 2): a round lasts max_k (T^D + T^cmp + T^U) over its devices.

Every random draw comes from a seed derived from the run seed (``derive_seed``): the
placement and the devices' frequencies from ``(seed, "system", ...)``, the fading of round
``t`` from ``(seed, t, "system", "fading")``, so a resumed run draws what an uninterrupted
one draws, and the model never touches torch's or numpy's global generators.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from torch import nn

from mmfl.models.flops import count_flops
from mmfl.seeds import derive_seed

# ----------------------------------------------------------------------------- pure functions


def dbm_to_watts(dbm):
    """P [W] = 10^((P [dBm] - 30) / 10)."""
    return 10.0 ** ((np.asarray(dbm, dtype=np.float64) - 30.0) / 10.0)


def place_devices(n: int, diameter_m: float, rng: np.random.Generator, min_distance_m: float = 1.0) -> np.ndarray:
    """Distances [n] (m) of devices uniform in a disc of diameter ``diameter_m`` around the
    base station (sec. IV-A): r = R sqrt(u), u ~ U(0, 1), so that the density is uniform in
    area. Distances are clipped below at ``min_distance_m`` (the path loss needs d > 0)."""
    radius = diameter_m / 2.0
    r = radius * np.sqrt(rng.random(n))
    return np.maximum(r, min_distance_m)


def path_loss_db(d_m, carrier_ghz: float):
    """PL(d) [dB] = 32.4 + 20 log10(f_c [GHz]) + 20 log10(d [m]) (sec. IV-A)."""
    return 32.4 + 20.0 * math.log10(carrier_ghz) + 20.0 * np.log10(np.asarray(d_m, dtype=np.float64))


def mean_amplitude_gain(pl_db):
    """E[g] = 10^(-PL/20): the mean of the Rayleigh channel amplitude g (sec. IV-A)."""
    return 10.0 ** (-np.asarray(pl_db, dtype=np.float64) / 20.0)


def rayleigh_amplitude(mean, rng: np.random.Generator) -> np.ndarray:
    """Rayleigh amplitudes with mean ``mean`` (sec. IV-A): scale sigma = mean sqrt(2/pi), so
    E[g] = sigma sqrt(pi/2) = mean and E[g^2] = 2 sigma^2 = (4/pi) mean^2."""
    mean = np.asarray(mean, dtype=np.float64)
    return rng.rayleigh(scale=mean * math.sqrt(2.0 / math.pi), size=mean.shape)


def shannon_rate(bandwidth_hz: float, power_w, amplitude, noise_w_per_hz: float):
    """R = B log2(1 + p g^2 / (B N_0)) bits/s: the denominator of eq. 8 (download, p = p^)
    and of the upload term of Algorithm 1, line 6 (p = p_k). Each device has a channel of
    bandwidth B (B is not split among the scheduled devices)."""
    g2 = np.asarray(amplitude, dtype=np.float64) ** 2
    return bandwidth_hz * np.log2(1.0 + np.asarray(power_w) * g2 / (bandwidth_hz * noise_w_per_hz))


def transmission_latency(nbytes, rate_bps):
    """T = 8 nbytes / R seconds (eq. 8 with Upsilon in bits; 0 bytes take no time)."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    return np.where(nbytes > 0, 8.0 * nbytes / np.asarray(rate_bps, dtype=np.float64), 0.0)


def computation_latency(iterations, flops_per_iteration, cycles_per_s, flops_per_cycle):
    """T^cmp = N_k O_k / (f_k e_k) seconds (eq. 9): N_k iterations of O_k FLOPs each, on a
    device of f_k cycles/s doing e_k FLOPs per cycle."""
    return np.asarray(iterations, dtype=np.float64) * np.asarray(flops_per_iteration, dtype=np.float64) / (
        np.asarray(cycles_per_s, dtype=np.float64) * flops_per_cycle)


def local_iterations(n: int, batch_size: int, epochs: int) -> tuple[int, int]:
    """``(iterations, samples)`` of ``epochs`` epochs of local training on ``n`` samples, as
    :func:`mmfl.core.training.local_train` runs them: batches of ``batch_size``, a batch of
    one sample skipped unless the client has a single sample."""
    sizes = [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])
    kept = [s for s in sizes if not (s < 2 and n >= 2)]
    return epochs * len(kept), epochs * sum(kept)


def device_frequencies(n: int, cycles_per_s, rng: np.random.Generator) -> np.ndarray:
    """f_k [n] (cycles/s): the same number for every device, or uniform in [min, max]."""
    if isinstance(cycles_per_s, (list, tuple)):
        lo, hi = cycles_per_s
        return rng.uniform(lo, hi, size=n) if hi > lo else np.full(n, float(lo))
    return np.full(n, float(cycles_per_s))


# ----------------------------------------------------------------------------- the model of a run


class WirelessSystem:
    """The ``[system]`` model of one run: where each device is, its channel in each round,
    its computing speed and the FLOPs of its model.

    ``WirelessSystem(cfg, federation, model_for_client)``: ``cfg`` the run's
    :class:`~mmfl.config.ExperimentConfig` (its ``system`` table, seed and ``[train]``),
    ``model_for_client(cid)`` a model of client ``cid``'s structure (its modalities, its
    ``[[client_models]]`` entry), built only to count FLOPs, once per distinct structure.

    The runner calls :meth:`round_latency` after each round; an algorithm gets the same object
    as ``ServerContext.system`` (None without ``[system]``) and may rank devices by
    :meth:`download_latency`, :meth:`upload_latency` and :meth:`compute_latency`, which use
    round ``rnd``'s channel (known to the server when it schedules, as in Algorithm 1).
    """

    def __init__(self, cfg, federation, model_for_client: Callable[[int], nn.Module]):
        self.params = p = cfg.system
        self.seed = cfg.run.seed
        self.train = cfg.train
        self.federation = federation
        self.model_for_client = model_for_client
        n = federation.num_clients
        placement = np.random.default_rng(derive_seed(self.seed, "system", "placement"))
        self.distance_m = place_devices(n, p.diameter_m, placement, p.min_distance_m)
        self.path_loss_db = path_loss_db(self.distance_m, p.carrier_ghz)
        self.mean_amplitude = mean_amplitude_gain(self.path_loss_db)
        self.cycles_per_s = device_frequencies(n, p.cycles_per_s,
                                               np.random.default_rng(derive_seed(self.seed, "system", "cycles")))
        self.bs_power_w = float(dbm_to_watts(p.bs_power_dbm))
        self.device_power_w = float(dbm_to_watts(p.device_power_dbm))
        self.noise_w_per_hz = float(dbm_to_watts(p.noise_dbm_per_hz))
        self._amplitude: tuple[int, np.ndarray] | None = None  # (round, g of every device)
        self._fwd_flops: dict[tuple, float] = {}  # forward FLOPs per sample, per client structure

    # --- channel ----------------------------------------------------------
    def amplitude(self, rnd: int) -> np.ndarray:
        """g_{k,t} of every device in round ``rnd`` (deterministic per (seed, round))."""
        if self._amplitude is None or self._amplitude[0] != rnd:
            if self.params.fading == "none":
                g = self.mean_amplitude
            else:
                rng = np.random.default_rng(derive_seed(self.seed, rnd, "system", "fading"))
                g = rayleigh_amplitude(self.mean_amplitude, rng)
            self._amplitude = (rnd, g)
        return self._amplitude[1]

    def download_rate(self, rnd: int, cid: int) -> float:
        """bits/s from the base station to device ``cid`` in round ``rnd`` (eq. 8's denominator)."""
        return float(shannon_rate(self.params.bandwidth_hz, self.bs_power_w, self.amplitude(rnd)[cid],
                                  self.noise_w_per_hz))

    def upload_rate(self, rnd: int, cid: int) -> float:
        """bits/s from device ``cid`` to the base station in round ``rnd`` (Algorithm 1, line 6)."""
        return float(shannon_rate(self.params.bandwidth_hz, self.device_power_w, self.amplitude(rnd)[cid],
                                  self.noise_w_per_hz))

    def download_latency(self, rnd: int, cid: int, nbytes: int) -> float:
        """Eq. 8: seconds to send ``nbytes`` to device ``cid`` in round ``rnd``."""
        return float(transmission_latency(nbytes, self.download_rate(rnd, cid)))

    def upload_latency(self, rnd: int, cid: int, nbytes: int) -> float:
        """Seconds for device ``cid`` to send ``nbytes`` in round ``rnd`` (Algorithm 1, line 6)."""
        return float(transmission_latency(nbytes, self.upload_rate(rnd, cid)))

    # --- computation ------------------------------------------------------
    def forward_flops_per_sample(self, cid: int) -> float:
        """FLOPs of one sample's forward pass through client ``cid``'s model
        (:func:`mmfl.models.flops.count_flops`), counted once per model structure."""

        fed = self.federation
        key = (fed.modalities_of(cid), fed.group_of(cid), fed.source_of(cid))
        if key not in self._fwd_flops:
            data = fed.clients[cid]
            rows = max(1, min(len(data), 4))
            with torch.random.fork_rng(devices=[]):  # building a model must not move any generator
                model = self.model_for_client(cid)
                inputs, _ = data.get(torch.arange(rows, device=data.labels.device))
                self._fwd_flops[key] = count_flops(model, inputs) / rows
        return self._fwd_flops[key]

    def iterations(self, cid: int) -> tuple[int, int]:
        """``(N_k, samples)`` of client ``cid``'s local training in one round (``[train]``)."""
        return local_iterations(len(self.federation.clients[cid]), self.train.batch_size, self.train.local_epochs)

    def flops_per_iteration(self, cid: int) -> float:
        """O_k of eq. 9: the training FLOPs (``train_flops_factor`` x forward) of one
        iteration, the mean over the round's iterations (a last, smaller batch counts less)."""
        n_iter, samples = self.iterations(cid)
        per_sample = self.params.train_flops_factor * self.forward_flops_per_sample(cid)
        return per_sample * samples / n_iter if n_iter else 0.0

    def compute_latency(self, cid: int, steps: int | None = None) -> float:
        """Eq. 9: seconds of client ``cid``'s local training; ``steps`` overrides N_k."""
        n_iter = self.iterations(cid)[0] if steps is None else steps
        return float(computation_latency(n_iter, self.flops_per_iteration(cid), self.cycles_per_s[cid],
                                         self.params.flops_per_cycle))

    # --- a round ----------------------------------------------------------
    def client_latency(self, rnd: int, cid: int, down: int, up: int, steps: int | None = None) -> dict[str, float]:
        """Download, computation and upload seconds of device ``cid`` in round ``rnd``."""
        return {"download": self.download_latency(rnd, cid, down), "compute": self.compute_latency(cid, steps),
                "upload": self.upload_latency(rnd, cid, up)}

    def round_latency(self, rnd: int, per_client_bytes: dict, steps: dict | None = None,
                      per_client_limit: int = 100) -> dict:
        """The round's simulated duration: the slowest device's download + compute + upload
        (synchronous aggregation, Fig. 2).

        ``per_client_bytes``: ``{cid: {"down": bytes, "up": bytes}}`` (the transport log's
        ``bytes_per_client``; string ids accepted), every device that took part in the round.
        ``steps``: ``{cid: iterations}`` where known (else from ``[train]``). Returns
        ``sim_time_s`` and the critical device's ``sim_download_s``, ``sim_compute_s``,
        ``sim_upload_s`` (they add up to ``sim_time_s``) and id ``sim_straggler``, plus
        ``sim_latency_per_client`` when at most ``per_client_limit`` devices took part.
        """
        steps = {int(c): s for c, s in (steps or {}).items()}
        parts = {int(c): self.client_latency(rnd, int(c), int(b.get("down", 0)), int(b.get("up", 0)),
                                             steps.get(int(c)))
                 for c, b in per_client_bytes.items()}
        if not parts:
            return {"sim_time_s": 0.0, "sim_download_s": 0.0, "sim_compute_s": 0.0, "sim_upload_s": 0.0}
        total = {c: t["download"] + t["compute"] + t["upload"] for c, t in parts.items()}
        slowest = max(sorted(total), key=lambda c: total[c])  # ties: the lowest id
        out = {"sim_time_s": total[slowest], "sim_download_s": parts[slowest]["download"],
               "sim_compute_s": parts[slowest]["compute"], "sim_upload_s": parts[slowest]["upload"],
               "sim_straggler": slowest}
        if len(total) <= per_client_limit:
            out["sim_latency_per_client"] = {str(c): total[c] for c in sorted(total)}
        return out
