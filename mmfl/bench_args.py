"""``mmfl bench``'s command-line arguments (standard library only: ``mmfl --help`` stays cheap)."""


def add_bench_parser(sub) -> None:
    """``mmfl bench``'s arguments on the CLI's subparsers ``sub``."""
    p = sub.add_parser("bench", help="run a benchmark grid (what is missing, in parallel) and write its tables",
                       description="Run the runs of a benchmark grid file that are not finished yet "
                                   "(worker processes, one torch thread each; resumable) and write its "
                                   "report from the finished runs. Grid format: docs/benchmarks.md.")
    p.add_argument("grid", help="grid file (TOML), e.g. benchmarks/moon/grid.toml; or a performance grid "
                                "(kind = \"perf\", benchmarks/perf/measures.toml): its cells measured, reports rendered")
    p.add_argument("--tables-only", action="store_true", help="run nothing; rebuild the report from finished runs")
    p.add_argument("--workers", type=int, help="worker processes (default: the grid's workers)")
    p.add_argument("--seeds", type=int, nargs="+", help="run only these seeds (the tables use every finished run)")
    p.add_argument("--group", action="append", default=[], help="run only this group (repeatable; a perf grid: a cell or a report)")
    p.add_argument("--raw-dir", help="folder of the run folders instead of the grid's raw_dir (the report is "
                                     "written there too)")
    p.add_argument("--grid-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a grid file value, e.g. 'groups.fig4.seeds=[0, 1, 2]' (repeatable)")
    p.add_argument("--device", help="every run's device (auto, cpu, cuda, cuda:N): --grid-set set.device=...")
    p.add_argument("--batch-clients", metavar="true|false", help="every run's batch_clients (stacked clients or "
                                                                 "one by one): --grid-set set.batch_clients=...")
    p.add_argument("--plan", action="store_true", help="check every run's config and list the runs per group; "
                                                       "run nothing")
    p.add_argument("--estimate", action="store_true", help="with --plan: time round 1 of each (group, method) "
                                                           "and extrapolate the grid's wall time")
    p.add_argument("--estimate-epochs", type=int, default=0, metavar="N",
                   help="with --estimate: time N local epochs and scale the training to the runs' epochs")
