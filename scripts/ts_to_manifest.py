"""Convert time series in the sktime/aeon ``.ts`` text format into an mmfl manifest folder.

    python scripts/ts_to_manifest.py TRAIN.ts TEST.ts OUT [--modality acc=0-2 --modality gyro=3-5]

Kept for the commands written with it: it is ``mmfl convert`` (mmfl/convert.py, docs/data.md),
with the same arguments and the same files (``--modality`` channel groups and time windows,
``--derive``, ``--crop MIN``, ``--seed``; regression targets are refused).
"""

from __future__ import annotations

import sys

from mmfl.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))
