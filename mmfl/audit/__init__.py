"""Leakage audit: what an honest-but-curious server learns from what it received
(``mmfl audit RUN``; :mod:`mmfl.audit.audit`)."""


def add_audit_parser(sub) -> None:
    p = sub.add_parser("audit", help="attack what the server received in a finished run (labels, inversion, "
                                     "shared rows, activations, membership)",
                       description="Replay the server's view of a run's first rounds and run standard attacks "
                                   "on it. The auxiliary data of the probes is the run's test split. "
                                   "docs/security.md, 'What the server learns'.")
    p.add_argument("run", help="a finished run folder")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the server's view to replay (default 1)")
    p.add_argument("--invert", type=int, default=2, help="clients whose update is inverted (default 2; 0: none)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of each inversion (default 300)")
    p.add_argument("--shadows", type=int, default=32,
                   help="shadow clients per client structure for the label-distribution attack on public-set "
                        "representations (CreamFL; default 32; 0: none)")
    p.add_argument("--json", help="also write the numbers to this JSON file")
