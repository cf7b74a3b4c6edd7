"""``mmfl flower ...``: run an mmfl config on Flower (see docs/flower.md).

    mmfl flower simulate CONFIG [--set k=v] [--num-supernodes N] [--gpus-per-client G]
                                                                     Flower's simulation engine (Ray)
    mmfl flower submit CONFIG --superlink HOST:PORT [--root-certificates CA | --insecure]
                                                                     a run on a real deployment
    mmfl flower loopback CONFIG [--num-supernodes N] [--resume]      SuperLink + SuperNodes on 127.0.0.1
    mmfl flower superlink [--operator-address IP] -- FLOWER-SUPERLINK-ARGS
                                                                     flower-superlink, Control/Runtime APIs
                                                                     on the operator's addresses only
    mmfl flower run-config CONFIG -o FILE                            the --run-config file of `flwr run`
    mmfl flower app                                                  the Flower app folder `flwr run` takes
    mmfl flower new DIR CONFIG [--set k=v] [--publisher ACCOUNT]     a stand-alone Flower app (Hub layout)

This module imports nothing heavy: Flower is imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from mmfl.errors import MMFLError


def add_flower_parser(sub) -> None:
    p = sub.add_parser("flower", help="run a config on Flower: simulation engine, loopback or real deployment",
                       description="Run an mmfl config, unchanged, on Flower (needs mmfl[flower]); see docs/flower.md.")
    fsub = p.add_subparsers(dest="flower_command", required=True)

    def config_args(q):
        q.add_argument("config", help="experiment config (TOML), as for `mmfl run`")
        q.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value (repeatable)")
        q.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)  # refused: simulation only

    q = fsub.add_parser("simulate", help="Flower's simulation engine (Ray backend) on a local SuperLink")
    config_args(q)
    q.add_argument("--num-supernodes", type=int, default=0, help="virtual SuperNodes (default: one per client)")
    q.add_argument("--ray-cpus", type=int, default=0, help="CPUs Ray may use (default: all)")
    q.add_argument("--cpus-per-client", type=float, default=1.0,
                   help="CPUs per ClientApp actor, a whole number (default 1)")
    q.add_argument("--gpus-per-client", type=float, default=None, metavar="G",
                   help="GPUs per ClientApp actor, e.g. 0.25: four actors share a GPU (default: the config's "
                        "gpus_per_client, 0 = none)")
    q.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    q.add_argument("--verbose", action="store_true", help="Flower's and Ray's logs")

    q = fsub.add_parser("submit", help="submit a run to a SuperLink (flwr run of mmfl's Flower app)")
    config_args(q)
    q.add_argument("--superlink", metavar="HOST:PORT", help="the SuperLink's address")
    q.add_argument("--root-certificates", metavar="CA.crt", help="CA certificate that signed the SuperLink's TLS cert")
    q.add_argument("--insecure", action="store_true", help="no TLS (loopback tests only)")
    q.add_argument("--connection", metavar="NAME",
                   help="use this SuperLink connection of your Flower configuration ($FLWR_HOME/config.toml) "
                        "instead of --superlink")
    q.add_argument("--overwrite", action="store_true", help="replace an existing run folder on the SuperLink side")
    q.add_argument("--resume", action="store_true",
                   help="continue the run folder from its last intact checkpoint (SuperNodes need a state-dir)")
    q.add_argument("--no-wait", action="store_true", help="return once the run started")

    q = fsub.add_parser("loopback", help="start a SuperLink and SuperNodes on 127.0.0.1, run, stop them")
    config_args(q)
    q.add_argument("--num-supernodes", type=int, default=0, help="SuperNodes (default: one per client)")
    q.add_argument("--workdir", help="where the processes' logs go (default: a temporary folder)")
    q.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    q.add_argument("--resume", action="store_true", help="continue the run folder from its last intact checkpoint")

    q = fsub.add_parser("run-config", help="write the --run-config file for `flwr run <app folder> ...`")
    config_args(q)
    q.add_argument("-o", "--output", required=True, help="file to write")
    q.add_argument("--overwrite", action="store_true", help="the run replaces an existing run folder")

    fsub.add_parser("app", help="print the Flower app folder (for `flwr run`)")

    q = fsub.add_parser("new", help="write a stand-alone Flower app (Flower Hub layout) running CONFIG: "
                                    "`flwr run DIR`, `flwr app publish DIR`")
    q.add_argument("dir", help="the app folder to create (new or empty); its name is the app's name")
    config_args(q)
    q.add_argument("--name", help="the app's name (default: the folder's name)")
    q.add_argument("--publisher", default="mmfl", help="the [tool.flwr.app] publisher (your Flower account)")

    q = fsub.add_parser("superlink", help="flower-superlink whose Control and Runtime APIs answer only on "
                                          "the operator's addresses (see docs/flower.md)")
    q.add_argument("--operator-address", action="append", default=[], metavar="IP",
                   help="a local address of this machine on which the Control and Runtime APIs answer "
                        "(repeatable; default 127.0.0.1 and ::1); elsewhere only the Fleet API")
    q.add_argument("flower_args", nargs=argparse.REMAINDER, help="-- then flower-superlink's arguments")


REFUSE_REFERENCE = ("references train on pooled data and run in the simulation only (docs/reference.md): "
                    "use mmfl run CONFIG --reference")


def _cfg(args):
    from mmfl.api import configure

    if getattr(args, "reference", False):
        raise MMFLError(f"--reference: {REFUSE_REFERENCE}")
    cfg = configure(args.config, args.overrides)
    if cfg.reference is not None and cfg.reference.enabled:
        raise MMFLError(f"[reference]: {REFUSE_REFERENCE}; remove the table or set reference.enabled = false")
    return cfg


def _check_fresh(cfg, overwrite: bool) -> None:
    d = cfg.run_dir
    if d.exists() and any(d.iterdir()) and not overwrite:
        raise MMFLError(f"{d}: run folder exists; use --overwrite to replace it, or --set name=<new name>")
    if overwrite and d.is_dir() and any(p.name != ".lock" for p in d.iterdir()):
        from mmfl.engine import runfiles

        runfiles.check_overwrite(d)  # here, before Flower starts: only what an mmfl run wrote


def main(args) -> int:
    import mmfl.flower  # noqa: F401  (Flower's telemetry off unless asked for)

    import importlib.util

    if importlib.util.find_spec("flwr") is None:  # without importing it (seconds): errors below come fast
        raise MMFLError('Flower is not installed: pip install -e ".[flower]" (flwr[simulation]>=1.41,<1.43)')
    cmd = args.flower_command
    if cmd == "new":  # needs no Flower here: the app is files
        from mmfl.flower.hub import write_app

        dest = write_app(_cfg(args), Path(args.dir), name=args.name, publisher=args.publisher)
        print(f"Flower app: {dest}\nrun: cd {dest} && pip install -e . && flwr run .   (see {dest / 'README.md'})")
        return 0
    if cmd == "app":
        from mmfl.flower import deploy

        print(deploy.APP_DIR)
        return 0
    if cmd == "superlink":
        from mmfl.flower.superlink import run_superlink

        return run_superlink(args.flower_args, args.operator_address)
    if cmd == "simulate" and args.gpus_per_client is not None:  # the flag overrides the config's value
        args.overrides = [*args.overrides, f"gpus_per_client={args.gpus_per_client!r}"]
    cfg = _cfg(args)  # a missing config file is said before Flower is imported
    from mmfl.flower import deploy

    if cmd == "run-config":
        deploy.write_run_config(cfg, Path(args.output), args.overwrite)
        print(f"run config: {args.output}\nsubmit: flwr run {deploy.APP_DIR} <connection> --run-config {args.output}")
        return 0
    if cmd == "simulate":
        from mmfl.flower.simulation import simulate

        _check_fresh(cfg, args.overwrite)
        summary = simulate(cfg, num_supernodes=args.num_supernodes or None, overwrite=args.overwrite,
                           ray_cpus=args.ray_cpus or None, cpus_per_client=args.cpus_per_client, verbose=args.verbose)
        print(json.dumps(summary, indent=2))
        print(f"results: {cfg.run_dir}")
        return 0
    if cmd == "loopback":
        return _loopback(args, cfg, deploy)
    return _submit(args, cfg, deploy)


def _loopback(args, cfg, deploy) -> int:
    from mmfl.config import apply_overrides, resolve
    from mmfl.flower.simulation import count_clients

    cfg = resolve(apply_overrides(cfg.to_dict(), [f"output_dir={json.dumps(str(Path(cfg.run.output_dir).resolve()))}"]))
    if args.resume and args.overwrite:
        raise MMFLError("loopback: --resume and --overwrite exclude each other")
    if not args.resume:
        _check_fresh(cfg, args.overwrite)
    n = args.num_supernodes or count_clients(cfg)
    tmp = None if args.workdir else tempfile.mkdtemp(prefix="mmfl-flower-")
    workdir = Path(args.workdir or tmp)
    try:  # the SuperNodes keep client state in the run folder, where a resume finds it
        with deploy.LocalDeployment(n, workdir, state_dir=cfg.run_dir / "node_state") as dep:
            run_id = dep.submit(cfg, overwrite=args.overwrite, resume=args.resume)
            print(f"run {run_id}: {n} SuperNodes on 127.0.0.1:{dep.port} (logs in {workdir})", flush=True)
            status = dep.wait(run_id, done_file=cfg.run_dir / "summary.json")
            if status != "finished:completed":
                print(dep.run_log(run_id)[-3000:], file=sys.stderr)
                raise MMFLError(f"run {run_id} {status} (SuperLink log: {workdir / 'superlink.log'})")
    finally:
        from mmfl.engine import runfiles

        runfiles.note(cfg.run_dir / "node_state", owned_dir=True, depth=1)  # the SuperNodes' client state
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print((cfg.run_dir / "summary.json").read_text())
    print(f"results: {cfg.run_dir}")
    return 0


def _submit(args, cfg, deploy) -> int:
    import os

    if args.connection:
        home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
        conn, tmp = args.connection, None
    else:
        if not args.superlink:
            raise MMFLError("submit: give --superlink HOST:PORT (or --connection NAME)")
        if not args.insecure and not args.root_certificates:
            raise MMFLError("submit: give --root-certificates CA.crt (TLS), or --insecure for a loopback test")
        tmp = tempfile.mkdtemp(prefix="mmfl-flwr-home-")
        home, conn = Path(tmp), "mmfl"
        deploy.write_connection(home, conn, args.superlink, args.insecure, args.root_certificates)
    try:
        if args.resume and args.overwrite:
            raise MMFLError("submit: --resume and --overwrite exclude each other")
        run_id = deploy.submit(cfg, conn, home, overwrite=args.overwrite, resume=args.resume)
        print(f"run {run_id} started; results go to {cfg.run_dir} on the SuperLink's machine", flush=True)
        if args.no_wait:
            return 0
        status = deploy.wait(run_id, conn, home)
        print(deploy.run_log(run_id, conn, home)[-4000:])
        if status != "finished:completed":
            raise MMFLError(f"run {run_id} {status}")
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
