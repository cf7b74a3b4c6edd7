"""Flower on the run's device, tested on the CPU (no GPU in CI): the ClientApp places messages
and state on ITS machine's device and puts replies back on the CPU for the wire; the server's
transport moves replies onto the server's device; Ray gets ``num_gpus`` from ``gpus_per_client``
and a GPU request on a machine without one is one line; ``scripts/setup.sh`` picks the torch build
(CPU wheel index without an NVIDIA GPU, PyPI's CUDA build with one)."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import patience
import torch

pytest.importorskip("flwr", reason='Flower not installed (pip install -e ".[flower]")')

from mmfl.cli import main as cli_main  # noqa: E402
from mmfl.core.message import Message  # noqa: E402
from mmfl.engine.runner import Experiment  # noqa: E402
from mmfl.errors import ConfigError  # noqa: E402
from mmfl.flower import client_app  # noqa: E402
from mmfl.flower.records import decode, encode, tensor_to_array  # noqa: E402
from mmfl.flower.simulation import gpu_resources  # noqa: E402
from mmfl.flower.transport import FlowerTransport  # noqa: E402

try:
    from test_flower import BASE, InProcessGrid, assert_same_run, cfg_of, grid_run, simulator_run
except ImportError:  # run as the package tests.*
    from tests.test_flower import BASE, InProcessGrid, assert_same_run, cfg_of, grid_run, simulator_run

ROOT = Path(__file__).resolve().parents[1]
META = torch.device("meta")  # stands in for an accelerator: tensors there have no data to copy back
NODES = {11: {"partition-id": 0, "num-partitions": 2}, 22: {"partition-id": 1, "num-partitions": 2}}


class OnAccelerator(torch.Tensor):
    """Stands in for a CUDA tensor on a CPU-only machine: ``.numpy()`` refuses as it does for
    one; ``.cpu()`` gives a plain CPU tensor."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone()


def on_accelerator(t: torch.Tensor) -> OnAccelerator:
    return t.clone().as_subclass(OnAccelerator)


# ----------------------------------------------------------------------------- records

def test_records_move_device_tensors_to_cpu_before_numpy():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with pytest.raises(TypeError, match="Tensor.cpu"):
        on_accelerator(t).numpy()
    arr, odd = tensor_to_array(on_accelerator(t))
    assert odd is None and arr.numpy().tolist() == t.tolist()
    bf = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    out, _ = decode(encode({3: Message(arrays={"w": on_accelerator(t), "bf": on_accelerator(bf)})}, route="train", rnd=0))
    assert torch.equal(out[3].arrays["w"], t) and out[3].arrays["w"].device.type == "cpu"
    assert out[3].arrays["bf"].dtype == torch.bfloat16 and torch.equal(out[3].arrays["bf"], bf)


# ----------------------------------------------------------------------------- ClientApp / transport

def test_client_app_puts_messages_and_state_on_its_device_and_replies_on_the_wire(tmp_path, monkeypatch):
    # the SuperNode's device is "meta" here (an accelerator stand-in): run_client must get the
    # message and the client's stored state there and the device as ctx.device; its reply and
    # state (accelerator tensors) must reach the wire and context.state as CPU tensors
    seen = []

    def fake_run_client(spec, params, *, cid, rnd, msg, state, device, **kw):
        seen.append((cid, rnd, device, {k: t.device for k, t in msg.arrays.items()},
                     {k: t.device for k, t in state.items()}))
        w = on_accelerator(torch.full((2,), float(cid + rnd)))
        return Message(arrays={"w": w}, scalars={"num_examples": 1}), {"s": on_accelerator(torch.ones(3))}

    monkeypatch.setattr(client_app, "_RUNS", {})
    monkeypatch.setattr(client_app, "resolve_device", lambda name: META)
    monkeypatch.setattr(client_app, "place_federation", lambda fed, dev: fed)
    monkeypatch.setattr(client_app, "run_client", fake_run_client)
    cfg = cfg_of(tmp_path, "meta", "device=cpu")
    grid = InProcessGrid(cfg.to_toml(), NODES)
    transport = FlowerTransport(grid, _federation(cfg), cfg.run, wait_for_nodes_s=0)
    for rnd in range(2):
        transport.begin_round(rnd)
        replies = transport.send("train", {c: Message(arrays={"g": torch.zeros(4)}) for c in range(3)})
        assert {c: r.arrays["w"].tolist() for c, r in replies.items()} == {c: [float(c + rnd)] * 2 for c in range(3)}
        assert all(type(r.arrays["w"]) is torch.Tensor and r.arrays["w"].device.type == "cpu" for r in replies.values())
    assert len(seen) == 6 and all(dev == META and msg == {"g": META} for _, _, dev, msg, _ in seen)
    assert [state for _, rnd, _, _, state in seen if rnd == 0] == [{}] * 3  # no state yet
    assert [state for _, rnd, _, _, state in seen if rnd == 1] == [{"s": META}] * 3  # stored on CPU, loaded onto it


