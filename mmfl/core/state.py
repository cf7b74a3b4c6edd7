"""Algorithm state as a declaration: what a server (or a client) keeps between rounds.

A class lists its persistent attributes once, by kind, in ``state_fields``::

    class ScaffoldServer(FedAvgServer):
        state_fields = {"c": tensors()}            # + "model" from Server

and :class:`Stateful` derives ``state_dict()`` (a flat ``{key: tensor}``, what
checkpoints, the client-state store and Flower records carry) and
``load_state_dict()`` from it. Declarations add up along the class hierarchy
(``None`` removes an inherited field). The kinds:

============================  ===================================  ==========================
kind                          attribute holds                      keys
============================  ===================================  ==========================
``module()``                  an ``nn.Module``                     ``name/<state-dict key>``
``tensor()``                  a tensor (or None: not saved)        ``name``
``scalar()``                  an int, float or bool                ``name`` (0-d tensor)
``rng()``                     a ``torch.Generator``                ``name`` (its state)
``optimizer()``               a ``torch.optim.Optimizer``          ``name/<param index>/<field>``
``tensors()``                 ``{str: tensor}``                    ``name/<key>``
``per_client(inner)``         ``{int cid: inner}``                 ``name/<cid>/...``
``dict_of(inner, key)``       ``{key: inner}``                     ``name/<key>/...``
``record(a=kind, ...)``       ``{"a": ..., ...}`` (fixed entries)  ``name/a/...``
============================  ===================================  ==========================

Loading is strict: a key no field declares, a module or single tensor the
checkpoint lacks, or a malformed key raises one :class:`StateError` naming the
keys. Dicts load as saved (an absent dict is an empty one); a dict of dicts
keeps the keys of the freshly built value with empty entries, so ``{group: {}}``
survives. An optimizer's entries are keyed by parameter position in its
``param_groups`` (rebuilt the same way on resume), and an optimizer or module
that is the same object as an earlier field is saved once.

Client code keeps its state in the engine's flat ``ctx.state``; :func:`read`
and :func:`write` move one declared field in and out of such a mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from mmfl.errors import MMFLError


class StateError(MMFLError):
    """A checkpoint does not match the state a class declares."""


def _join(head: str, rel: str) -> str:
    return head if rel == "" else rel if head == "" else f"{head}/{rel}"


class Field:
    """One kind of persistent attribute: flattens a value to ``{relative key: tensor}``
    (``""``: the value itself) and restores it from such a mapping."""

    leaf = False  # takes the whole remaining key when inside a dict

    def flatten(self, value) -> dict[str, Tensor]:
        raise NotImplementedError

    def restore(self, current, flat: dict[str, Tensor], path: str, errors: list[str]):
        raise NotImplementedError

    def _leaf_tensor(self, current, flat, path, errors) -> Tensor | None:
        for rel in flat:
            if rel != "":
                errors.append(f"unexpected key '{_join(path, rel)}'")
        if "" not in flat:
            if current is not None:
                errors.append(f"missing key '{path}'")
            return None
        return flat[""]


class _Tensor(Field):
    leaf = True

    def flatten(self, value):
        return {} if value is None else {"": value.detach().clone()}

    def restore(self, current, flat, path, errors):
        t = self._leaf_tensor(current, flat, path, errors)
        return current if t is None else t.clone()


class _Scalar(Field):
    leaf = True

    def flatten(self, value):
        if value is None:
            return {}
        dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.float64
        return {"": torch.tensor(value, dtype=dtype, device="cpu")}

    def restore(self, current, flat, path, errors):
        t = self._leaf_tensor(current, flat, path, errors)
        if t is None:
            return current
        return bool(t) if t.dtype == torch.bool else float(t) if t.is_floating_point() else int(t)


class _Rng(Field):
    def flatten(self, value):
        return {} if value is None else {"": value.get_state()}

    def restore(self, current, flat, path, errors):
        t = self._leaf_tensor(current, flat, path, errors)
        if t is not None:
            if current is None:
                errors.append(f"unexpected key '{path}' (the generator is None)")
            else:
                current.set_state(t.cpu().clone())  # a generator's state is a CPU byte tensor
        return current


class _Module(Field):
    def flatten(self, value):
        return {} if value is None else dict(value.state_dict())

    def restore(self, current, flat, path, errors):
        if current is None:
            errors += [f"unexpected key '{_join(path, k)}' (the module is None)" for k in flat]
            return current
        want = set(current.state_dict())
        bad = [f"missing key '{_join(path, k)}'" for k in current.state_dict() if k not in flat]
        bad += [f"unexpected key '{_join(path, k)}'" for k in flat if k not in want]
        if bad:
            errors += bad
        else:
            current.load_state_dict(flat)
        return current


def _params(opt: torch.optim.Optimizer) -> list[Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


class _Optimizer(Field):
    def flatten(self, value):
        if value is None:
            return {}
        index = {id(p): i for i, p in enumerate(_params(value))}
        out = {}
        for p, st in value.state.items():
            for k, v in st.items():
                if v is not None:
                    out[f"{index[id(p)]}/{k}"] = (v if isinstance(v, Tensor) else torch.tensor(v, device="cpu")
                                                  ).detach().clone()
        return out

    def restore(self, current, flat, path, errors):
        if current is None:
            errors += [f"unexpected key '{_join(path, k)}' (the optimizer is None)" for k in flat]
            return current
        params = _params(current)
        entries = []
        for rel, v in flat.items():
            i, _, k = rel.partition("/")
            if not (i.isdigit() and int(i) < len(params) and k):
                errors.append(f"unexpected key '{_join(path, rel)}' (want <param index < {len(params)}>/<field>)")
            else:
                entries.append((params[int(i)], k, v))
        current.state.clear()
        for p, k, v in entries:  # on the parameter's device, as torch.optim's load_state_dict puts them
            current.state[p][k] = v.cpu().clone() if k == "step" else v.to(p.device).clone()
        return current


class _Dict(Field):
    def __init__(self, inner: Field, key: type = str):
        self.inner, self.key = inner, key

    def flatten(self, value):
        out = {}
        for k, v in (value or {}).items():
            out.update({_join(str(k), rel): t for rel, t in self.inner.flatten(v).items()})
        return out

    def restore(self, current, flat, path, errors):
        current = current or {}
        groups: dict[Any, dict[str, Tensor]] = {}
        for rel, t in flat.items():
            k, rest = (rel, "") if self.inner.leaf else rel.partition("/")[::2]
            if self.key is int:
                if not k.lstrip("-").isdigit():
                    errors.append(f"unexpected key '{_join(path, rel)}' (want an integer id after '{path}/')")
                    continue
                k = int(k)
            groups.setdefault(k, {})[rest] = t
        out = {k: type(v)() for k, v in current.items() if isinstance(self.inner, _Dict) and isinstance(v, dict)}
        for k in (sorted(groups) if self.key is int else groups):
            out[k] = self.inner.restore(current.get(k), groups[k], _join(path, str(k)), errors)
        return out


class _Record(Field):
    def __init__(self, fields: dict[str, Field]):
        self.fields = fields

    def flatten(self, value):
        return flatten(self.fields, value)

    def restore(self, current, flat, path, errors):
        return _restore(self.fields, current or {n: None for n in self.fields}, flat, path, errors)


def module() -> Field:
    """An ``nn.Module`` (its ``state_dict``); loaded in place."""
    return _Module()


def tensor() -> Field:
    """A single tensor; None is saved as nothing."""
    return _Tensor()


def scalar() -> Field:
    """A Python int, float or bool (exact: int64 / float64 / bool)."""
    return _Scalar()


def rng() -> Field:
    """A ``torch.Generator``; its state is restored in place."""
    return _Rng()


def optimizer() -> Field:
    """A ``torch.optim.Optimizer``'s per-parameter state (hyper-parameters come from the config)."""
    return _Optimizer()


