"""The Triton model repository: config.pbtxt built from Triton's own protobuf schema, immutable numbered versions.

Layout (production, GPU):   <root>/<model>/config.pbtxt
                            <root>/<model>/<version>/model.onnx
                            <root>/<model>/<version>/model_config.json
A version directory is written to a temporary sibling and renamed into place, so Triton never sees a
half-written version, and an existing version is never overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.settings import Settings
from mlrelease.storage import sha256, write_text_atomic

MODEL_FILE = "model.onnx"
METADATA_FILE = "model_config.json"
CONFIG_FILE = "config.pbtxt"  # a model folder's Triton config: what the repository serves of it


def model_repository(settings: Settings) -> Path:
    """The production-format Triton model repository (MLRELEASE_MODEL_REPOSITORY, default under MLRELEASE_HOME)."""
    return Path(os.environ.get("MLRELEASE_MODEL_REPOSITORY", settings.home / "model_repository")).resolve()


def parity_file(settings: Settings, version: int) -> Path:
    """Where the export keeps the parity sample and its expected outputs for validate-serving."""
    return settings.home / "exports" / MODEL_NAME / str(version) / "parity.npz"


def served_versions(root: Path, registry: Registry, version: int) -> list[int]:
    """Versions to keep loaded: the champion (if it is in the repository) and the new candidate."""
    champion = registry.alias_version(CHAMPION)
    keep = {version}
    if champion is not None and champion in versions_present(root, MODEL_NAME):
        keep.add(champion)
    return sorted(keep)


@dataclass(frozen=True)
class ServingConfig:
    """Production serving parameters for the model's config.pbtxt."""

    max_batch_size: int = 256
    preferred_batch_sizes: tuple[int, ...] = (16, 64)
    max_queue_delay_us: int = 500
    gpu_instances: int = 1
    # Zero rows run through each instance at load, before the version is ready: one at batch 1 and one at the
    # gateway's usual micro-batch, so neither the first request nor the first batch pays for a cold runtime.
    warmup_batch_sizes: tuple[int, ...] = (1, 64)


def build_config(
    model: str, n_features: int, outputs: tuple[str, ...], versions: list[int], serving: ServingConfig
) -> mc.ModelConfig:
    """The production ModelConfig: ONNX Runtime on GPU, dynamic batching, the listed versions kept loaded."""
    if not versions:
        raise ValueError("a model config needs at least one version to serve")
    config = mc.ModelConfig(name=model, platform="onnxruntime_onnx", max_batch_size=serving.max_batch_size)
    config.input.add(name="features", data_type=mc.TYPE_FP32, dims=[n_features])
    for name in outputs:
        config.output.add(name=name, data_type=mc.TYPE_FP32, dims=[1])
    config.dynamic_batching.preferred_batch_size.extend(serving.preferred_batch_sizes)
    config.dynamic_batching.max_queue_delay_microseconds = serving.max_queue_delay_us
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, count=serving.gpu_instances)
    config.version_policy.specific.versions.extend(sorted(set(versions)))
    add_warmup(config, "features", n_features, serving.warmup_batch_sizes)
    return config


def add_warmup(config: mc.ModelConfig, input_name: str, n_features: int, batch_sizes: tuple[int, ...]) -> None:
    """Append a zero-data `model_warmup` sample per batch size (capped by max_batch_size, duplicates dropped)."""
    cap = config.max_batch_size or 1
    for size in sorted({min(max(b, 1), cap) for b in batch_sizes}):
        sample = config.model_warmup.add(name=f"zeros_batch_{size}", batch_size=size, count=1)
        tensor = sample.inputs[input_name]
        tensor.data_type = mc.TYPE_FP32
        tensor.dims.extend([n_features])
        tensor.zero_data = True


def to_pbtxt(config: mc.ModelConfig) -> str:
    """config.pbtxt text for a ModelConfig."""
    return text_format.MessageToString(config)


def parse_pbtxt(text: str) -> mc.ModelConfig:
    """A ModelConfig from config.pbtxt text; malformed text raises text_format.ParseError."""
    return text_format.Parse(text, mc.ModelConfig())


def version_dir(root: Path, model: str, version: int) -> Path:
    """Directory of one model version."""
    return root / model / str(version)


def write_version(root: Path, model: str, version: int, model_bytes: bytes, metadata: dict[str, Any]) -> bool:
    """Publish a version atomically; returns False (and changes nothing) when the version already exists."""
    target = version_dir(root, model, version)
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{version}.staging-"))
    try:
        (staging / MODEL_FILE).write_bytes(model_bytes)
        # sha256 and size are what integrity.verify_version checks before any step uses the file.
        meta = {**metadata, "version": version, "sha256": sha256(staging / MODEL_FILE), "size": len(model_bytes)}
        (staging / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        for path in (staging / MODEL_FILE, staging / METADATA_FILE):
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(staging, target)  # atomic on one filesystem; fails if another writer got there first
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return True


def write_config(root: Path, config: mc.ModelConfig) -> Path:
    """Replace the model's config.pbtxt atomically."""
    path = root / config.name / CONFIG_FILE
    write_text_atomic(path, to_pbtxt(config))
    return path


def read_config(root: Path, model: str) -> mc.ModelConfig:
    """The model's config.pbtxt in a repository, parsed."""
    return parse_pbtxt((root / model / CONFIG_FILE).read_text(encoding="utf-8"))


def set_version_policy(root: Path, model: str, versions: list[int]) -> bool:
    """Make the config's specific version policy exactly `versions` (sorted); True when the file changed."""
    config = read_config(root, model)
    wanted = sorted(set(versions))
    if list(config.version_policy.specific.versions) == wanted:
        return False
    del config.version_policy.specific.versions[:]
    config.version_policy.specific.versions.extend(wanted)
    write_config(root, config)
    return True


def disable_config(root: Path, model: str) -> None:
    """Stop a model from being served by any later (re)load: config.pbtxt becomes config.pbtxt.disabled.

    Used when the only version in the policy failed: the repository must not say "serve it". The next
    export writes a fresh config.pbtxt.
    """
    config = root / model / CONFIG_FILE
    if config.exists():
        os.replace(config, config.with_name("config.pbtxt.disabled"))


def read_metadata(root: Path, model: str, version: int) -> dict[str, Any]:
    """A version's model_config.json; a missing version is a FileNotFoundError naming it."""
    path = version_dir(root, model, version) / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"model {model} version {version} is not in the repository {root}")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def versions_present(root: Path, model: str) -> list[int]:
    """Published versions of a model (numbered directories, staging directories excluded)."""
    model_dir = root / model
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
