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

This command runs ``flower-superlink`` (the same code, the same arguments) with one ASGI
middleware in front of Flower's own: a request for anything but the Fleet API
(``/v1/fleet/...``) is answered ``403`` unless it arrived on one of the operator addresses
(the SuperLink machine's local address the connection was made to; default
``127.0.0.1`` and ``::1``). So SuperNodes dial the public address; the operator runs
``flwr``/``mmfl flower submit`` on the SuperLink machine, or through an SSH tunnel
(``ssh -L 9093:127.0.0.1:9093 superlink-host``), which arrives on ``127.0.0.1``; the
ServerApp's processes, which Flower starts on this machine, dial ``127.0.0.1`` too.
"""

from __future__ import annotations

import ipaddress
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


def run_superlink(flower_args: list[str], operator_addresses: list[str] | None = None) -> None:
    """``flower-superlink flower_args`` with :class:`OperatorOnly` in front (blocks)."""
    from starlette.middleware import Middleware

    from mmfl.flower import _flwr_private

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
    try:
        flower_superlink = _flwr_private.patch_superlink(Middleware(OperatorOnly, addresses=addresses))
    except (ImportError, RuntimeError) as e:
        from importlib.metadata import version

        raise MMFLError(f"mmfl flower superlink cannot wrap flwr {version('flwr')}'s SuperLink ({e}); "
                        "mmfl supports flwr 1.41 and 1.42") from None
    print(f"mmfl: Control and Runtime APIs answer only on {', '.join(addresses)}; "
          "other addresses reach the Fleet API only", file=sys.stderr, flush=True)
    sys.argv = ["flower-superlink", *flower_args]
    flower_superlink()
