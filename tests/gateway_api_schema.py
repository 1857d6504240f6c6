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
    node = shutil.which("node")
    if node is None or not (TOOLS / "node_modules" / "@kubernetes-models" / "gateway-api").is_dir():
        raise RuntimeError("the Gateway API validator is not installed: `make setup` runs npm ci --prefix tests/tools")
    proc = subprocess.run(
        [node, str(SCRIPT)], input=json.dumps(objects), capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(proc.stdout))
