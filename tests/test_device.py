"""The run's device (``device``, mmfl.core.device) on a CPU-only machine.

- Every tensor an algorithm, loss, aggregation, evaluation or privacy check creates is on the
  run's device: each registered algorithm (and the engine's options: batched clients, bf16,
  streaming, the disk state store, personalized evaluation, DP, attacks, robust rules, the
  wireless system model) runs two rounds with ``device = "cpu"`` while torch's default device
  is ``meta``; a tensor made without an explicit device lands on ``meta``, and the check stops
  the run at the operation that made it.
- ``auto`` resolves to the CPU here; ``cuda`` on a machine without CUDA is one ConfigError line.
- A run checkpointed with ``device = "cpu"`` resumes with ``device = "auto"`` bit for bit (the
  CPU half of "a run checkpointed on a GPU resumes on a CPU").
"""

from __future__ import annotations

import contextlib


import pytest
import torch
from torch.overrides import TorchFunctionMode

from mmfl.cli import main as cli_main
from mmfl.core.device import resolve_device
from mmfl.engine.runner import Experiment
from mmfl.errors import ConfigError
from mmfl.report import load_metrics

from helpers import experiment, run_config

try:
    from registry_cases import by_setting, shipped
except ImportError:  # tests/ imported as a package
    from tests.registry_cases import by_setting, shipped

NO_GPU = not torch.cuda.is_available()
DEVICE = "cpu" if NO_GPU else "cuda"  # the runs' device: a CUDA GPU where torch sees one (scripts/gpu_check.sh)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- the meta check


class _NoMetaResults(TorchFunctionMode):
    """Fails at the first torch operation whose result lands on ``meta``, naming it (with
    ``set_default_device("meta")`` alone, a meta tensor can also fail much later, e.g. as an
    IndexError with a huge index from a meta ``torch.arange``, or not at all)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_meta:
                raise AssertionError(f"{getattr(func, '__qualname__', func)} made a tensor on torch's default "
                                     "device: give it device= (the run's device or an input's)")
        return out


@contextlib.contextmanager
def default_device_meta():
    """torch's default device is ``meta`` inside; restored on exit (also after a failure)."""
    before = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        with _NoMetaResults():
            yield
    finally:
        torch.set_default_device(None if before.type == "cpu" else before)


def test_the_meta_check_stops_a_tensor_made_without_a_device():
    with pytest.raises(AssertionError, match="arange made a tensor on torch's default device"):
        with default_device_meta():
            torch.arange(3)
    with default_device_meta():
        assert torch.arange(3, device="cpu").sum().item() == 3
        assert torch.zeros(2, device="cpu").new_ones(2).device.type == "cpu"
    assert torch.zeros(1).device.type == "cpu"  # restored


def _raw(data: dict, model: dict, **over) -> dict:
    raw = {"name": "x", "rounds": 2, "seed": 0, "threads": 1, "device": DEVICE, "data": data, "model": model,
           "train": {"optimizer": "sgd", "lr": 0.01, "local_epochs": 1, "batch_size": 64}}
    raw.update(over)
    return raw


def digits(**over):
    """sklearn digits, 3 clients, a 16-unit MLP."""
    return _raw({"name": "digits"}, {"name": "mlp", "hidden": [16]}, partition={"num_clients": 3}, **over)


def mfeat(**over):
    """mfeat pix + fou, FedCMI's case D (half the clients unimodal), some samples missing fou."""
    return _raw({"name": "mfeat", "views": ["pix", "fou"]},
                {"name": "multimodal", "feat_dim": 16, "mlp_hidden": [16], "two_projector": True},
                case="D", partition={"num_clients": 4}, clients_per_round=3,
                modalities={"missing_rate": {"fou": 0.3}}, **over)


