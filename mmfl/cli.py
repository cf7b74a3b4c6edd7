"""The ``mmfl`` command.

    mmfl --version                 the installed version
    mmfl demo                      the default demo (real data, a few seconds)
    mmfl run CONFIG [--set k=v]    run an experiment (--resume, --overwrite; --reference: centralized,
                                   local-only and scikit-learn references beside it, docs/reference.md)
    mmfl list [KIND]               algorithms, datasets, partitioners, modality assigners,
                                   models + parameters; FedCMI's case presets
    mmfl partition [CONFIG]        per-client class counts of a config's partition (and who
                                   holds which modalities)
    mmfl report RUN [RUN ...]      comparison table (+ plot; one run: RUN/accuracy.png) of finished runs
    mmfl flower ...                the same config on Flower (simulate, submit, loopback; docs/flower.md)
    mmfl vqa RUN --root DIR        VQA accuracy of a finished CreamFL-style run's server model (docs/vqa.md)
    mmfl bench GRID.toml           run a benchmark grid's missing runs in parallel, write its tables
                                   (--tables-only, --workers N, --seeds ...; docs/benchmarks.md)
    mmfl sweep GRID.toml           a grid of methods x settings x seeds (parallel, resumable) and
                                   its mean ± std table and plot (--workers N, --dry-run; docs/sweep.md)
    mmfl audit RUN                 attack what the server received in a run (labels, inversion, membership)
    mmfl convert A.ts [B.ts] OUT   UEA/UCR .ts time series -> a manifest, cut into modalities
                                   (channels, time windows, derived channels; docs/data.md)

``mmfl run`` and ``mmfl demo`` are a thin layer over the Python API (:mod:`mmfl.api`,
docs/api.md). Heavy modules (torch, Flower, ...) are imported by the command that needs
them, after its arguments and files are checked: ``--help``, ``--version`` and a missing
file answer at once.

A user error (bad path, unknown name, invalid value, corrupt file) and a file
system error (full disk, unwritable output_dir) print one line ``mmfl: error: ...``
and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from mmfl.errors import ConfigError, one_line

KINDS = ("algorithm", "dataset", "partition", "modality", "model", "aggregation")
# kind -> (heading, config table)
_HEADINGS = {"algorithm": ("algorithms", "algorithm"), "dataset": ("datasets", "data"),
             "partition": ("partitions", "partition"), "modality": ("modality assigners", "modalities"),
             "model": ("models", "model"), "aggregation": ("aggregation rules", "algorithm")}


def _registries():
    from mmfl.api import registries

    return registries()


def _case_lines() -> list[str]:
    """FedCMI's settings A-D (:data:`mmfl.data.modality.CASES`), one line each."""
    from mmfl.data.modality import CASES

    def table(t: dict) -> str:
        return ", ".join(f"{k} = {json.dumps(v)}" for k, v in t.items())

    lines = ['cases (top-level case = "A".."D": presets of [partition] and [modalities]):']
    for name, preset in CASES.items():
        lines.append(f"  {name}  " + "; ".join(f"[{kind}] {table(t)}" for kind, t in preset.items()))
    return lines


def demo_config_path() -> Path:
    return Path(str(resources.files("mmfl") / "configs" / "demo.toml"))