def _federation(cfg):
    from mmfl.algorithms import ALGORITHMS
    from mmfl.data.federation import build_federation

    return build_federation(cfg, pooled=ALGORITHMS.get(cfg.algorithm.name).factory.pooled)


def test_server_transport_moves_replies_onto_the_servers_device(tmp_path):
    # real ClientApps on the CPU; the server's device is "meta": every reply array arrives there
    cfg = cfg_of(tmp_path, "server", "device=cpu")
    grid = InProcessGrid(cfg.to_toml(), NODES)
    exp = Experiment(cfg, progress=False, transport=lambda e: FlowerTransport(
        grid, e.federation, cfg.run, wait_for_nodes_s=0, device=META))
    exp.transport.begin_round(0)
    replies = exp.transport.send("train", exp.server.configure_train(0, [0, 1, 2]))
    assert sorted(replies) == [0, 1, 2]
    assert all(t.device == META for r in replies.values() for t in r.arrays.values())
    assert all(r.scalars["num_examples"] > 0 for r in replies.values())  # scalars untouched


def test_transport_with_device_cpu_explicitly_equals_simulator(tmp_path):
    # MOON keeps state per client on its node: device = "cpu" through the ClientApp's device path
    over = ["algorithm.name=moon", "device=cpu"]
    assert_same_run(grid_run(tmp_path, "moon-cpu", NODES, *over), simulator_run(tmp_path, "moon-cpu", *over))


# ----------------------------------------------------------------------------- Ray: gpus_per_client

def test_gpu_resources_give_ray_num_gpus_per_actor_and_refuse_what_the_machine_lacks():
    assert gpu_resources(0, "auto", num_gpus=2) == (0.0, 0)  # no GPU asked: Ray gets none
    assert gpu_resources(0.25, "auto", num_gpus=2) == (0.25, 2)  # four actors share a GPU
    assert gpu_resources(2, "cuda", num_gpus=2) == (2.0, 2)
    with pytest.raises(ConfigError, match=r"gpus_per_client = 0.5 but this machine has no CUDA GPU"):
        gpu_resources(0.5, "auto", num_gpus=0)
    with pytest.raises(ConfigError, match=r"gpus_per_client = 3 but this machine has 2 GPU"):
        gpu_resources(3, "auto", num_gpus=2)
    with pytest.raises(ConfigError, match=r"fraction of one GPU or a whole number"):
        gpu_resources(1.5, "auto", num_gpus=2)
    with pytest.raises(ConfigError, match=r"device = 'cuda' with gpus_per_client = 0"):
        gpu_resources(0, "cuda", num_gpus=2)


