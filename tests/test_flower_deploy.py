"""docs/flower.md's deployment blocks, run as written (TLS certificates, `mmfl flower superlink`
with SuperNode authentication, the operator's flwr connection, keys registered, SuperNodes, a
run and its resume), on this machine: 127.0.0.2 plays the SuperLink's public address,
127.0.0.1 the operator's. Only the settings block's values are changed (through the
environment, as its `VAR=${VAR:-default}` lines allow). Then an outsider holding the CA
certificate and the public address tries to list runs, read a run's log, register its own
SuperNode key, take a ServerApp task from the Runtime API and join with an unregistered key:
each must be refused, while the same `flwr ls` on the operator's address works."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from conftest import patience  # noqa: E402

pytest.importorskip("flwr", reason='Flower not installed (pip install -e ".[flower]")')

from mmfl.flower.deploy import BIN, flower_env, free_port  # noqa: E402

try:
    from test_flower import BASE, assert_same_run, rows, simulator_run
except ImportError:  # run as the package tests.*
    from tests.test_flower import BASE, assert_same_run, rows, simulator_run

DOC = Path(__file__).resolve().parents[1] / "docs" / "flower.md"
PUBLIC = "127.0.0.2"  # the SuperLink's "public" address here (Linux answers all of 127/8 on lo)


def doc_blocks() -> list[str]:
    section = DOC.read_text().split("<!-- verbatim:begin -->")[1].split("<!-- verbatim:end -->")[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def tag(block: str) -> str:
    return block.splitlines()[0]


class Shells:
    """Runs the doc's blocks, each in a new bash that first runs the settings block."""

    def __init__(self, cwd: Path, env: dict, settings: str):
        self.cwd, self.env, self.settings = cwd, env, settings
        self.procs: list[subprocess.Popen] = []

    def run(self, block: str, timeout: float = 300, **var) -> str:
        env = {**self.env, **{k: str(v) for k, v in var.items()}}
        p = subprocess.run(["bash", "-ec", self.settings + block], cwd=self.cwd, env=env, capture_output=True,
                           text=True, timeout=patience(timeout))
        assert p.returncode == 0, f"{tag(block)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
        return p.stdout

    def start(self, block: str, name: str, **var) -> subprocess.Popen:
        env = {**self.env, **{k: str(v) for k, v in var.items()}}
        log = open(self.cwd / f"{name}.log", "w")
        p = subprocess.Popen(["bash", "-ec", self.settings + block], cwd=self.cwd, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def wait_port(host: str, port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {host}:{port}: {log.read_text()[-3000:]}")


def flwr(args: list[str], home: Path, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "flwr"), *args], env={**env, "FLWR_HOME": str(home)}, capture_output=True,
                          text=True, timeout=patience(timeout))


def flwr_json(args: list[str], home: Path, env: dict) -> dict:
    out = flwr([*args, "--format", "json"], home, env).stdout
    return json.loads(out[out.index("{"):])


