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
package caches typeguard's decorator output; the `instrument` below is typeguard 4.6.1's (MIT), plus the cache.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import marshal
import os
import sys
from pathlib import Path
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any, cast

SUPPORTED = "4.6.1"
TARGET = "typeguard._decorators"
CACHE_ENV = "MLRELEASE_TYPEGUARD_CACHE"  # a directory; "off" disables the cache (typeguard as it ships)
MODULE = "mlrelease_typeguard_cache"  # not __name__: run as a script, that is "__main__"
PTH_NAME = f"{MODULE}.pth"


def cache_dir() -> Path | None:
    """Where instrumented code objects are kept: $MLRELEASE_TYPEGUARD_CACHE, else beside the interpreter's prefix."""
    configured = os.environ.get(CACHE_ENV)
    if configured == "off":
        return None
    return Path(configured) if configured else Path(sys.prefix) / ".typeguard-cache"


def _key(f: FunctionType) -> str | None:
    """The cache key of one function's instrumentation: its file's identity, its place, and both versions."""
    filename = f.__code__.co_filename
    try:
        stat = os.stat(filename)
    except OSError:
        return None
    parts = (filename, stat.st_size, stat.st_mtime_ns, f.__qualname__, f.__code__.co_firstlineno)
    raw = repr((parts, sys.version, SUPPORTED)).encode()
    return hashlib.sha256(raw).hexdigest()


def _load(directory: Path, key: str) -> CodeType | None:
    try:
        code = marshal.loads((directory / f"{key}.code").read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _store(directory: Path, key: str, code: CodeType) -> None:
    """Write atomically (a rename), so a concurrent process reads a whole entry or none; errors only cost speed."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f"{key}.{os.getpid()}.tmp"
        partial.write_bytes(marshal.dumps(code))
        partial.replace(directory / f"{key}.code")
    except OSError:
        pass


def _rebuild(f: FunctionType, new_code: CodeType, closure: tuple[Any, ...] | None) -> FunctionType:
    """A function with the instrumented code and everything else of `f` (as typeguard builds it)."""
    new_function = FunctionType(new_code, f.__globals__, f.__name__, closure=closure)
    new_function.__module__ = f.__module__
    new_function.__name__ = f.__name__
    new_function.__qualname__ = f.__qualname__
    new_function.__doc__ = f.__doc__
    new_function.__defaults__ = f.__defaults__
    new_function.__kwdefaults__ = f.__kwdefaults__
    new_function.__annotations__ = f.__annotations__
    return new_function


def _refusal(f: Any) -> str | None:
    """typeguard's reasons not to instrument a function at all."""
    if not getattr(f, "__code__", None):
        return "no code associated"
    if not getattr(f, "__module__", None):
        return "__module__ attribute is not set"
    if f.__code__.co_filename == "<stdin>":
        return "cannot instrument functions defined in a REPL"
    if hasattr(f, "__wrapped__"):
        return (
            "@typechecked only supports instrumenting functions wrapped with @classmethod, @staticmethod or @property"
        )
    return None


def _closure(f: FunctionType, new_code: CodeType, names_in_annotations: set[str], frame: FrameType) -> tuple[Any, ...]:
    """New free variables: their values come from the frame that applied the decorator, as in typeguard."""
    from typeguard import _decorators as tg

    cells = []
    for name in new_code.co_freevars:
        if name in names_in_annotations:
            cells.append(tg.make_cell(frame.f_locals.get(name) or tg.ForwardRef(name)))
        else:
            assert f.__closure__
            cells.append(f.__closure__[f.__code__.co_freevars.index(name)])
    return tuple(cells)


def instrument(f: Any) -> FunctionType | str:
    """typeguard 4.6.1's `instrument`, with the compiled result cached (called by `typechecked` itself)."""
    import ast

    from typeguard import _decorators as tg

    refusal = _refusal(f)
    if refusal:
        return refusal
    directory = cache_dir()
    key = _key(f) if directory is not None and not tg.global_config.debug_instrumentation else None
    if directory is not None and key is not None:
        cached = _load(directory, key)
        if cached is not None and cached.co_freevars == f.__code__.co_freevars:
            return _rebuild(f, cached, f.__closure__)

    target_path = [item for item in f.__qualname__.split(".") if item != "<locals>"]
    module_ast = ast.parse(inspect.getsource(sys.modules[f.__module__]))
    instrumentor = tg.TypeguardTransformer(target_path, f.__code__.co_firstlineno)
    instrumentor.visit(module_ast)
    if not instrumentor.target_node or instrumentor.target_lineno is None:
        return "instrumentor did not find the target function"
    module_code = compile(module_ast, f.__code__.co_filename, "exec", dont_inherit=True)
    new_code = tg.find_target_function(module_code, target_path, instrumentor.target_lineno)
    if not new_code:
        return "cannot find the target function in the AST"
    if tg.global_config.debug_instrumentation:
        print(f"Source code of {f.__qualname__}() after instrumentation:", file=sys.stderr)
        print(ast.unparse(instrumentor.target_node), file=sys.stderr)

    if new_code.co_freevars != f.__code__.co_freevars:
        # Two frames up is the scope that applied the decorator (`typechecked` calls this directly). Not cached:
        # the closure's values belong to that scope.
        decorating = cast(FrameType, cast(FrameType, cast(FrameType, inspect.currentframe()).f_back).f_back)
        return _rebuild(f, new_code, _closure(f, new_code, instrumentor.names_used_in_annotations, decorating))
    if directory is not None and key is not None:
        _store(directory, key, new_code)
    return _rebuild(f, new_code, f.__closure__)


def _patch(module: ModuleType) -> None:
    """Swap typeguard's `instrument` for the caching one when this is the version it was copied from."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("typeguard")
    except PackageNotFoundError:
        return
    if installed == SUPPORTED and cache_dir() is not None and sys.version_info < (3, 12):
        module.instrument = instrument  # type: ignore[attr-defined]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the module it executed."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        """The real loader's module."""
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        """Execute it as usual, then patch it."""
        self._loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Notices the import of typeguard._decorators (and only that) to patch it once it has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        """Find typeguard._decorators through the other finders, and wrap its loader."""
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
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
