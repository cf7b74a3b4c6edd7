"""``mmfl flower superlink [--operator-address A ...] -- FLOWER-SUPERLINK-ARGS``: Flower's
SuperLink, with its Control and Runtime APIs answered only on the operator's addresses.

Flower (1.41, 1.42) serves three APIs on the SuperLink's one HTTPS port: the Fleet API (the
SuperNodes; with ``--enable-supernode-auth`` only registered keys get in), the Control API
(``flwr run/ls/log/stop``, ``flwr supernode register/list/unregister``) and the Runtime API
(the ServerApp's process fetches its task and the run's config there, and sends the
clients' messages). Open-source Flower has no account authentication for the Control API
(its OIDC plugin is Flower Enterprise only) and, in the default subprocess isolation, no
secret on the Runtime API: whoever reaches the port and trusts its certificate (the CA
certificate is public: every SuperNode has it) can list runs, read their logs, register
a SuperNode key of their own, and ask for a ServerApp's task. ``--port`` cannot split
them: the deprecated ``--control-api-address`` is ignored.

This command runs Flower's own ``flower-superlink`` (its public entry point, with the same
arguments) bound to ``127.0.0.1`` on a free internal port, and in front of it, on the
``--host``/``--port`` it was given, a reverse proxy of mmfl's (:class:`Forward`, served by
uvicorn with the same TLS certificate): a request for anything but the Fleet API
(``/v1/fleet/...``) is answered ``403`` unless it arrived on one of the operator addresses
(the SuperLink machine's local address the connection was made to; default ``127.0.0.1``
and ``::1``, :class:`OperatorOnly`); the rest is forwarded unchanged to Flower's SuperLink
over TLS, checked against ``--ssl-ca-certfile``. So SuperNodes dial the public address; the
operator runs ``flwr``/``mmfl flower submit`` on the SuperLink machine, or through an SSH
tunnel (``ssh -L 9093:127.0.0.1:9093 superlink-host``), which arrives on ``127.0.0.1``; the
ServerApp's processes, which Flower starts on this machine, dial Flower's internal port on
``127.0.0.1`` directly. The command ends when Flower's SuperLink does (with its exit code),
and ends it on ``Ctrl-C``/``SIGTERM``.
"""

from __future__ import annotations

import ipaddress
import os
import sys

from mmfl.errors import MMFLError

OPERATOR_ADDRESSES = ("127.0.0.1", "::1")
PUBLIC_PREFIXES = ("/v1/fleet/",)  # what SuperNodes use; everything else is the operator's


def _norm(host: str | None) -> str | None:
    if not host:
        return None
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


class OperatorOnly:
    """ASGI middleware: requests outside ``PUBLIC_PREFIXES`` are refused (403) unless the
    connection was made to one of ``addresses`` (its local address, ``scope["server"]``)."""

    def __init__(self, app, addresses=OPERATOR_ADDRESSES):
        self.app = app
        self.addresses = {_norm(a) for a in addresses}

    def allowed(self, scope) -> bool:
        if scope.get("path", "").startswith(PUBLIC_PREFIXES):
            return True
        server = scope.get("server") or (None, None)
        return _norm(server[0]) in self.addresses

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not self.allowed(scope):
            body = (b"mmfl: the SuperLink answers its Control and Runtime APIs only on its operator "
                    b"addresses; from elsewhere only the Fleet API is reachable\n")
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "websocket" and not self.allowed(scope):
            await send({"type": "websocket.close", "code": 1008})
            return
        await self.app(scope, receive, send)


HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
       b"transfer-encoding", b"upgrade"}  # hop-by-hop headers (RFC 9110): not forwarded


async def _plain(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Forward:
    """ASGI app: every HTTP request, forwarded to ``upstream`` (Flower's SuperLink); the answer
    streamed back as it comes (``flwr log --stream``)."""

    def __init__(self, upstream: str, verify=True):
        self.upstream = upstream.rstrip("/")
        self.verify = verify
        self.client = None

    def _client(self):
        import httpx

        if self.client is None:  # in the server's event loop
            self.client = httpx.AsyncClient(verify=self.verify, timeout=httpx.Timeout(None, connect=10.0))
        return self.client

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    if self.client is not None:
                        await self.client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":  # Flower's SuperLink serves no websocket
            await send({"type": "websocket.close", "code": 1008})
            return
        import httpx

        body, more = bytearray(), True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP | {b"host", b"content-length"}]
        client = self._client()
        try:
            req = client.build_request(scope["method"], self.upstream + path + (f"?{query}" if query else ""),
                                       headers=headers, content=bytes(body))
            resp = await client.send(req, stream=True)
        except httpx.HTTPError as e:
            await _plain(send, 502, f"mmfl: Flower's SuperLink behind this port did not answer: {e}\n".encode())
            return
        try:
            await send({"type": "http.response.start", "status": resp.status_code,
                        "headers": [(k, v) for k, v in resp.headers.raw if k.lower() not in HOP]})
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await resp.aclose()


