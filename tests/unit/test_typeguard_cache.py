"""The typeguard cache changes nothing but speed: the same instrumented code and type errors, cold or warm."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A module shaped like Feast's: a class under @typechecked with a property and a classmethod, and a nested function.
MODULE = """
from typeguard import typechecked


@typechecked
class Source:
    def __init__(self, name: str, rows: int = 0) -> None:
        self.name, self.rows = name, rows

    @property
    def label(self) -> str:
        return self.name.upper()

    @classmethod
    def empty(cls, name: str) -> "Source":
        return cls(name)


def factory():
    @typechecked
    def count(value: int) -> int:
        return value

    return count
"""

PROBE = """
import hashlib, json, sys
import mlrelease_typeguard_cache as cache
cache.activate()
import typeguard
from typeguard import TypeCheckError
import shaped

def shape(code):
    # marshal's bytes vary with reference counts; the code's own fields do not
    consts = tuple(shape(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            code.co_filename, code.co_firstlineno, code.co_linetable, code.co_exceptiontable)

def digest(f):
    return hashlib.sha256(repr(shape(f.__code__)).encode()).hexdigest()

def refuses(call):
    try:
        call()
    except TypeCheckError:
        return True
    return False

source = shaped.Source("a", 1)
print(json.dumps({
    "patched": typeguard._decorators.instrument.__module__ == "mlrelease_typeguard_cache.instrument",
    "codes": [digest(shaped.Source.__init__), digest(shaped.Source.label.fget), digest(shaped.Source.empty.__func__),
              digest(shaped.factory())],
    "refused": [refuses(lambda: shaped.Source(1)), refuses(lambda: shaped.Source("a", "x")),
                refuses(lambda: shaped.Source.empty(2)), refuses(lambda: shaped.factory()("x"))],
    "answers": [source.label, shaped.Source.empty("b").name, shaped.factory()(3)],
}))
"""


def _probe(tmp_path: Path, cache: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "MLRELEASE_TYPEGUARD_CACHE": cache, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


@pytest.fixture
def shaped(tmp_path: Path) -> Path:
    (tmp_path / "shaped.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    return tmp_path


def test_cached_instrumentation_is_typeguards_own(shaped: Path) -> None:
    cache = shaped / "cache"
    plain = _probe(shaped, "off")
    cold = _probe(shaped, str(cache))
    stored = sorted(p.name for p in cache.iterdir())
    warm = _probe(shaped, str(cache))

    assert not plain["patched"] and cold["patched"] and warm["patched"]
    assert plain["codes"] == cold["codes"] == warm["codes"]  # byte for byte the code typeguard compiles
    assert plain["refused"] == cold["refused"] == warm["refused"] == [True, True, True, True]
    assert plain["answers"] == warm["answers"] == ["A", "b", 3]
    # one entry per instrumented function: __init__, the property, the classmethod and the nested function
    assert len(stored) == 4 and all(name.endswith(".code") for name in stored)


def test_a_changed_source_file_is_instrumented_again(shaped: Path) -> None:
    cache = shaped / "cache"
    _probe(shaped, str(cache))
    module = shaped / "shaped.py"
    module.write_text(module.read_text().replace("return self.name.upper()", "return self.name.lower()"))
    changed = _probe(shaped, str(cache))
    assert changed["answers"][0] == "a"  # the new source runs, not a stale cached body
    assert len(list(cache.glob("*.code"))) == 8  # the old entries stay (keyed by the old mtime)


def test_a_corrupt_entry_is_recomputed(shaped: Path) -> None:
    cache = shaped / "cache"
    first = _probe(shaped, str(cache))
    for entry in cache.glob("*.code"):
        entry.write_bytes(b"not marshal")
    assert _probe(shaped, str(cache))["codes"] == first["codes"]
