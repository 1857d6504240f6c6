"""`mlrelease models …`: the declared models, read from their release specs.

These commands are about every model, never about the one a process releases, so they run without resolving it
(the console script routes them here before importing the rest of the CLI): `mlrelease models list` works with
MLRELEASE_MODEL unset while several models are declared.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mlrelease.errors import StepError
from mlrelease.exit_codes import EXIT_OK, EXIT_STEP_ERROR
from mlrelease.release_spec import SPEC_FILE, SPECS_DIR, load_specs


def models_list(folder: Path | None = None) -> dict[str, Any]:
    """Every release spec of `folder` (default: the specs folder), validated, as JSON-ready summaries."""
    folder = folder or SPECS_DIR
    return {
        "specs": str(folder),
        "models": [
            {
                "name": spec.name,
                "task": str(spec.task),
                "spec": str(folder / spec.name / SPEC_FILE),
                "description": spec.description,
                "feature_service": spec.features.service,
                "label": spec.features.label.column,
                "inputs": len(spec.features.columns),
                "outputs": {o.name: o.role for o in spec.outputs},
                "rollout_plan": spec.rollout_plan,
            }
            for spec in load_specs(folder).values()
        ],
    }


def add_commands(sub: Any) -> None:
    """Register `models list` on the CLI's subcommands (its handler gets the parsed args)."""
    models = sub.add_parser("models", help="the models declared by release specs").add_subparsers(
        dest="models_command", required=True
    )
    listing = models.add_parser("list", help="every models/<name>/release.yaml, validated (JSON)")
    listing.add_argument("--specs", help="the specs folder (default: the repository's models/)")
    listing.set_defaults(
        handler=lambda args, _settings: models_list(Path(args.specs) if args.specs else None), result_to_xcom=False
    )


def main(argv: list[str]) -> int:
    """`mlrelease models …` on its own: the JSON on stdout, or one line on stderr and the step-error exit code."""
    parser = argparse.ArgumentParser(prog="mlrelease")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        result = args.handler(args, None)
    except StepError as exc:
        print(f"mlrelease models: error: {exc}", file=sys.stderr)
        return EXIT_STEP_ERROR
    print(json.dumps(result, indent=2))
    return EXIT_OK