def _add_config_args(p: argparse.ArgumentParser, required: bool = True):
    p.add_argument("config", nargs=None if required else "?", help="experiment config (TOML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set algorithm.mu=5 --set rounds=20 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmfl", description="Multimodal federated learning.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run an experiment from a TOML config",
                       description="Run an experiment. Config tables: top-level run settings (and "
                                   "case = \"A\"..\"D\"), [data], [partition], [modalities], [model], "
                                   "[algorithm], [train]; see `mmfl list` for names and parameters. "
                                   "Results go to <output_dir>/<name>/.")
    _add_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue the run folder from its last checkpoint "
                   "(only `rounds` may differ from the saved config)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plot", action="store_true", help="draw accuracy.png in the run folder when the run "
                   "finishes (off by default: matplotlib costs 0.5-1 s; `mmfl report RUN` draws it later)")
    p.add_argument("--reference", action="store_true", help="also train references on the same split and "
                   "features: centralized, local-only, scikit-learn logistic regression / random forest (pooled "
                   "data, simulation only; = a [reference] table, docs/reference.md)")
    p.add_argument("--track", action="append", choices=("tensorboard", "mlflow", "wandb"), help="send the run to "
                   "this offline tracker (repeatable; = [tracking] backends, docs/tracking.md)")

    p = sub.add_parser("demo", help="run the default demo: FedAvg vs MOON on the UCI multi-feature digits")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--no-progress", action="store_true")

    p = sub.add_parser("list", help="list algorithms, datasets, partitioners, modality assigners and models "
                                    "with their parameters")
    p.add_argument("kind", nargs="?", choices=KINDS, help="only this kind")
    p.add_argument("--capabilities", action="store_true",
                   help="what each algorithm supports (batched, streaming, secagg, flower, dp modes, ...), one line each")

    p = sub.add_parser("partition", help="print (and plot) the per-client class counts of a partition, the "
                                         "modalities each client holds and what the simulation removed")
    _add_config_args(p, required=False)
    p.add_argument("--plot", metavar="PNG", help="also write a bar chart")

    p = sub.add_parser("report", help="compare finished runs: table and accuracy plot")
    p.add_argument("runs", nargs="+", help="run folders")
    p.add_argument("--plot", metavar="PNG", help="write the accuracy-per-round plot here (default with one "
                   "run: RUN/accuracy.png)")

    from mmfl.flower.cli import add_flower_parser  # imports no Flower: cheap

    add_flower_parser(sub)
    from mmfl.vqa_eval import add_vqa_parser  # imports no torch: cheap

    add_vqa_parser(sub)
    from mmfl.convert import add_convert_parser  # imports no numpy: cheap

    add_convert_parser(sub)
    from mmfl.audit import add_audit_parser  # imports no numpy: cheap

    add_audit_parser(sub)
    from mmfl.bench_args import add_bench_parser  # imports no numpy: cheap

    add_bench_parser(sub)
    p = sub.add_parser("sweep", help="a grid of methods x settings x seeds: parallel, resumable, mean ± std table",
                       description="Run the runs of a sweep file that are not finished (worker processes, one "
                                   "torch thread each), then write a mean ± std table over seeds (results.md, "
                                   "results.csv) and a plot (results.png) next to the runs. Format: docs/sweep.md.")
    p.add_argument("grid", help="sweep file (TOML): base, seeds, [axes]; or a benchmark grid")
    p.add_argument("--workers", type=int, help="worker processes (default: the file's workers, else 1)")
    p.add_argument("--out", help="folder of the runs and tables (default: <grid stem>/ next to the grid file)")
    p.add_argument("--dry-run", action="store_true", help="list the planned runs (every config checked), run nothing")
    p.add_argument("--tables-only", action="store_true", help="run nothing; rebuild the tables from finished runs")
    return parser


class _VersionAction(argparse.Action):
    """``--version``: the version is looked up only when asked for (importlib.metadata: ~0.1 s)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"mmfl {_version()}")
        parser.exit()


def _version() -> str:
    """The installed distribution's version (mmfl.__version__ where it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mmfl")
    except PackageNotFoundError:
        from mmfl._version import __version__

        return __version__


def summary_json(summary: dict) -> str:
    """The run summary as JSON, one key per line (class-wise lists stay on their line)."""
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in summary.items()) + "\n}"


def cmd_run(args) -> int:
    import mmfl.api as api

    track = [f"tracking.backends={json.dumps(args.track)}"] if getattr(args, "track", None) else []
    res = api.run(args.config, set=args.overrides + track, resume=args.resume, overwrite=args.overwrite,
                  progress=not args.no_progress, reference=True if args.reference else None)
    print(summary_json(res.summary))
    from mmfl.report import reference_table

    table = reference_table(res.run_dir) if (args.reference or res.config.reference is not None) else None
    if table is not None:  # the references beside the federated result (mmfl.reference)
        print(table)
    if getattr(args, "plot", False):
        print(f"plot: {res.plot()}")
    print(f"results: {res.run_dir}")
    return 0


def cmd_demo(args) -> int:
    import mmfl.api as api
    from mmfl.report import compare

    dirs = []
    for algo in ("fedavg", "moon"):
        overrides = [f"algorithm.name={algo}", f"name=demo-{algo}", *args.overrides]
        if algo == "moon":
            overrides.insert(1, "algorithm.mu=1.0")
        dirs.append(api.run(demo_config_path(), set=overrides, overwrite=True, progress=not args.no_progress).run_dir)
    plot = dirs[0].parent / "demo.png"
    print(compare(dirs, plot_path=plot))
    print(f"results: {', '.join(map(str, dirs))}; plot: {plot}")
    return 0


def capability_lines() -> list[str]:
    """``mmfl list algorithm --capabilities``: each algorithm's declared capabilities, one line."""
    from mmfl.algorithms import ALGORITHMS
    from mmfl.algorithms.capabilities import capabilities

    return ["algorithm capabilities (docs/architecture.md, \"Capabilities\"):",
            *(f"  {n:<16} {capabilities(ALGORITHMS.get(n).factory).flags()}" for n in ALGORITHMS.names())]


