"""Step `apply-features`: make the registry match the feature repo, as `feast apply` does.

Objects defined in the repo are registered (and their online tables created); objects of the
store's project that the repo no longer defines are deleted in the same apply, and the online
tables of removed views are dropped, so a removed view is no longer materialized or checked.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from mlrelease.errors import StepError
from mlrelease.feast_store import open_store
from mlrelease.release_spec import ReleaseSpec, load_specs
from mlrelease.settings import Settings
from mlrelease.spec_features import repo_problems

# Result keys for the object types `feast apply` deletes; projects are never deleted by an apply.
_REMOVED_KEYS = {
    "DATA_SOURCE": "data_sources",
    "ENTITY": "entities",
    "FEATURE_VIEW": "feature_views",
    "ON_DEMAND_FEATURE_VIEW": "on_demand_feature_views",
    "STREAM_FEATURE_VIEW": "stream_feature_views",
    "LABEL_VIEW": "label_views",
    "FEATURE_SERVICE": "feature_services",
    "PERMISSION": "permissions",
}


def _parse(settings: Settings, store: Any) -> Any:
    """The repo's objects, with the store's project added when the repo defines none (as `feast apply`)."""
    from feast.project import Project
    from feast.repo_operations import get_repo_files, parse_repo, py_path_to_module

    # parse_repo imports the repo's files as modules relative to the working directory, as `feast apply` does.
    os.chdir(settings.feature_repo)
    if str(settings.feature_repo) in sys.path:
        sys.path.remove(str(settings.feature_repo))
    sys.path.insert(0, str(settings.feature_repo))
    # Forget earlier imports of the repo's modules: their sources depend on MLRELEASE_HOME at import time.
    for repo_file in get_repo_files(settings.feature_repo):
        sys.modules.pop(py_path_to_module(repo_file), None)
    repo = parse_repo(settings.feature_repo)
    if not repo.projects:
        repo.projects.append(Project(name=store.project, description=store.config.project_description or ""))
    elif len(repo.projects) > 1 or repo.projects[0].name != store.project:
        names = ", ".join(p.name for p in repo.projects)
        raise StepError(f"feature repo {settings.feature_repo} defines project(s) {names}, expected {store.project}")
    return repo


def apply_features(settings: Settings, specs: Iterable[ReleaseSpec] | None = None) -> dict[str, Any]:
    """Apply the feature repo, deleting what it no longer defines; a repo that does not parse or apply fails.

    A repo that would no longer give a model of `specs` (default: every declared one) the features its release
    spec reads is refused before anything is applied, one line per problem.
    """
    began = time.perf_counter()
    store = open_store(settings)
    from feast.diff.registry_diff import extract_objects_for_keep_delete_update_add
    from feast.infra.registry.registry import FEAST_OBJECT_TYPES, FeastObjectType

    captured = io.StringIO()
    try:
        # Feast prints to stdout and may sys.exit on a broken repo: keep both inside this step.
        with contextlib.redirect_stdout(captured):
            repo = _parse(settings, store)
            if not repo.feature_views:  # checked before applying: an empty repo must not delete every view
                raise StepError(f"feature repo {settings.feature_repo} defines no feature views")
            # Every declared model must still get its features: a repo that breaks one is refused before any change.
            problems = repo_problems(load_specs().values() if specs is None else specs, repo.feature_services)
            if problems:
                raise StepError(f"feature repo {settings.feature_repo} is not applied: " + "; ".join(problems))
            # The registry diff `feast apply` uses (repo_operations.extract_objects_for_apply_delete), kept per type.
            _, to_delete, to_update, to_add = extract_objects_for_keep_delete_update_add(
                store.registry, store.project, repo
            )
            to_apply = [obj for kind in FEAST_OBJECT_TYPES for obj in (*to_add[kind], *to_update[kind])]
            removed = {
                key: sorted(obj.name for obj in to_delete[FeastObjectType[kind]]) for kind, key in _REMOVED_KEYS.items()
            }
            # partial=False deletes `objects_to_delete` from the registry and drops removed views' online tables.
            store.apply(
                to_apply,
                objects_to_delete=[obj for kind in FEAST_OBJECT_TYPES for obj in to_delete[kind]],
                partial=False,
            )
    except StepError:
        raise
    except SystemExit:
        detail = captured.getvalue().strip().splitlines()
        raise StepError(
            f"feature repo {settings.feature_repo} failed to apply: {detail[-1] if detail else 'feast exited'}"
        ) from None
    except Exception as exc:
        raise StepError(f"feature repo {settings.feature_repo} failed to apply: {type(exc).__name__}: {exc}") from None
    return {
        "project": store.project,
        "online_store": settings.online_store,
        "feature_views": sorted(fv.name for fv in repo.feature_views),
        "feature_services": sorted(fs.name for fs in repo.feature_services),
        "removed": removed,
        "duration_s": round(time.perf_counter() - began, 3),
    }
