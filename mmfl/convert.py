"""``mmfl convert``: time series in the UEA/UCR ``.ts`` text format (sktime/aeon) -> an mmfl
manifest folder, with the series cut into modalities (docs/data.md, "Converting .ts files").

    mmfl convert TRAIN.ts TEST.ts OUT [--modality NAME=SPEC ...] [--derive KIND[:NAME] ...]
                 [--crop MIN] [--seed N] [--label-type auto|class]

Each sample's modalities go to one ``.npy`` each (float32 ``[C, T_i]``; lengths may differ between
samples) and ``OUT/manifest.csv`` gets a row per sample: ``label``, one column per modality, and
``split`` (``train`` for the first file, ``test`` for the second; one file: no split column, the
manifest's stratified ``test_fraction`` split applies).

A modality ``NAME=SPEC``; ``SPEC`` is comma-separated parts, each either channels (``0-2``: 0, 1
and 2, both ends included; ``4``: one) or a time window ``t:START-END`` (steps ``START`` to
``END - 1``, as Python's ``x[:, START:END]``; a bound may be a share of each series' length,
``t:0-50%``; an empty ``END`` is the end). No channel part: every channel; no window: every step.
Without ``--modality`` all channels form one modality ``series``. ``--derive diff`` adds, for every
modality ``m``, ``m_diff``: the first difference along time (``[C, T-1]``); ``--derive fft`` adds
``m_fft``: the magnitude of the real FFT along time (``[C, T//2 + 1]``); ``--derive diff:acc`` only
for ``acc``. ``--crop MIN`` first cuts each recording to a seeded random window of MIN..T steps,
shared by its modalities (drawn from ``derive_seed(seed, "convert-crop", split, i)``: a recording's
window depends on the seed and its place only).

mmfl trains classifiers: a file with regression targets (``@targetLabel true``) or without class
labels (``@classLabel false``) is refused with one line, and so are labels that the manifest loader
would refuse in the manifest they become (:func:`mmfl.data.labels.check_label_column`, over the
series of both files: numbers mixed with names, numbers with a fractional part, or more distinct
numbers than half the rows, at least 10 of them); ``--label-type class`` keeps numeric labels as
classes (a header's ``@targetLabel true`` still refuses; the manifest then loads with
``data.label_type = "class"``).
"""

from __future__ import annotations

import argparse
import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from mmfl.errors import ConfigError, DataError
from mmfl.seeds import derive_seed

DERIVED = ("diff", "fft")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = ("label", "split", "client")


@dataclass
class TsFile:
    """A ``.ts`` file: each series float32 ``[C, T_i]``, its label, the header (lower-case keys)."""

    path: Path
    series: list = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    header: dict[str, str] = field(default_factory=dict)


def _flag(header: dict[str, str], key: str) -> bool | None:
    v = header.get(key)
    return None if v is None else v.split()[0].lower() == "true" if v.split() else None


def read_ts(path: str | Path) -> TsFile:
    """Parse a ``.ts`` file (channels ``:``-separated, values ``,``-separated, the label last)."""
    import numpy as np

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    ts, in_data = TsFile(path), False
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "%")):  # comments (aeon: #; some UCR files: %)
            continue
        if not in_data:
            if not line.startswith("@"):
                raise DataError(f"{path}:{n}: expected a @header line or @data before the series, got {line[:40]!r}")
            key, _, value = line[1:].partition(" ")
            in_data = key.lower() == "data"
            ts.header[key.lower()] = value.strip()
            if _flag(ts.header, "timestamps"):
                raise DataError(f"{path}: timestamped series (@timeStamps true) are not supported; "
                                "convert them to plain values first")
            continue
        parts = line.split(":")
        labelled = _flag(ts.header, "classlabel") is not False or _flag(ts.header, "targetlabel")
        chans, label = (parts[:-1], parts[-1].strip()) if labelled else (parts, "")
        if not chans:
            raise DataError(f"{path}:{n}: a row without values")
        values = [c.split(",") for c in chans]
        bad = next((v.strip() for c in values for v in c if not _is_float(v)), None)
        if bad is not None:
            what = "missing values ('?')" if bad == "?" else f"a value that is no number ({bad[:20]!r})"
            raise DataError(f"{path}:{n}: {what}; mmfl convert needs complete numeric series")
        if len({len(c) for c in values}) > 1:
            raise DataError(f"{path}:{n}: channels of different lengths ({', '.join(str(len(c)) for c in values)})")
        x = np.array([[float(v) for v in c] for c in values], dtype=np.float32)
        if not np.isfinite(x).all():
            raise DataError(f"{path}:{n}: NaN or inf values; mmfl convert needs complete numeric series")
        if ts.series and x.shape[0] != ts.series[0].shape[0]:
            raise DataError(f"{path}:{n}: {x.shape[0]} channels, the first row has {ts.series[0].shape[0]}")
        ts.series.append(x)
        ts.labels.append(label)
    if not ts.series:
        raise DataError(f"{path}: no @data rows")
    return ts