def cmd_list(args) -> int:
    from mmfl.registry import param_doc

    if getattr(args, "capabilities", False):
        if args.kind not in (None, "algorithm"):
            raise ConfigError(f"--capabilities: only algorithms declare capabilities, not {args.kind!r}")
        print("\n".join(capability_lines()))
        return 0
    for kind, reg in _registries().items():
        if args.kind and kind != args.kind:
            continue
        heading, table = _HEADINGS[kind]
        params = "; its parameters: aggregation_params = {...}" if kind == "aggregation" else ""
        print(f"{heading} ([{table}] {'aggregation' if kind == 'aggregation' else 'name'} = ...{params}):")
        for e in reg.entries():
            print(f"  {e.name:<16} {e.help}")
            for name, typ, default, help_ in param_doc(e.params):
                d = json.dumps(default) if not isinstance(default, str) or default != "(required)" else default
                print(f"      {name} ({typ}, default {d}){': ' + help_ if help_ else ''}")
        print()
        if kind == "modality":
            print("\n".join(_case_lines()))
            print()
    from mmfl.schema import ReferenceConfig, RunConfig, TrackingConfig, TrainConfig

    if not args.kind:
        for title, cls in (("run settings (top level)", RunConfig), ("[train]", TrainConfig),
                           ("[tracking] (optional; docs/tracking.md)", TrackingConfig),
                           ("[reference] (optional, simulation only; docs/reference.md)", ReferenceConfig)):
            print(f"{title}:")
            for name, typ, default, help_ in param_doc(cls):
                print(f"      {name} ({typ}, default {json.dumps(default)}){': ' + help_ if help_ else ''}")
            print()
    return 0


def cmd_partition(args) -> int:
    from mmfl.api import configure

    cfg = configure(args.config or demo_config_path(), args.overrides)  # a missing file: before any import
    from mmfl.data.partition_report import federation_summary, plot_federation
    from mmfl.data.federation import build_federation

    fed = build_federation(cfg)
    print(federation_summary(fed, cfg))  # each data set's clients with its own class names
    if fed.client_modalities is not None:  # modality heterogeneity: who holds what
        from mmfl.data.modality import modality_summary

        combos = modality_summary(fed.client_modalities)
        width = max(len(k) for k in combos)
        print(f"modalities ({cfg.modalities.name}): clients holding each combination")
        for combo, n in combos.items():
            print(f"  {combo:<{width}}  {n}")
    rates = {m: r for m, r in cfg.modalities.params.missing_rate.items() if r > 0}
    if rates:
        print("missing_rate (share of each multimodal client's samples lacking it): "
              + ", ".join(f"{m} {r:g}" for m, r in rates.items()))
    from mmfl.data.simulation_report import simulation_active, simulation_table

    if simulation_active(fed, cfg):  # per client: its modalities, rows lacking each, labels dropped/flipped
        print(simulation_table(fed, cfg))
    if args.plot:
        plot_federation(fed, cfg, args.plot)
        print(f"plot: {args.plot}")
    return 0


def cmd_report(args) -> int:
    from mmfl.report import compare

    plot = args.plot or (str(Path(args.runs[0]) / "accuracy.png") if len(args.runs) == 1 else None)
    if plot:
        from mmfl.engine import runfiles

        runfiles.note(Path(plot), depth=1)  # a plot in a run folder is the run's (what --overwrite may delete)
    print(compare(args.runs, plot_path=plot))
    if plot:
        print(f"plot: {plot}")
    return 0


def cmd_flower(args) -> int:
    from mmfl.flower.cli import main as flower_main

    return flower_main(args)


def cmd_vqa(args) -> int:
    from mmfl.vqa_eval import cmd_vqa as vqa_main

    return vqa_main(args)


def cmd_convert(args) -> int:
    from mmfl.convert import cmd_convert as convert_main

    return convert_main(args)


def cmd_bench(args) -> int:
    from mmfl.bench.runner import cmd_bench as bench_main

    return bench_main(args)


def cmd_sweep(args) -> int:
    from mmfl.bench.sweep_cmd import cmd_sweep as sweep_main

    return sweep_main(args)


def cmd_audit(args) -> int:
    from mmfl.audit.audit import cmd_audit as audit_main

    return audit_main(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"run": cmd_run, "demo": cmd_demo, "list": cmd_list, "partition": cmd_partition,
               "report": cmd_report, "flower": cmd_flower, "vqa": cmd_vqa,
               "bench": cmd_bench, "sweep": cmd_sweep, "convert": cmd_convert, "audit": cmd_audit}[args.command]
    return one_line(handler, args)


if __name__ == "__main__":
    sys.exit(main())
