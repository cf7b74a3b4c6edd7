"""The ``mmfl`` command.

    mmfl demo                      the default demo (real data, a few seconds)
    mmfl run CONFIG [--set k=v]    run an experiment (--resume, --overwrite)
    mmfl list [KIND]               algorithms, datasets, partitioners, models + parameters
    mmfl partition [CONFIG]        per-client class counts of a config's partition
    mmfl report RUN [RUN ...]      comparison table (+ plot) of finished runs
    mmfl flower ...                the same config on Flower (simulate, submit, loopback; docs/flower.md)

A user error (bad path, unknown name, invalid value, corrupt file) prints one
line ``mmfl: error: ...`` and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from mmfl.errors import MMFLError

KINDS = ("algorithm", "dataset", "partition", "model")


def _registries():
    from mmfl.algorithms import ALGORITHMS
    from mmfl.data import DATASETS, PARTITIONERS
    from mmfl.models import MODELS

    return {"algorithm": ALGORITHMS, "dataset": DATASETS, "partition": PARTITIONERS, "model": MODELS}


def demo_config_path() -> Path:
    return Path(str(resources.files("mmfl") / "configs" / "demo.toml"))


def _add_config_args(p: argparse.ArgumentParser, required: bool = True):
    p.add_argument("config", nargs=None if required else "?", help="experiment config (TOML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set algorithm.mu=5 --set rounds=20 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmfl", description="Multimodal federated learning.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run an experiment from a TOML config",
                       description="Run an experiment. Config tables: top-level run settings, [data], "
                                   "[partition], [model], [algorithm], [train]; see `mmfl list` for names "
                                   "and parameters. Results go to <output_dir>/<name>/.")
    _add_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue the run folder from its last checkpoint "
                   "(only `rounds` may differ from the saved config)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("demo", help="run the default demo: FedAvg vs MOON on the UCI multi-feature digits")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--no-progress", action="store_true")

    p = sub.add_parser("list", help="list algorithms, datasets, partitioners and models with their parameters")
    p.add_argument("kind", nargs="?", choices=KINDS, help="only this kind")

    p = sub.add_parser("partition", help="print (and plot) the per-client class counts of a partition")
    _add_config_args(p, required=False)
    p.add_argument("--plot", metavar="PNG", help="also write a bar chart")

    p = sub.add_parser("report", help="compare finished runs: table and accuracy plot")
    p.add_argument("runs", nargs="+", help="run folders")
    p.add_argument("--plot", metavar="PNG", help="write the accuracy-per-round plot here")

    from mmfl.flower.cli import add_flower_parser  # imports no Flower: cheap

    add_flower_parser(sub)
    return parser


def cmd_run(args) -> int:
    from mmfl.config import load_config
    from mmfl.engine.runner import Experiment

    cfg = load_config(args.config, args.overrides)
    summary = Experiment(cfg, progress=not args.no_progress).run(resume=args.resume, overwrite=args.overwrite)
    print(json.dumps(summary, indent=2))
    print(f"results: {cfg.run_dir}")
    return 0


def cmd_demo(args) -> int:
    args.config = str(demo_config_path())
    args.resume = False
    args.overwrite = True
    from mmfl.config import load_config
    from mmfl.engine.runner import Experiment
    from mmfl.report import compare

    dirs = []
    for algo in ("fedavg", "moon"):
        overrides = [f"algorithm.name={algo}", f"name=demo-{algo}", *args.overrides]
        if algo == "moon":
            overrides.insert(1, "algorithm.mu=1.0")
        cfg = load_config(args.config, overrides)
        Experiment(cfg, progress=not args.no_progress).run(overwrite=True)
        dirs.append(cfg.run_dir)
    plot = dirs[0].parent / "demo.png"
    print(compare(dirs, plot_path=plot))
    print(f"results: {', '.join(map(str, dirs))}; plot: {plot}")
    return 0


def cmd_list(args) -> int:
    from mmfl.registry import param_doc

    for kind, reg in _registries().items():
        if args.kind and kind != args.kind:
            continue
        print(f"{kind}s ([{'data' if kind == 'dataset' else kind}] name = ...):")
        for e in reg.entries():
            print(f"  {e.name:<16} {e.help}")
            for name, typ, default, help_ in param_doc(e.params):
                d = json.dumps(default) if not isinstance(default, str) or default != "(required)" else default
                print(f"      {name} ({typ}, default {d}){': ' + help_ if help_ else ''}")
        print()
    from mmfl.config import RunConfig, TrainConfig

    if not args.kind:
        for title, cls in (("run settings (top level)", RunConfig), ("[train]", TrainConfig)):
            print(f"{title}:")
            for name, typ, default, help_ in param_doc(cls):
                print(f"      {name} ({typ}, default {json.dumps(default)}){': ' + help_ if help_ else ''}")
            print()
    return 0


def cmd_partition(args) -> int:
    from mmfl.config import load_config
    from mmfl.data.partition import partition_summary, plot_partition
    from mmfl.engine.runner import build_federation

    cfg = load_config(args.config or demo_config_path(), args.overrides)
    fed = build_federation(cfg)
    counts = fed.class_counts()
    print(f"{cfg.data.name}: {cfg.partition.name} partition over {fed.num_clients} clients")
    print(partition_summary(counts, fed.meta.class_names))
    if args.plot:
        plot_partition(counts, args.plot)
        print(f"plot: {args.plot}")
    return 0


def cmd_report(args) -> int:
    from mmfl.report import compare

    print(compare(args.runs, plot_path=args.plot))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def cmd_flower(args) -> int:
    from mmfl.flower.cli import main as flower_main

    return flower_main(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"run": cmd_run, "demo": cmd_demo, "list": cmd_list,
               "partition": cmd_partition, "report": cmd_report, "flower": cmd_flower}[args.command]
    try:
        return handler(args)
    except MMFLError as e:
        print(f"mmfl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mmfl: interrupted (the last completed round is checkpointed; continue with --resume)",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
