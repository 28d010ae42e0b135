"""Lazy exports for the packages' `__init__` files (PEP 562).

A package lists its public names by the module that defines them; a module loads when one of its
names is first used, so importing a package stays as light as the module a caller needs.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]) -> tuple[Callable, Callable, list[str]]:
    """`__getattr__`, `__dir__` and the sorted public names of `package` (its `__name__`), where
    `modules` maps each module, relative to the package, to the public names it defines. An
    unknown name raises AttributeError, so `from package import submodule` still works."""
    namespace = vars(sys.modules[package])
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__, sorted(where)
