"""Derive the embedded-default CPU repository from the production one, without changing the production one.

The CPU tritonserver available here has only the python backend, so each version is served by a
python-backend `model.py` that runs the very same model.onnx with onnxruntime. Everything else in the
config (name, batching, inputs, outputs, version policy) is kept; the platform becomes backend
"python" and GPU instance groups become CPU ones. Each version's export record (model_config.json) is
copied next to model.py, which checks model.onnx against it before serving it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from mlrelease.serving.triton_repo import METADATA_FILE, MODEL_FILE, read_config, sha256, to_pbtxt, versions_present
from mlrelease.storage import write_text_atomic

PYTHON_MODEL = Path(__file__).with_name("onnx_python_model.py")


def cpu_config(production: mc.ModelConfig, versions: list[int] | None = None) -> mc.ModelConfig:
    """The production config translated for the python backend on CPU (serving only `versions` when given)."""
    cpu = mc.ModelConfig()
    cpu.CopyFrom(production)
    if versions is not None:
        del cpu.version_policy.specific.versions[:]
        cpu.version_policy.specific.versions.extend(sorted(versions))
    cpu.ClearField("platform")
    cpu.backend = "python"
    del cpu.instance_group[:]
    cpu.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    return cpu


def sync_cpu_repository(
    production_root: Path, cpu_root: Path, model: str, *, serve_only: list[int] | None = None
) -> list[int]:
    """Mirror one model into the CPU repository: config translated, each version's ONNX linked with model.py.

    `serve_only` narrows the mirror's policy (and what is linked) to those versions: the ones that verified,
    so a refused version's file is never offered to the server.
    """
    production = read_config(production_root, model)
    versions = versions_present(production_root, model)
    if serve_only is not None:
        versions = [v for v in versions if v in serve_only]
    for version in versions:
        src, dst = production_root / model / str(version), cpu_root / model / str(version)
        if _mirrors(src, dst):
            continue
        shutil.rmtree(dst, ignore_errors=True)  # stale: a reset repository reused the number, or model.py changed
        staging = cpu_root / model / f".{version}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        if _same_fs(src, staging):  # a hard link costs no space and keeps the very same bytes
            os.link(src / MODEL_FILE, staging / MODEL_FILE)
        else:
            shutil.copy2(src / MODEL_FILE, staging / MODEL_FILE)
        shutil.copy2(src / METADATA_FILE, staging / METADATA_FILE)  # what model.py verifies model.onnx against
        shutil.copy2(PYTHON_MODEL, staging / "model.py")
        os.rename(staging, dst)
    write_text_atomic(cpu_root / model / "config.pbtxt", to_pbtxt(cpu_config(production, serve_only)))
    return versions


def _mirrors(src: Path, dst: Path) -> bool:
    """Whether the CPU version directory already serves exactly the production bytes, record and current model.py."""
    if not all((dst / name).is_file() for name in (MODEL_FILE, METADATA_FILE, "model.py")):
        return False
    if (dst / METADATA_FILE).read_bytes() != (src / METADATA_FILE).read_bytes():
        return False
    same_model = os.path.samefile(src / MODEL_FILE, dst / MODEL_FILE) or sha256(src / MODEL_FILE) == sha256(
        dst / MODEL_FILE
    )
    return same_model and (dst / "model.py").read_bytes() == PYTHON_MODEL.read_bytes()


def _same_fs(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev
