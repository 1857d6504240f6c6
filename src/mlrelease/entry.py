"""The `mlrelease` console script: the CLI, or one line naming why this process cannot run it.

The model modules resolve the model this process releases when they are imported (`release_spec.process_spec`:
MLRELEASE_MODEL, else the only declared spec), and the CLI imports them; a process that cannot resolve its model
(several specs declared and none named, a name no spec declares, an invalid spec) fails here with the spec's own
message and the step-error exit code, not with a traceback.
"""

from __future__ import annotations

import sys

from mlrelease.errors import StepError
from mlrelease.exit_codes import EXIT_STEP_ERROR


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a model that cannot be resolved at import is one line on stderr and EXIT_STEP_ERROR."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["models"]:  # about every declared model: runs without resolving this process's
        from mlrelease.models_cli import main as models_main

        return models_main(argv)
    try:
        from mlrelease.cli import main as cli_main
    except StepError as exc:
        print(f"mlrelease: error: {exc}", file=sys.stderr)
        return EXIT_STEP_ERROR
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
