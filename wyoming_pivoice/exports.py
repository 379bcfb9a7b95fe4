"""A package's public surface, imported on first use (PEP 562).

`from wyoming_pivoice.satellite import Satellite` is what a host (the lab, a test) may use; the
package's modules are its own business. Lazy because a package's `__init__` runs for every one
of its modules: an eager surface would load the whole satellite (~0.35 s, numpy and soxr) for
`satellite --help`, and every engine's model runtime for a satellite that imports engines.vad.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package` for `exports` (its module → the names it gives)."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)  # once: the next lookup is a plain attribute
        return value

    return __getattr__


def names(exports: Mapping[str, tuple[str, ...]]) -> list[str]:
    """`__all__` for `exports`."""
    return sorted(name for group in exports.values() for name in group)
