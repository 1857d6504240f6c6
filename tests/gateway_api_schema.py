"""Validate Gateway API objects against the upstream CRD schemas (via tests/tools, an npm package)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).parent / "tools"
SCRIPT = TOOLS / "validate-gateway-api.mjs"


def validate_gateway_api(objects: list[dict[str, Any]]) -> list[str | None]:
    """Per object: None when it is a valid Gateway API object, else the schema's complaint."""
    return run_validator(SCRIPT, "gateway-api", objects)


def run_validator(script: Path, package: str, objects: list[dict[str, Any]]) -> list[str | None]:
    """Run one of tests/tools' schema validators (`package` under @kubernetes-models) on the objects."""
    node = shutil.which("node")
    if node is None or not (TOOLS / "node_modules" / "@kubernetes-models" / package).is_dir():
        raise RuntimeError(f"the {package} validator is not installed: `make test` runs npm ci --prefix tests/tools")
    proc = subprocess.run(
        [node, str(script)], input=json.dumps(objects), capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(proc.stdout))
