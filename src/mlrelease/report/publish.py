"""Replace a report folder as a whole: build beside it, then swap by renames (never a half-written report)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mlrelease.storage import file_lock

STAGING_PREFIX = ".staging-"
RETIRED_PREFIX = ".retired-"


def _clear_leftovers(parent: Path, name: str) -> None:
    """Folders an earlier, crashed build left behind (never the live one)."""
    for prefix in (STAGING_PREFIX, RETIRED_PREFIX):
        for stale in parent.glob(f"{prefix}{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def _staging(target: Path) -> Iterator[Path]:
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{target.name}-", dir=target.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_dir(target: Path, build: Callable[[Path], object]) -> None:
    """Run `build(staging)` in a fresh sibling folder, then move it to `target`, replacing any old one.

    A rename is atomic but cannot replace a non-empty folder, so the old one is first renamed aside:
    a reader may find no folder for an instant, never a partly written one. If `build` fails, the old
    report stays as it was. Concurrent builds of the same target are serialised by a lock file.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        _clear_leftovers(target.parent, target.name)
        with _staging(target) as staging:
            build(staging)
            os.chmod(staging, 0o755)  # mkdtemp makes it 0700; the report is served to others
            retired = None
            if target.exists():
                retired = Path(tempfile.mkdtemp(prefix=f"{RETIRED_PREFIX}{target.name}-", dir=target.parent))
                os.replace(target, retired / target.name)
            os.replace(staging, target)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
