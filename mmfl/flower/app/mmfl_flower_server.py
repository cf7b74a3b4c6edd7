"""Flower app entry point: the ServerApp (see pyproject.toml beside this file)."""

from mmfl.flower.server_app import make_server_app

app = make_server_app()
