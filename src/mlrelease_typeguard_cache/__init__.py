"""Typeguard's `@typechecked` instrumentation, cached on disk: Feast's import pays it once, not in every process.

Feast decorates its data-source, feature-view and on-demand-view classes with typeguard's `@typechecked`.
For every method of such a class, typeguard 4 reads the whole module's source, parses it, rewrites the
method and compiles the *whole module* again to pick the new code object out. That is ~8 s of CPU in every
process that imports Feast (each step, gateway worker and Airflow task on this 2-core box; 11.6 s against
3.7 s with the decorator off), repeated although the result only depends on the source file.

This package keeps typeguard's behaviour exactly (the same instrumented code object, so the same runtime
type checks) and only stores that code object, marshalled, keyed by the source file's path, size and
mtime, the method's qualified name and first line, and the Python and typeguard versions: a later process
loads it instead of parsing and compiling again. What is not cached, for exactness:

- a method whose instrumented code needs a new closure (typeguard then reads the decorating frame's locals);
- anything under a typeguard version other than the one this copy of `instrument` was written against
  (`SUPPORTED`): then nothing is patched and typeguard runs as it ships.

It is activated by a `.pth` line (see `install_pth`), lazily: nothing is imported at interpreter start-up
until something imports `typeguard._decorators`. Written here rather than taken from a library because no
package caches typeguard's decorator output; `instrument.py` is typeguard 4.6.1's `instrument` (MIT), plus the cache.
"""

from __future__ import annotations

# Only sys and os at import time: the .pth line runs this in every process of the environment.
import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing here would cost every process a few ms
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from pathlib import Path
    from types import ModuleType
    from typing import Any

SUPPORTED = "4.6.1"
TARGET = "typeguard._decorators"
CACHE_ENV = "MLRELEASE_TYPEGUARD_CACHE"  # a directory; "off" disables the cache (typeguard as it ships)
MODULE = "mlrelease_typeguard_cache"  # not __name__: run as a script, that is "__main__"
PTH_NAME = f"{MODULE}.pth"


def _patch(module: ModuleType) -> None:
    """Swap typeguard's `instrument` for the caching one when this is the version it was copied from."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("typeguard")
    except PackageNotFoundError:
        return
    if installed == SUPPORTED and os.environ.get(CACHE_ENV) != "off" and sys.version_info < (3, 12):
        from mlrelease_typeguard_cache.instrument import instrument

        module.instrument = instrument  # type: ignore[attr-defined]


class _PatchingLoader:
    """Runs the real loader, then patches the module it executed."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        """The real loader's module."""
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        """Execute it as usual, then patch it."""
        self._loader.exec_module(module)
        _patch(module)


class _Finder:
    """Notices the import of typeguard._decorators (and only that) to patch it once it has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        """Find typeguard._decorators through the other finders, and wrap its loader."""
        if fullname != TARGET:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)  # type: ignore[assignment]  # duck-typed: no importlib.abc at start-up
        return spec


def activate() -> None:
    """Patch typeguard when it is imported (or now, if it already is); called by the .pth line."""
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def install_pth(site_packages: Path) -> Path:
    """Write the .pth line that activates the cache in every process of this environment."""
    pth = site_packages / PTH_NAME
    pth.write_text(f"import {MODULE}; {MODULE}.activate()\n", encoding="utf-8")
    return pth
