"""Named registries of algorithms, data sets, partitioners and models.

Every entry has a factory and a typed parameter dataclass whose fields (with
defaults) are what a user may set in the config table of that kind. ``mmfl
list`` prints them. Unknown names and unknown or ill-typed keys raise
:class:`~mmfl.errors.ConfigError` naming the problem.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import typing
from dataclasses import dataclass, fields
from typing import Any, Callable, Generic, TypeVar

from mmfl.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    factory: Callable[..., T]
    params: type | None  # a dataclass type, or None if it takes no parameters
    help: str


def _coerce(where: str, value: Any, annotation: Any) -> Any:
    """Check/convert a config value against a dataclass field annotation."""
    if isinstance(annotation, str):  # postponed annotations
        annotation = eval(annotation, {"typing": typing, "list": list, "dict": dict,
                                       "tuple": tuple, "float": float, "int": int,
                                       "str": str, "bool": bool, "None": None})
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        errors = []
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(where, value, a)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: invalid value {value!r} (expected {_type_name(annotation)})")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        out = [_coerce(where, v, inner) for v in value]
        return out if origin is list else tuple(out)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return dict(value)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: must be one of {list(args)}, got {value!r}")
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # `--set name=2024` reads 2024 as a TOML integer
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) in (list, tuple):
        args = typing.get_args(annotation)
        return f"list of {_type_name(args[0])}" if args else "list"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def build_params(kind: str, name: str, cls: type | None, values: dict[str, Any]):
    """Instantiate the params dataclass ``cls`` from a config table.

    Unknown keys and wrongly typed values raise ConfigError; the dataclass's
    ``__post_init__`` may raise ConfigError for invalid values.
    """
    if cls is None:
        if values:
            raise ConfigError(f"{kind}.{next(iter(values))}: unknown key ({kind} '{name}' takes no parameters)")
        return None
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls) if f.init}
    kwargs = {}
    for key, value in values.items():
        where = f"{kind}.{key}" if kind else key
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(sorted(known)) or 'none'})"
            raise ConfigError(f"{where}: unknown key for {kind or 'run settings'} '{name}'{hint}")
        kwargs[key] = _coerce(where, value, hints.get(key, Any))
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{kind} '{name}': {e}") from None


def param_doc(cls: type | None) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, help) of each parameter, for ``mmfl list``."""
    if cls is None:
        return []
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = "(required)"
        out.append((f.name, _type_name(hints.get(f.name, Any)), default, f.metadata.get("help", "")))
    return out


class Registry(Generic[T]):
    """A name -> Entry map for one kind of thing ("algorithm", "dataset", ...)."""

    def __init__(self, kind: str, plugins: tuple[str, ...] = ()):
        """``plugins``: modules (dotted names, higher in the layers than the registry's owner) that
        register entries here; imported on the first lookup, so the owner need not import them
        (an owner importing what imports it back would be an import cycle)."""
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._plugins = tuple(plugins)

    def _load(self) -> None:
        """Import the plugin modules once (they register on import; an import in progress is skipped)."""
        if self._plugins:
            plugins, self._plugins = self._plugins, ()
            for module in plugins:
                importlib.import_module(module)

    def register(self, name: str, params: type | None = None, help: str = ""):
        """Decorator: ``@DATASETS.register("mfeat", MfeatParams, help="...")``."""

        def deco(factory):
            if name in self._entries:
                raise RuntimeError(f"{self.kind} '{name}' registered twice")
            doc = help or (factory.__doc__ or "").strip().splitlines()[0:1]
            self._entries[name] = Entry(name, factory, params, doc if isinstance(doc, str) else (doc[0] if doc else ""))
            return factory

        return deco

    def get(self, name: str) -> Entry[T]:
        self._load()
        if name not in self._entries:
            close = difflib.get_close_matches(name, self._entries, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(
                f"unknown {self.kind} '{name}'{hint} (known: {', '.join(sorted(self._entries))})"
            )
        return self._entries[name]

    def params(self, name: str, values: dict[str, Any]):
        entry = self.get(name)
        return build_params(self.kind, name, entry.params, values)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._entries
