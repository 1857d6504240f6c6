"""`mlrelease deploy render|check`: Kubernetes manifests from validated values (wired by `register`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mlrelease.settings import Settings


def _cmd_render(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.deploy.render import (
        check_objects,
        render_create_once,
        render_file,
        render_monitoring,
        summary,
        write_objects,
        yaml_stream,
    )

    values, objects = render_file(args.values)
    check_objects(objects, args.kubernetes_version)  # nothing is written unless every object is valid
    if not args.out:
        sys.stdout.write(yaml_stream(objects))
        args.quiet = True  # stdout is the manifest stream: no JSON result after it
        return {}
    written = write_objects(objects, args.out)
    # Kept apart so `kubectl apply -f OUT` never resets the routing a rollout holds in the HTTPRoute.
    once = render_create_once(args.values)
    created = write_objects(once, Path(args.out) / "create-once") if once else []
    # Apart too: they need the Prometheus Operator's CRDs (kubectl apply -f OUT/monitoring once the operator runs).
    monitoring = render_monitoring(args.values)
    monitors = write_objects(monitoring, Path(args.out) / "monitoring") if monitoring else []
    return {
        **summary(values, objects, args.kubernetes_version),
        "files": [str(p) for p in written],
        "create_once": [str(p) for p in created],
        "monitoring": [str(p) for p in monitors],
    }


def _cmd_check(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.deploy.render import check_objects, render_file, summary

    values, objects = render_file(args.values)
    check_objects(objects, args.kubernetes_version)
    return {"valid": True, **summary(values, objects, args.kubernetes_version)}


def register(subparsers: Any) -> None:
    """Add `deploy render` and `deploy check` to the top-level `mlrelease` subparsers."""
    from mlrelease.deploy.kube_schema import KUBERNETES_VERSION  # light: the CLI parser is built on every command

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--values", required=True, help="deploy values YAML (e.g. deploy/values.yaml)")
    common.add_argument(
        "--kubernetes-version", default=KUBERNETES_VERSION, help="validate against this Kubernetes schema"
    )
    deploy = subparsers.add_parser("deploy", help="Kubernetes manifests for the gateway, Triton, RBAC, policies")
    commands = deploy.add_subparsers(dest="deploy_command", required=True)
    render = commands.add_parser("render", parents=[common], help="validate, then write the manifests")
    render.add_argument("--out", help="write one file per object into this new directory (default: stream to stdout)")
    render.set_defaults(handler=_cmd_render, result_to_xcom=False)
    check = commands.add_parser("check", parents=[common], help="render and validate; print a summary")
    check.set_defaults(handler=_cmd_check, result_to_xcom=False)
