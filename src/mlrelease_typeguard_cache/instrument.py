"""The cache behind mlrelease_typeguard_cache: typeguard 4.6.1's `instrument` (MIT), with its result kept on disk.

Imported only once typeguard itself is (the package's `.pth` line stays cheap for every other process).
"""

from __future__ import annotations

import hashlib
import inspect
import marshal
import os
import sys
from pathlib import Path
from types import CodeType, FrameType, FunctionType
from typing import Any, cast

from mlrelease_typeguard_cache import CACHE_ENV, SUPPORTED


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
