"""Package ``__init__``s that load their names on first use (PEP 562).

A package whose ``__init__`` imports its modules runs them whenever any one of them is imported, since Python runs a
module's packages first: ``import turnkit.kernel.payloads`` would load the engine, and a package's modules would
import each other in a loop through their ``__init__``. With :func:`lazy_exports` an ``__init__`` names where each of
its names lives and imports nothing until one is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str | None]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: ``exports`` maps each name to the module that defines it (``None``:
    the name is a submodule of ``package``). A loaded name is kept in the package, so it is looked up once."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = exports[name]
        if module is None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