ADAM = {"local_epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.001}


def pair(**over):
    """mfeat_pair (image [1,16,15] + features) with a public share; clients hold both, the image, the features."""
    raw = _raw({"name": "mfeat_pair", "public_fraction": 0.3},
               {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
               partition={"name": "iid", "num_clients": 3}, train=dict(ADAM),
               modalities={"name": "explicit", "holds": [["image", "features"], ["image"], ["features"]]})
    raw.update(over)
    return raw


def creamfl(name, **algo):
    smaller = [{"for_modalities": ["image"], "cnn_channels": [4]}, {"for_modalities": ["features"], "mlp_hidden": [8]}]
    return pair(algorithm={"name": name, "server_batch_size": 64, **algo}, client_models=smaller)


def partialfl(name):
    raw = pair(algorithm={"name": name, "shareable": "features"}, data={"name": "mfeat_pair"},
               privacy={"modalities": {"image": "private", "features": "shareable"}, "labels": "private"})
    raw["modalities"]["holds"] = [["image", "features"], ["image", "features"], ["image"]]
    return raw


def algo(name, **params):
    return {"name": name, **params}


# each registered algorithm in the smallest federation it runs in (Server.runs_on, from the registry:
# a new algorithm file is covered without an edit here)
BUILDERS = {"single": lambda a: digits(algorithm=algo(a)), "multimodal": lambda a: mfeat(algorithm=algo(a)),
            "public": creamfl, "pair": lambda a: pair(algorithm=algo(a)), "shareable": partialfl}


def registered_cases() -> dict[str, dict]:
    return {a: BUILDERS[setting](a) for setting, names in by_setting().items() for a in names}


CASES = {
    **registered_cases(),
    **{f"{a}+batched": digits(algorithm=algo(a), batch_clients=True)
       for a in ("fedavg", "fedprox", "scaffold", "moon")},
    "moon+batched_adam": digits(algorithm=algo("moon"), batch_clients=True, train=dict(ADAM)),
    "fedavg+bf16": digits(algorithm=algo("fedavg"), precision="bf16"),
    "moon+disk_store": digits(algorithm=algo("moon"), state_store="disk"),
    "scaffold+disk_store": digits(algorithm=algo("scaffold"), state_store="disk"),
    "fedavg+personal_eval": digits(algorithm=algo("fedavg"), personal_eval=True),
    "fedavg+streaming": digits(algorithm=algo("fedavg"), stream_aggregation="on"),
    "fedavg+streaming_norm_clip": digits(algorithm=algo("fedavg", aggregation="norm_clip"), stream_aggregation="on"),
    "fedavg+norm_clip": digits(algorithm=algo("fedavg", aggregation="norm_clip"), stream_aggregation="off"),
    "fedavg+krum": digits(algorithm=algo("fedavg", aggregation="krum", aggregation_params={"f": 0})),
    "fedavg+median": digits(algorithm=algo("fedavg", aggregation="median")),
    "fedavg+dp_sgd": digits(algorithm=algo("fedavg"), dp={"mode": "sample", "noise_multiplier": 1.0}),
    "fedprox+dp_central": digits(algorithm=algo("fedprox"), dp={"mode": "central", "noise_multiplier": 0.5}),
    "fedavg+dp_local": digits(algorithm=algo("fedavg"), dp={"mode": "local", "noise_multiplier": 0.5}),
    "fedavg+attack": digits(algorithm=algo("fedavg"), attack={"kind": "gaussian", "fraction": 0.34}),
    "pfedwireless+system": mfeat(algorithm=algo("pfedwireless"), system={"name": "wireless"}),
    "fedcmi+bf16": mfeat(algorithm=algo("fedcmi"), precision="bf16"),
    "creamfl+pcme": {**creamfl("creamfl", multimodal_loss="pcme", pcme_samples=2),
                     "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16],
                               "uncertainty": True}, "client_models": []},
    "creamfl+bf16": {**creamfl("creamfl"), "precision": "bf16"},
}


def test_every_registered_algorithm_has_a_meta_case():
    covered = {name.split("+")[0] for name in CASES}
    assert set(shipped()) <= covered, sorted(set(shipped()) - covered)  # other test files register test_*


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _tensors(v)


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_tensor_is_made_on_torchs_default_device(case, tmp_path):
    raw = {**CASES[case], "name": case.replace("+", "_"), "output_dir": str(tmp_path)}
    exp = experiment(raw)  # data loading is not under the check
    assert exp.device.type == DEVICE
    with default_device_meta():
        exp.run()
    rows = load_metrics(exp.run_dir)
    assert [r["round"] for r in rows] == [1, 2]
    devices = {t.device.type for t in _tensors(exp.server.state_dict())}
    assert devices <= {"cpu", DEVICE}, devices


# ----------------------------------------------------------------------------- resolving the setting


@pytest.mark.skipif(not NO_GPU or torch.backends.mps.is_available(), reason="a GPU is visible here")
def test_auto_resolves_to_the_cpu_without_an_accelerator():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(not NO_GPU, reason="CUDA is available here")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_one_config_error_line(name):
    with pytest.raises(ConfigError, match=rf"^device: '{name}' requested but .*use device = \"auto\" or \"cpu\"$"):
        resolve_device(name)


def test_an_unknown_device_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^device: must be auto, cpu, cuda, cuda:N or mps, got 'gpu'$"):
        resolve_device("gpu")


@pytest.mark.skipif(not NO_GPU, reason="CUDA is available here")
def test_the_cli_says_cuda_is_missing_in_one_line_with_exit_code_2(capsys):
    assert cli_main(["run", "mmfl/configs/demo.toml", "--no-progress", "--set", "device=cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmfl: error: device: 'cuda' requested but "), err


# ----------------------------------------------------------------------------- resume on another device


def _final(exp: Experiment) -> tuple[dict, list]:
    rows = [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in load_metrics(exp.run_dir)]
    return {k: v.clone() for k, v in exp.server.model.state_dict().items()}, rows


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_cpu_checkpoint_resumes_with_device_auto_bit_for_bit(tmp_path, store):
    # MOON: the server's model and every client's previous model (client state) cross the checkpoint
    base = digits(algorithm=algo("moon"), state_store=store, output_dir=str(tmp_path))
    full = run_config({**base, "name": "full", "rounds": 3})
    run_config({**base, "name": "part", "rounds": 1})
    resumed = run_config({**base, "name": "part", "rounds": 3, "device": "auto"}, resume=True)
    assert resumed.cfg.run.device == "auto" and resumed.device.type == DEVICE  # with a GPU: a cuda checkpoint
    (want, want_rows), (got, got_rows) = _final(full), _final(resumed)
    assert [r["round"] for r in got_rows] == [1, 2, 3]
    assert got_rows == want_rows
    for k in want:
        assert torch.equal(want[k], got[k]), k
        assert got[k].device == resumed.device
