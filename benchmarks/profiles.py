"""The profiles of the fedcmi and creamfl ``run.py`` (until they go): ``--profile full|quick|paper``
(or ``--quick``) picks ``grid.toml`` / ``grid-quick.toml`` / ``grid-paper.toml`` next to the script;
every other option is ``mmfl bench``'s (``--device``, ``--batch-clients``, ``--plan [--estimate
[--estimate-epochs N]]``, ``--workers``, ...). The same: ``mmfl bench benchmarks/<paper>/grid-paper.toml ...``.
"""

import sys
from pathlib import Path

PROFILES = {"full": "grid.toml", "quick": "grid-quick.toml", "paper": "grid-paper.toml"}


def main(here: Path, argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(here.parent.parent))  # this checkout's mmfl
    from mmfl.bench import bench_main

    argv, profile = list(sys.argv[1:] if argv is None else argv), "full"
    if "--quick" in argv:
        argv.remove("--quick")
        profile = "quick"
    if "--profile" in argv:
        i = argv.index("--profile")
        profile = argv[i + 1] if i + 1 < len(argv) else ""
        del argv[i:i + 2]
        if profile not in PROFILES:
            print(f"mmfl: error: --profile: one of {', '.join(PROFILES)}, got {profile!r}", file=sys.stderr)
            return 2
    return bench_main(here / PROFILES[profile], argv)
