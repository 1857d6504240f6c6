"""Step `apply-features`: register the repo's Feast objects and create their online tables."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from typing import Any

from mlrelease.errors import StepError
from mlrelease.feast_store import open_store
from mlrelease.settings import Settings


def apply_features(settings: Settings) -> dict[str, Any]:
    """Parse the feature repo and apply it; a repo that does not parse or apply fails naming why."""
    began = time.perf_counter()
    store = open_store(settings)
    from feast.repo_operations import get_repo_files, parse_repo, py_path_to_module

    captured = io.StringIO()
    try:
        # Feast prints to stdout and may sys.exit on a broken repo: keep both inside this step.
        # parse_repo imports the repo's files as modules relative to the working directory, as `feast apply` does.
        os.chdir(settings.feature_repo)
        if str(settings.feature_repo) in sys.path:
            sys.path.remove(str(settings.feature_repo))
        sys.path.insert(0, str(settings.feature_repo))
        # Forget earlier imports of the repo's modules: their sources depend on MLRELEASE_HOME at import time.
        for repo_file in get_repo_files(settings.feature_repo):
            sys.modules.pop(py_path_to_module(repo_file), None)
        with contextlib.redirect_stdout(captured):
            repo = parse_repo(settings.feature_repo)
            objects: list[Any] = [*repo.data_sources, *repo.entities, *repo.feature_views, *repo.feature_services]
            store.apply(objects)
    except SystemExit:
        detail = captured.getvalue().strip().splitlines()
        raise StepError(
            f"feature repo {settings.feature_repo} failed to apply: {detail[-1] if detail else 'feast exited'}"
        ) from None
    except Exception as exc:
        raise StepError(f"feature repo {settings.feature_repo} failed to apply: {type(exc).__name__}: {exc}") from None
    if not repo.feature_views:
        raise StepError(f"feature repo {settings.feature_repo} defines no feature views")
    return {
        "project": store.project,
        "online_store": settings.online_store,
        "feature_views": sorted(fv.name for fv in repo.feature_views),
        "feature_services": sorted(fs.name for fs in repo.feature_services),
        "duration_s": round(time.perf_counter() - began, 3),
    }
