"""The code version a model was built from."""

from __future__ import annotations

import os
import subprocess

from mlrelease.settings import REPO_ROOT


def git_commit() -> str:
    """MLRELEASE_GIT_COMMIT (set in images), else `git rev-parse HEAD` of the checkout, else 'unknown'."""
    if os.environ.get("MLRELEASE_GIT_COMMIT"):
        return os.environ["MLRELEASE_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"