def test_simulate_gpus_per_client_without_a_gpu_is_one_line(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    argv = ["flower", "simulate", str(Path(__file__).with_name("flower_tiny.toml")), "--gpus-per-client", "0.5"]
    for o in [*BASE, f"output_dir={tmp_path}", "name=gpu"]:
        argv += ["--set", o]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmfl: error: gpus_per_client = 0.5 but this machine has no CUDA GPU")
    assert not (tmp_path / "gpu").exists()  # refused before Ray or the run folder


@pytest.mark.slow
def test_ray_simulation_device_cpu_no_gpus_equals_simulator(tmp_path, capsys):
    # the one real-process test here: Ray actors with num_gpus = 0 (--gpus-per-client 0 overrides
    # the config's 0.5) and device = "cpu" end with the same metrics and model as the simulator
    over = ["device=cpu", "gpus_per_client=0.5", f"output_dir={tmp_path / 'ray'}", "name=ray"]
    argv = ["flower", "simulate", str(Path(__file__).with_name("flower_tiny.toml")), "--num-supernodes", "2",
            "--ray-cpus", "2", "--gpus-per-client", "0"]
    for o in [*BASE, *over]:
        argv += ["--set", o]
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert_same_run(tmp_path / "ray" / "ray", simulator_run(tmp_path, "ray", "device=cpu"))


# ----------------------------------------------------------------------------- scripts/setup.sh

def setup_dry_run(tmp_path, gpu: bool, **env) -> subprocess.CompletedProcess:
    """scripts/setup.sh --dry-run with a stand-in ``nvidia-smi`` that lists a GPU or fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n" if gpu else
                   "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    full = {k: v for k, v in os.environ.items() if not k.startswith("MMFL_")}
    full.update(PATH=f"{bin_dir}:{os.environ['PATH']}", **env)
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--dry-run"], env=full,
                          capture_output=True, text=True, timeout=patience(60))


def torch_command(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("+ ") and "torch==2.13.0" in x and "transformers" not in x]
    return line


@pytest.fixture
def local_index(tmp_path):
    """A PEP 503 index on 127.0.0.1 that answers for torch (stopped after the test)."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def test_setup_without_gpu_takes_torch_from_the_cpu_index(tmp_path, local_index):
    r = setup_dry_run(tmp_path, gpu=False, MMFL_TORCH_INDEX=local_index)
    assert r.returncode == 0, r.stderr
    assert "cpu build (no NVIDIA GPU" in r.stdout
    assert f"--index-url {local_index} torch==2.13.0" in torch_command(r.stdout)
    # the rest comes from the default index (no --index-url), and nothing is run in a dry run
    rest = [x for x in r.stdout.splitlines() if x.startswith("+ ") and "pip install" in x and x != torch_command(r.stdout)]
    assert rest and not any("--index-url" in x for x in rest)
    assert any("-e .[dev,flower,tracking,hf]" in x for x in rest)


def test_setup_default_cpu_index_is_pytorchs(tmp_path):
    # without MMFL_TORCH_INDEX the CPU build names PyTorch's CPU wheel index (reachable or not)
    r = setup_dry_run(tmp_path, gpu=False)
    assert r.returncode == 0, r.stderr
    assert "from https://download.pytorch.org/whl/cpu" in r.stdout


def test_setup_with_gpu_keeps_pypis_cuda_build(tmp_path):
    r = setup_dry_run(tmp_path, gpu=True)
    assert r.returncode == 0, r.stderr
    assert "cuda build (nvidia-smi -L lists a GPU)" in r.stdout
    assert torch_command(r.stdout).endswith("pip install -q --disable-pip-version-check torch==2.13.0")
    assert "download.pytorch.org" not in r.stdout + r.stderr


def test_setup_env_variable_overrides_the_detection(tmp_path, local_index):
    r = setup_dry_run(tmp_path, gpu=True, MMFL_TORCH="cpu", MMFL_TORCH_INDEX=local_index)
    assert r.returncode == 0 and "cpu build (MMFL_TORCH=cpu)" in r.stdout
    assert "--index-url" in torch_command(r.stdout)
    r = setup_dry_run(tmp_path, gpu=False, MMFL_TORCH="cuda", MMFL_TORCH_INDEX=local_index)  # any index, e.g. cu126
    assert r.returncode == 0 and "cuda build (MMFL_TORCH=cuda)" in r.stdout
    assert f"--index-url {local_index}" in torch_command(r.stdout)
    r = setup_dry_run(tmp_path, gpu=False, MMFL_TORCH="gpu")
    assert r.returncode == 2 and r.stderr.strip() == "setup: error: MMFL_TORCH must be auto, cpu or cuda, got 'gpu'"


def test_setup_falls_back_to_the_default_index_when_the_index_cannot_be_reached(tmp_path):
    url = closed_port_url()
    r = setup_dry_run(tmp_path, gpu=False, MMFL_TORCH_INDEX=url)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == f"setup: {url} cannot be reached; torch==2.13.0 comes from the default index instead"
    assert "--index-url" not in torch_command(r.stdout)