def dict_of(inner: Field, key: type = str) -> Field:
    """A dict of ``inner`` values keyed by ``key`` (str or int)."""
    return _Dict(inner, key)


def tensors() -> Field:
    """``{name: tensor}`` (names may contain '/')."""
    return _Dict(_Tensor())


def record(**fields: Field) -> Field:
    """A dict with these named entries, each of its own kind (strict like top-level fields)."""
    return _Record(fields)


def per_client(inner: Field | None = None) -> Field:
    """``{client id: inner}`` (default ``inner``: :func:`tensors`); absent clients cost nothing."""
    return _Dict(inner if inner is not None else tensors(), int)


# --- flat mappings -----------------------------------------------------------------


def flatten(fields: Mapping[str, Field], values: Mapping[str, Any]) -> dict[str, Tensor]:
    """``{field/relative key: tensor}`` of ``values`` (an object aliased by an earlier field is skipped)."""
    out, seen = {}, set()
    for name, field in fields.items():
        v = values[name]
        if isinstance(v, (nn.Module, torch.optim.Optimizer)):
            if id(v) in seen:
                continue
            seen.add(id(v))
        out.update({_join(name, rel): t for rel, t in field.flatten(v).items()})
    return out


def restore(fields: Mapping[str, Field], values: Mapping[str, Any], flat: Mapping[str, Tensor],
            owner: str = "state") -> dict[str, Any]:
    """The new values of ``fields`` from ``flat`` (``values``: the current ones, loaded into in
    place where the kind allows); raises one :class:`StateError` listing every bad key."""
    errors: list[str] = []
    out = _restore(fields, values, flat, "", errors)
    _raise(errors, f"{owner}: checkpoint does not match its declared state ({', '.join(fields)})")
    return out