def _is_float(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def check_class_labels(ts: TsFile) -> None:
    """DataError unless ``ts``'s header and labels declare classes (module doc); the numeric rule
    is :func:`check_labels`'."""
    p = ts.path
    if _flag(ts.header, "targetlabel"):
        raise DataError(f"{p} has regression targets (@targetLabel true); mmfl trains classifiers")
    if _flag(ts.header, "classlabel") is False:
        raise DataError(f"{p} has no class labels (@classLabel false); mmfl trains classifiers")
    if any(not lab for lab in ts.labels):
        row = ts.labels.index("")
        raise DataError(f"{p}: series {row} has no label; mmfl trains classifiers")
    declared = (ts.header.get("classlabel") or "").split()[1:]
    if declared:
        stray = sorted({lab for lab in ts.labels if lab not in declared})
        if stray:
            raise DataError(f"{p}: label {stray[0]!r} is not among @classLabel's classes ({' '.join(declared[:10])})")


LABEL_HINT = ("or pass --label-type class to take each distinct value as a class (and load the manifest with "
              "data.label_type = \"class\")")


def check_labels(files: list[TsFile], label_type: str = "auto") -> None:
    """DataError unless the labels of ``files`` are classes by the rule the manifest loader applies
    to the manifest they become (:func:`mmfl.data.labels.check_label_column`, over every series of
    every file): the same numbers that loader refuses are refused here, before anything is written."""
    from mmfl.data.labels import check_label_column

    for ts in files:
        check_class_labels(ts)
    labels = [lab for ts in files for lab in ts.labels]
    origin = [(ts.path, i) for ts in files for i in range(len(ts.labels))]

    def where(n: int | None, column: str) -> str:
        if n is None:
            return " and ".join(str(ts.path) for ts in files)
        path, i = origin[n - 1]
        return f"{path} series {i}"

    check_label_column(labels, range(len(labels)), label_type, "label", where, hint=LABEL_HINT)


@dataclass
class Modality:
    """``NAME=SPEC`` of ``--modality``: channels (None: all) and a time window (None: all)."""

    name: str
    channels: list[int] | None = None
    start: tuple[float, bool] | None = None  # (value, is a share of the length)
    end: tuple[float, bool] | None = None
    spec: str = ""

    def cut(self, x, where: str):
        """Rows ``channels``, steps of the window, of ``x`` ``[C, T]``."""
        c, t = x.shape
        if self.channels is not None:
            bad = [i for i in self.channels if i >= c]
            if bad:
                raise ConfigError(f"--modality {self.spec}: channel {bad[0]} does not exist "
                                  f"({where} has {c}: 0-{c - 1})")
            x = x[self.channels]
        lo, hi = _step(self.start, t, 0), _step(self.end, t, t)
        if hi <= lo:
            raise DataError(f"--modality {self.spec}: the window is empty for {where} ({t} steps)")
        return x[:, lo:hi]


def _step(bound, t: int, default: int) -> int:
    if bound is None:
        return default
    v, share = bound
    return max(0, min(t, int(round(v / 100 * t)) if share else int(v)))


def _bound(s: str) -> tuple[float, bool] | None:
    s = s.strip()
    if not s:
        return None
    share = s.endswith("%")
    v = float(s[:-1]) if share else int(s)
    if v < 0 or (share and v > 100):
        raise ValueError(s)
    return v, share


def parse_modality(spec: str) -> Modality:
    """A ``--modality`` value (module doc); ConfigError with the expected form otherwise."""
    name, eq, rest = spec.partition("=")
    hint = (f"--modality {spec!r}: expected NAME=SPEC, SPEC channels (0-2, 4) and/or a time window "
            "(t:0-50, t:50%-100%), e.g. acc=0-2 or early=t:0-50")
    if not eq or not rest.strip():
        raise ConfigError(hint)
    if not _NAME.match(name) or name in _RESERVED:
        raise ConfigError(f"--modality {spec!r}: the name must be a letter or _ then letters, digits, _ "
                          f"(not {', '.join(_RESERVED)})")
    m = Modality(name, spec=spec)
    try:
        for part in rest.split(","):
            part = part.strip()
            if part.lower().startswith("t:"):
                if m.start is not None or m.end is not None:
                    raise ValueError(part)
                lo, dash, hi = part[2:].partition("-")
                if not dash:
                    raise ValueError(part)
                m.start, m.end = _bound(lo) or (0, False), _bound(hi)
            else:
                lo, _, hi = part.partition("-")
                a, b = int(lo), int(hi or lo)
                if a < 0 or b < a:
                    raise ValueError(part)
                m.channels = (m.channels or []) + list(range(a, b + 1))
    except ValueError:
        raise ConfigError(hint) from None
    return m


def derive(kind: str, x):
    """``diff``: the first difference along time; ``fft``: the magnitude of the real FFT along time."""
    import numpy as np

    if kind == "diff":
        return np.diff(x, axis=1).astype(np.float32)
    return np.abs(np.fft.rfft(x, axis=1)).astype(np.float32)


def parse_derive(specs: list[str], names: list[str]) -> list[tuple[str, str]]:
    """``--derive KIND[:NAME]`` values -> [(kind, source modality)]."""
    out = []
    for s in specs:
        kind, _, src = s.partition(":")
        if kind not in DERIVED:
            raise ConfigError(f"--derive {s!r}: unknown kind (known: {', '.join(DERIVED)}; e.g. diff or diff:acc)")
        if src and src not in names:
            raise ConfigError(f"--derive {s!r}: no modality {src!r} (modalities: {', '.join(names)})")
        out += [(kind, m) for m in ([src] if src else names) if (kind, m) not in out]
    return out


def convert(inputs: list[Path], out: Path, modalities: list[str] = (), derives: list[str] = (), crop: int = 0,
            seed: int = 0, label_type: str = "auto") -> dict:
    """Write ``out/manifest.csv`` and the ``.npy`` files from one or two ``.ts`` files (module
    doc); returns ``{"rows", "shapes", "classes"}`` (shapes: modality -> first sample's shape)."""
    import numpy as np

    if crop < 0:
        raise ConfigError(f"--crop: must be >= 0, got {crop}")
    mods = [parse_modality(s) for s in modalities] or [Modality("series", spec="series")]
    names = [m.name for m in mods]
    if len(set(names)) != len(names):
        raise ConfigError(f"--modality: the name {next(n for n in names if names.count(n) > 1)!r} is given twice")
    extra = parse_derive(list(derives), names)
    for kind, m in extra:
        if f"{m}_{kind}" in names:
            raise ConfigError(f"--derive {kind}: {m}_{kind} is already a modality")
    files = [read_ts(p) for p in inputs]
    check_labels(files, label_type)
    splits = ["train", "test"] if len(files) == 2 else ["data"]
    rows, shapes = [], {}
    for split, ts in zip(splits, files):
        (out / split).mkdir(parents=True, exist_ok=True)
        for i, (x, label) in enumerate(zip(ts.series, ts.labels)):
            if crop and x.shape[1] > crop:  # one window per recording, shared by its modalities
                rng = np.random.default_rng(derive_seed(seed, "convert-crop", split, i))
                t = int(rng.integers(crop, x.shape[1] + 1))
                start = int(rng.integers(0, x.shape[1] - t + 1))
                x = x[:, start:start + t]
            arrays = {m.name: m.cut(x, f"{ts.path.name} series {i}") for m in mods}
            for kind, m in extra:
                if kind == "diff" and arrays[m].shape[1] < 2:
                    raise DataError(f"--derive diff: {ts.path.name} series {i} has 1 step in {m}; no difference")
                arrays[f"{m}_{kind}"] = derive(kind, arrays[m])
            row = {"label": label}
            for name, arr in arrays.items():
                f = f"{split}/{name}_{i:05d}.npy"
                np.save(out / f, np.ascontiguousarray(arr))
                row[name] = f
                shapes.setdefault(name, tuple(arr.shape))
            rows.append({**row, "split": split} if len(files) == 2 else row)
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return {"rows": len(rows), "shapes": shapes, "classes": len({r["label"] for r in rows})}


def add_convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert UEA/UCR .ts time series into a manifest, cutting modalities",
                       description=__doc__.split("\n\n", 2)[2].replace("``", ""),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="TRAIN.ts [TEST.ts] OUT: one or two .ts files, then "
                                                             "the output folder")
    p.add_argument("--modality", action="append", default=[], metavar="NAME=SPEC",
                   help="a modality: channels (acc=0-2) and/or a time window (early=t:0-50, late=t:50%%-100%%); "
                        "repeatable (default: all channels as 'series')")
    p.add_argument("--derive", action="append", default=[], metavar="KIND[:NAME]", help="add NAME_KIND for each "
                   "modality (or NAME): diff (first difference) or fft (FFT magnitude); repeatable")
    p.add_argument("--crop", type=int, default=0, metavar="MIN",
                   help="cut each recording to a seeded random window of MIN..T steps first (0 = keep it whole)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --crop windows")
    p.add_argument("--label-type", choices=("auto", "class"), default="auto",
                   help="class: keep numeric labels as classes (auto refuses labels that look like regression "
                        "targets)")


def cmd_convert(args) -> int:
    if len(args.paths) not in (2, 3):
        raise ConfigError(f"convert: expected TRAIN.ts [TEST.ts] OUT, got {len(args.paths)} paths")
    *inputs, out = [Path(p) for p in args.paths]
    res = convert(inputs, out, args.modality, args.derive, args.crop, args.seed, args.label_type)
    shapes = ", ".join(f"{m} {list(s)}" for m, s in res["shapes"].items())
    print(f"{out / 'manifest.csv'}: {res['rows']} rows, {res['classes']} classes; modalities (first row): {shapes}")
    return 0
