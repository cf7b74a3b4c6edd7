"""Flower app entry point: the ClientApp (see pyproject.toml beside this file).

A module of its own so that the process Flower starts for each client message
does not import the server side.
"""

from mmfl.flower.client_app import make_client_app

app = make_client_app()