def load_field(field: Field, flat: Mapping[str, Tensor], current=None, owner: str = "state"):
    """One field's value from its own flat keys (no field name in front), e.g. a client-state store."""
    errors: list[str] = []
    out = field.restore(current, flat, "", errors)
    _raise(errors, f"{owner}: checkpoint does not match its declared state")
    return out


def _raise(errors: list[str], what: str) -> None:
    if errors:
        shown = "; ".join(errors[:5]) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise StateError(f"{what}: {shown}")


def _restore(fields, values, flat, path, errors) -> dict[str, Any]:
    parts: dict[str, dict[str, Tensor]] = {}
    for key in flat.keys():
        head, _, rel = key.partition("/")
        if head not in fields:
            errors.append(f"unexpected key '{_join(path, key)}'")
        else:
            parts.setdefault(head, {})[rel] = flat[key]
    out, seen = {}, set()
    for name, field in fields.items():
        v = values[name]
        if isinstance(v, (nn.Module, torch.optim.Optimizer)):
            if id(v) in seen:
                out[name] = v
                continue
            seen.add(id(v))
        out[name] = field.restore(v, parts.get(name, {}), _join(path, name), errors)
    return out


def _under(key: str, name: str) -> bool:
    return key == name or key.startswith(name + "/")


def read(state: Mapping[str, Tensor], name: str, field: Field | None = None, current=None):
    """The part ``name`` (a field name or a path such as ``"sl/opt"``; a trailing '/' is ignored)
    of a flat state such as ``ctx.state``, as a value of kind ``field`` (default :func:`tensors`);
    absent: empty (or ``current``, an optimizer or module, loaded in place)."""
    name = name.rstrip("/")
    sub = {k[len(name) + 1:]: state[k] for k in state if _under(k, name)}
    return load_field(field if field is not None else tensors(), sub, current, owner=name)


def write(state: dict[str, Tensor], name: str, value, field: Field | None = None) -> None:
    """Replace the part ``name`` of a flat state (such as ``ctx.state``) with ``value`` of kind
    ``field`` (default :func:`tensors`); None drops it."""
    name = name.rstrip("/")
    for k in [k for k in state if _under(k, name)]:
        del state[k]
    if value is not None:
        field = field if field is not None else tensors()
        state.update({_join(name, rel): t for rel, t in field.flatten(value).items()})


def split_client_key(key: str) -> tuple[int, str]:
    """``"{cid}/{name}"`` (a :func:`per_client` key) -> ``(cid, name)``."""
    cid, _, name = key.partition("/")
    if not (cid.lstrip("-").isdigit() and name):
        raise StateError(f"client state: unexpected key '{key}' (want '<client id>/<name>')")
    return int(cid), name


class Stateful:
    """``state_dict``/``load_state_dict`` derived from the ``state_fields`` of the class and its bases."""

    state_fields: ClassVar[dict[str, Field | None]] = {}

    @classmethod
    def declared_state(cls) -> dict[str, Field]:
        fields: dict[str, Field | None] = {}
        for klass in reversed(cls.__mro__):
            fields.update(klass.__dict__.get("state_fields", {}))
        return {k: f for k, f in fields.items() if f is not None}

    def state_dict(self) -> dict[str, Tensor]:
        """Everything needed to continue the run (tensors only)."""
        fields = self.declared_state()
        return flatten(fields, {n: getattr(self, n) for n in fields})

    def load_state_dict(self, sd: Mapping[str, Tensor]) -> None:
        fields = self.declared_state()
        new = restore(fields, {n: getattr(self, n) for n in fields}, sd, owner=type(self).__name__)
        for n, v in new.items():
            setattr(self, n, v)
