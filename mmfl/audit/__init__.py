"""Leakage audit: what an honest-but-curious server learns from what it received
(``mmfl audit RUN``; :mod:`mmfl.audit.audit`)."""