@pytest.mark.slow
def test_documented_deployment_works_verbatim_and_keeps_outsiders_out(tmp_path):
    blocks = doc_blocks()
    assert tag(blocks[0]).startswith("# [settings]") and len(blocks) == 9
    settings, blocks = blocks[0], blocks[1:]
    num = 3
    config = tmp_path / "my.toml"  # the experiment: SCAFFOLD (client state) on mfeat, 3 clients
    over = [*BASE, "algorithm.name=scaffold", f"output_dir={tmp_path / 'runs'}", "name=deployed"]
    from mmfl.config import load_config

    config.write_text(load_config(None, over).to_toml())
    env = flower_env(None)
    env.pop("FLWR_HOME", None)
    env.update(SUPERLINK=PUBLIC, SAN=f"IP:{PUBLIC}", PORT=str(free_port()), NUM=str(num),
               STATE_DIR=str(tmp_path / "node_state"), CONFIG=str(config), FLWR_HOME=str(tmp_path / "flwr_home"))
    sh = Shells(tmp_path, env, settings)
    port = int(env["PORT"])
    try:
        certs, superlink, connection, keygen, register, supernode, submit, resume = blocks
        assert "keeps running" in tag(superlink) and "keeps running" in tag(supernode)
        sh.run(certs)
        p = sh.start(superlink, "superlink")
        wait_port("127.0.0.1", port, p, tmp_path / "superlink.log")
        assert "my-superlink" in sh.run(connection)
        for k in range(num):
            sh.run(keygen, K=k)
            sh.run(register, K=k)
        for k in range(num):
            sh.start(supernode, f"supernode{k}", K=k, NODE_PORT=free_port())
        out = sh.run(submit, timeout=600)
        assert '"rounds": 2' in out or "summary" in out, out[-2000:]
        run_dir = tmp_path / "runs" / "deployed"
        assert [r["round"] for r in rows(run_dir)] == [1, 2]
        out = sh.run(resume, timeout=600)
        assert [r["round"] for r in rows(run_dir)] == [1, 2, 3]
        assert_same_run(run_dir, simulator_run(tmp_path, "deployed", "algorithm.name=scaffold", "rounds=3"))

        # --- an outsider: the CA certificate, the public address, its own key pair
        op_home = tmp_path / "flwr_home"
        runs = flwr_json(["ls", "my-superlink"], op_home, env)["runs"]
        run_id = str(runs[0]["run-id"])
        nodes_before = flwr_json(["supernode", "list", "my-superlink"], op_home, env)["nodes"]
        assert len(nodes_before) == num
        home = tmp_path / "outsider"
        home.mkdir()
        ca = tmp_path / "certs" / "ca.crt"
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "public"\n'
            f'[superlink.public]\naddress = "{PUBLIC}:{port}"\nroot-certificates = "{ca}"\n'
            f'[superlink.operator-address]\naddress = "127.0.0.1:{port}"\nroot-certificates = "{ca}"\n')
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(home / "key")], check=True)

        ls = flwr(["ls", "public"], home, env)
        assert ls.returncode != 0 and run_id not in ls.stdout + ls.stderr
        log = flwr(["log", run_id, "public", "--show"], home, env)
        assert log.returncode != 0 and "summary" not in log.stdout
        reg = flwr(["supernode", "register", str(home / "key.pub"), "public"], home, env)
        assert reg.returncode != 0
        # the Runtime API (where a ServerApp process fetches its task): 403 on the public address
        ctx = ssl.create_default_context(cafile=str(ca))
        conn = http.client.HTTPSConnection(PUBLIC, port, context=ctx, timeout=10)
        conn.request("POST", "/v1/runtime/acquire-task", body=b"", headers={"content-type": "application/protobuf"})
        assert conn.getresponse().status == 403
        # a SuperNode with an unregistered key: refused, never listed
        with open(home / "supernode.log", "w") as out:  # its own session: its children are ended with it
            intruder = subprocess.Popen([str(BIN / "flower-supernode"), "--superlink", f"{PUBLIC}:{port}",
                                         "--root-certificates", str(ca), "--auth-supernode-private-key",
                                         str(home / "key"), "--port", str(free_port()), "--max-retries", "2",
                                         "--max-wait-time", "20", "--node-config", "partition-id=0 num-partitions=3"],
                                        env=env, stdout=out, stderr=subprocess.STDOUT, cwd=home, start_new_session=True)
            try:
                rc = intruder.wait(timeout=patience(120))
            finally:
                try:
                    os.killpg(intruder.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        assert rc != 0, (home / "supernode.log").read_text()[-2000:]
        nodes_after = flwr_json(["supernode", "list", "my-superlink"], op_home, env)["nodes"]
        assert len(nodes_after) == num
        # the same request on the operator's address works: the guard, not the setup, refused it
        ok = flwr(["ls", "operator-address"], home, env)
        assert ok.returncode == 0 and run_id in ok.stdout
    finally:
        sh.stop()


def test_the_guard_forwards_the_fleet_api_and_refuses_the_rest():
    """``mmfl flower superlink``'s proxy (mmfl/flower/superlink.py) in process, in front of a
    stand-in SuperLink: the Fleet API is forwarded from any address (path, query, headers and
    body unchanged; the answer streamed back), the Control and Runtime APIs only from an
    operator address (else 403, never forwarded); Flower's --host/--port go to the proxy."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from mmfl.flower.superlink import Forward, OperatorOnly, _split_args

    seen = []

    class Link(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append(self.path)
            out = f"{self.path}|{self.headers['content-type']}|".encode() + body
            self.send_response(200)
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    link = ThreadingHTTPServer(("127.0.0.1", 0), Link)
    threading.Thread(target=link.serve_forever, daemon=True).start()
    fwd = Forward(f"http://127.0.0.1:{link.server_address[1]}", verify=False)
    app = OperatorOnly(fwd)

    async def call(path: str, local: str, query: bytes = b"") -> tuple[int, bytes]:
        msgs, sent = [{"type": "http.request", "body": b"\x00payload", "more_body": False}], []

        async def receive():
            return msgs.pop(0) if msgs else {"type": "http.disconnect"}

        async def send(m):
            sent.append(m)

        scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": query,
                 "headers": [(b"content-type", b"application/protobuf"), (b"host", b"public:9093")],
                 "server": (local, 9093)}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    async def calls():
        try:
            return [await call("/v1/fleet/pull-messages", PUBLIC, b"a=1"),
                    await call("/v1/control/list-runs", PUBLIC), await call("/v1/runtime/acquire-task", PUBLIC),
                    await call("/v1/control/list-runs", "127.0.0.1"), await call("/v1/control/list-runs", "::ffff:127.0.0.1")]
        finally:
            await fwd.client.aclose()

    try:
        fleet, control, runtime, local, mapped = asyncio.run(calls())
    finally:
        link.shutdown()
    assert fleet == (200, b"/v1/fleet/pull-messages?a=1|application/protobuf|\x00payload")
    assert control[0] == 403 and runtime[0] == 403 and b"operator addresses" in control[1]
    assert local == mapped == (200, b"/v1/control/list-runs|application/protobuf|\x00payload")
    assert seen == ["/v1/fleet/pull-messages?a=1", "/v1/control/list-runs", "/v1/control/list-runs"]
    opts, rest = _split_args(["--insecure", "--host", "0.0.0.0", "--port=9093", "--enable-supernode-auth"])
    assert (opts["host"], opts["port"], opts["insecure"]) == ("0.0.0.0", 9093, True)
    assert rest == ["--insecure", "--enable-supernode-auth"]
