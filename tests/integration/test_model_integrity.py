"""The model that is served is the model that was checked: swapped bytes and off-contract graphs on a real Triton.

Each bad version is refused by the next step that would use it (export rerun, benchmark, validate-serving),
and by Triton itself (the CPU model.py) when something loads it behind the steps' back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from mlrelease.errors import GateFailed, StepError
from mlrelease.model.estimator import EtaModel
from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import to_onnx
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.serving import local_triton
from mlrelease.serving.cpu_repo import sync_cpu_repository
from mlrelease.serving.endpoint import publish_to_local_server
from mlrelease.serving.local_triton import TritonPaths
from mlrelease.serving.reconcile import ensure_ready
from mlrelease.serving.triton_repo import (
    model_repository,
    parity_file,
    read_config,
    set_version_policy,
    version_dir,
    write_version,
)
from mlrelease.settings import Settings
from mlrelease.steps.benchmark import benchmark
from mlrelease.steps.export import export
from mlrelease.steps.rollout.status import status as rollout_status
from mlrelease.steps.train import train
from mlrelease.steps.validate_serving import validate_serving
from mlrelease.storage import sha256
from tests.integration import test_model_path as model_path
from tests.unit.test_integrity import wide_eta, without_output

pytestmark = pytest.mark.integration
world = model_path.world  # the same module-scoped world: its own MLRELEASE_HOME and a real tritonserver


@pytest.fixture(scope="module")
def champion(world) -> Iterator[int]:
    """v1 trained, exported, validated on Triton and made champion (no benchmark: nothing here measures speed)."""
    version = train(world, model_path.WINDOW)["model_version"]  # the world approved its partitions (validate-data)
    export(world, version)
    validate_serving(world, version)
    Registry.from_settings(world).client().set_registered_model_alias(MODEL_NAME, CHAMPION, str(version))
    yield version


def _served(world: Settings) -> list[int]:
    return list(read_config(model_repository(world), MODEL_NAME).version_policy.specific.versions)


def _one_line_naming(exc: BaseException, *parts: str) -> str:
    message = str(exc)
    assert "\n" not in message and "Traceback" not in message, message
    for part in parts:
        assert part in message, (part, message)
    return message


def test_swapped_bytes_are_refused_by_each_step_and_by_triton(world, champion):
    registry = Registry.from_settings(world)
    root = model_repository(world)
    version = model_path._register_copy(world, lambda m: None)
    export(world, version)  # a clean export: recorded, tagged onnx_sha256, in the served set
    path = version_dir(root, MODEL_NAME, version) / "model.onnx"
    recorded = json.loads((path.parent / "model_config.json").read_text())["sha256"]
    rng = np.random.default_rng(7)
    other = to_onnx(EtaModel(max_iter=5).fit(rng.random((300, len(FEATURES))), rng.random(300)))
    path.write_bytes(other)  # a valid graph, other weights, written in place as a careless copy would
    digests = (sha256(path)[:12], recorded[:12], f"v{version} model.onnx at {path}")

    with pytest.raises(GateFailed) as refused:
        export(world, version)  # a rerun verifies before it derives anything from the bytes
    _one_line_naming(refused.value, *digests)
    assert registry.version_tags(version)["export_status"] == "failed"

    with pytest.raises(GateFailed) as refused:
        benchmark(world, version, perf=model_path.FAST_PERF)  # refused before perf_analyzer runs
    _one_line_naming(refused.value, *digests)
    assert _served(world) == [champion]  # refused by a gate: it leaves the policy, so no restart offers it again
    assert model_path._client().version_ready(MODEL_NAME, champion)

    with pytest.raises(GateFailed, match=f"version {version} failed serving validation") as refused:
        validate_serving(world, version)
    _one_line_naming(refused.value, *digests)
    assert version not in _served(world) and registry.version_tags(version)["validation_status"] == "failed"

    # Behind the steps' back (a hand-edited policy, a direct load): Triton's model.py refuses the same bytes.
    client = model_path._client()
    set_version_policy(root, MODEL_NAME, [champion, version])
    sync_cpu_repository(root, TritonPaths.from_settings(world).cpu_repository, MODEL_NAME)
    try:
        with pytest.raises(StepError, match="the file that would be served is not the file that was checked"):
            client.load(MODEL_NAME)
        assert not client.version_ready(MODEL_NAME, version)
        # With the swapped version declared, `triton up` (here: already running, so it reconciles) loads every
        # other version and refuses that one, naming its digest; a rollback that needs it fails naming it too.
        client.unload(MODEL_NAME)
        _until_not_ready(client, champion)
        up = local_triton.up(world)["serving"]
        assert list(up) == [MODEL_NAME]
        assert up[MODEL_NAME]["serving"] == [champion] and up[MODEL_NAME]["reloaded"] == [champion]
        assert list(up[MODEL_NAME]["refused"]) == [str(version)]
        _one_line_naming(StepError(up[MODEL_NAME]["refused"][str(version)]), *digests)
        assert client.version_ready(MODEL_NAME, champion) and not client.version_ready(MODEL_NAME, version)
        _one_line_naming(StepError(rollout_status(world)["triton"]["refused"][str(version)]), *digests)
        with pytest.raises(StepError, match=rf"version\(s\) \[{version}\] cannot be served") as refused:
            ensure_ready(world, client.url, [version])
        _one_line_naming(refused.value, *digests)
        # And after a crash: the supervisor restarts the server, whose reconcile again serves all but that one.
        paths = TritonPaths.from_settings(world)
        killed = local_triton.running_pid(paths)
        os.kill(killed, signal.SIGKILL)
        _until(lambda: local_triton.running_pid(paths) not in (None, killed), "a new server")
        _until(lambda: local_triton.status(world)["supervisor"]["phase"] == "serving", "serving again")
        client.close()
        client = model_path._client()
        assert client.version_ready(MODEL_NAME, champion) and not client.version_ready(MODEL_NAME, version)
        (line,) = local_triton.status(world)["supervisor"]["refused"]
        _one_line_naming(StepError(line), f"parcel_eta v{version} is declared but not served", *digests)
        assert f"reconcile: {line}" in paths.supervisor_log.read_text()
    finally:
        set_version_policy(root, MODEL_NAME, [champion])
        publish_to_local_server(world, root)
        client.load(MODEL_NAME)
    assert client.version_ready(MODEL_NAME, champion)


def _until(check, what: str, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what} within {seconds:.0f} s"
        time.sleep(0.2)


def _until_not_ready(client, version: int, seconds: float = 30.0) -> None:
    """Unloading is asynchronous in Triton: wait until the version is gone."""
    deadline = time.monotonic() + seconds
    while client.version_ready(MODEL_NAME, version):
        assert time.monotonic() < deadline, f"v{version} still ready {seconds:.0f} s after its unload"
        time.sleep(0.1)


def _planted(world: Settings, champion: int, edit: Callable[[bytes], bytes]) -> int:
    """A registered version whose published graph is the champion's, edited; in the served set with parity outputs.

    As an export from before the contract checks could have left it: its record matches its bytes.
    """
    registry = Registry.from_settings(world)
    root = model_repository(world)
    version = model_path._register_copy(world, lambda m: None)
    good = (version_dir(root, MODEL_NAME, champion) / "model.onnx").read_bytes()
    write_version(root, MODEL_NAME, version, edit(good), {"mlflow_run_id": registry.run_id(version)})
    set_version_policy(root, MODEL_NAME, [champion, version])
    parity_file(world, version).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(parity_file(world, champion), parity_file(world, version))
    return version


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (wide_eta, ("output eta_prediction: expected", "[-1, 1], found", "[-1, 2]")),
        (lambda b: without_output(b, "confidence_score"), ("output confidence_score: expected", "no such graph")),
    ],
    ids=["eta_prediction [N, 2]", "no confidence_score"],
)
def test_a_graph_that_is_not_the_config_is_refused_and_unloaded(world, champion, edit, named):
    registry = Registry.from_settings(world)
    version = _planted(world, champion, edit)

    with pytest.raises(GateFailed, match=f"ONNX graph of version {version} cannot be served") as refused:
        export(world, version)  # the rerun checks the published bytes: one line, no traceback
    _one_line_naming(refused.value, *named)
    tags = registry.version_tags(version)
    assert tags["export_status"] == "failed" and named[0] in tags["export_reason"]

    with pytest.raises(GateFailed, match=f"version {version} failed serving validation") as refused:
        validate_serving(world, version)  # Triton refuses the load (model.py): out of service, exit 3
    _one_line_naming(refused.value, *named)
    client = model_path._client()
    assert not client.version_ready(MODEL_NAME, version)
    assert client.version_ready(MODEL_NAME, champion), "the champion must keep serving"
    assert version not in _served(world)
    assert registry.version_tags(version)["validation_status"] == "failed"
