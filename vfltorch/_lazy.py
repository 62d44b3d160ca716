"""Package exports imported on first use (PEP 562).

``vfl --help``, ``vfl METHOD --help`` and option errors import a method's
``cli`` module, which imports its package first; with eager package imports
that would pull in torch, opacus, pandas and TensorBoard (seconds) to print
a help text. Each method package lists what it exports and where it lives;
``from vfltorch.kernels import FDSKLClassifier`` still works, and imports
``vfltorch.kernels.estimator`` only then.
"""

from __future__ import annotations

import importlib
import sys
import types


def lazy_exports(package: str, where: dict[str, str]):
    """``(__getattr__, __dir__, __all__)`` for ``package``; ``where`` maps submodule -> space-separated names."""
    owner = {name: module for module, names in where.items() for name in names.split()}

    def __getattr__(name: str):
        module = owner.get(name)
        if module is None:
            try:                            # a submodule not imported yet (``vfltorch.kernels.trainer``)
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(owner))

    class Package(types.ModuleType):
        def __setattr__(self, name, value):
            # Importing a submodule binds its name on the package; where a name is both a submodule and
            # a function it exports (``pca.merge``), keep the function, as the eager imports used to.
            if isinstance(value, types.ModuleType) and owner.get(name) == name \
                    and value.__name__ == f"{package}.{name}":
                value = getattr(value, name)
            super().__setattr__(name, value)

    sys.modules[package].__class__ = Package
    return __getattr__, __dir__, sorted(owner)
