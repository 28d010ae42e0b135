"""Lazy exports for the packages' `__init__` files (PEP 562).

A package maps each public name to the module that defines it; the module loads when the name is
first used, so importing a package stays as light as the module a caller actually needs.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable


def lazy_exports(package: str, names: dict[str, str]) -> tuple[Callable, Callable]:
    """`__getattr__` and `__dir__` for `package` (its `__name__`), whose public `names` map to the
    modules that define them. An unknown name raises AttributeError, so `from package import
    submodule` still finds submodules."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
