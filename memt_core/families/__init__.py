"""Model families as data: one :class:`Family` object per family, in one registry.

A family owns what differs between MemT model families (config parsing, backbone classes and kernels,
where the memory sits, prompt format, output parser, tokenizer type, tiny checkpoints); see
:mod:`memt_core.families.base`. Code elsewhere looks a family up here, by its public name or by
config.json's ``model_type``, and never branches on a name. Adding a family: one module with a
``Family`` subclass, one ``register(...)`` line below. Tests may register their own.
"""

from __future__ import annotations

from memt_core.families.base import Family
from memt_core.families.flash import Flash
from memt_core.families.nano import Nano
from memt_core.families.smol import Smol

_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family``; its name and model_type must both be new."""
    for other in _FAMILIES.values():
        if other.name == family.name or other.model_type == family.model_type:
            raise ValueError(f"{family!r} clashes with the registered {other!r}")
    _FAMILIES[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove a registered family (tests that registered their own)."""
    del _FAMILIES[name]


def get(name: str) -> Family:
    """The family with public name ``name`` (e.g. "memt-nano")."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(names())}") from None


def by_model_type(model_type: object) -> Family | None:
    """The family config.json's ``model_type`` selects, or None."""
    return next((f for f in _FAMILIES.values() if f.model_type == model_type), None)


def names() -> tuple[str, ...]:
    """Public names of the registered families, in registration order."""
    return tuple(_FAMILIES)


def model_types() -> tuple[str, ...]:
    """config.json ``model_type`` values of the registered families."""
    return tuple(f.model_type for f in _FAMILIES.values())


register(Nano())
register(Flash())
register(Smol())  # an extension beyond the spec: the demo's pretrained backbone (memt_core/families/smol.py)

#: Public names of the built-in families, for callers that pick one (the tiny checkpoints, the demo).
NANO = Nano.name
FLASH = Flash.name
SMOL = Smol.name
#: The family of a tiny checkpoint when none is named.
DEFAULT = NANO

__all__ = ["DEFAULT", "FLASH", "NANO", "SMOL", "Family", "by_model_type", "get", "model_types", "names", "register", "unregister"]