def _split_args(flower_args: list[str]) -> tuple[dict, list[str]]:
    """flower-superlink's ``--host``/``--port``/TLS options (Flower 1.42's defaults where absent),
    and its arguments without ``--host`` and ``--port``."""
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--host", default="127.0.0.1")  # flower-superlink's defaults
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--insecure", action="store_true")
    for name in ("--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certfile"):
        p.add_argument(name)
    try:
        opts, _ = p.parse_known_args(flower_args)
    except SystemExit:
        raise MMFLError("flower-superlink arguments: --port takes a number") from None
    rest, skip = [], False
    for a in flower_args:
        if skip:
            skip = False
        elif a in ("--host", "--port"):
            skip = True
        elif not a.startswith(("--host=", "--port=")):
            rest.append(a)
    return vars(opts), rest


def run_superlink(flower_args: list[str], operator_addresses: list[str] | None = None) -> int:
    """``flower-superlink flower_args`` behind :class:`OperatorOnly` (blocks); its exit code."""
    import signal
    import ssl
    import subprocess
    import threading

    import uvicorn

    from mmfl.flower.deploy import BIN, free_port

    addresses = tuple(operator_addresses or OPERATOR_ADDRESSES)
    for a in addresses:
        try:
            ipaddress.ip_address(a)
        except ValueError:
            raise MMFLError(f"--operator-address {a!r}: expected an IP address of this machine") from None
    flower_args = [a for a in flower_args if a != "--"]
    if any(a.split("=")[0] == "--control-api-address" for a in flower_args):
        raise MMFLError("--control-api-address: Flower ignores it (one port serves every API); "
                        "use --operator-address")
    opts, rest = _split_args(flower_args)
    tls = not opts["insecure"]
    if tls and not (opts["ssl_certfile"] and opts["ssl_keyfile"] and opts["ssl_ca_certfile"]):
        raise MMFLError("flower-superlink arguments: give --ssl-certfile, --ssl-keyfile and --ssl-ca-certfile "
                        "(TLS), or --insecure for a loopback test")
    internal = free_port()
    env = {**os.environ, "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}  # its flower-superexec
    child = subprocess.Popen([str(BIN / "flower-superlink"), *rest, "--host", "127.0.0.1", "--port", str(internal)],
                             env=env)
    try:
        _wait_port(child, internal)
        upstream = f"{'https' if tls else 'http'}://127.0.0.1:{internal}"
        verify = ssl.create_default_context(cafile=opts["ssl_ca_certfile"]) if tls else False
        app = OperatorOnly(Forward(upstream, verify), addresses=addresses)
        config = uvicorn.Config(app, host=opts["host"], port=opts["port"], log_level="warning", access_log=False,
                                ssl_certfile=opts["ssl_certfile"] if tls else None,
                                ssl_keyfile=opts["ssl_keyfile"] if tls else None)
        server = uvicorn.Server(config)

        def watch() -> None:  # Flower's SuperLink ended: so does the proxy
            child.wait()
            server.should_exit = True

        threading.Thread(target=watch, daemon=True).start()
        print(f"mmfl: Control and Runtime APIs answer only on {', '.join(addresses)}; "
              "other addresses reach the Fleet API only", file=sys.stderr, flush=True)
        server.run()
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return child.returncode if child.returncode and child.returncode > 0 else 0


def _wait_port(child, port: int, timeout: float = 120) -> None:
    """Until Flower's SuperLink listens on ``port``; its exit (bad arguments, ...) is an error."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise MMFLError(f"flower-superlink exited with code {child.returncode} (its message is above)")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise MMFLError(f"flower-superlink did not open its port within {timeout:.0f}s")
