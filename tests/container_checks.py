"""Static checks of docker/: a small Dockerfile reader and the Compose cross-references a JSON schema cannot see."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

ARG_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: keyword (upper case), its argument text, the line it starts on."""

    keyword: str
    value: str
    line: int

    def json_args(self) -> list[str] | None:
        """The exec-form (JSON array) arguments, or None for the shell form."""
        text = self.value.strip()
        if not text.startswith("["):
            return None
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            return None
        return [str(item) for item in parsed] if isinstance(parsed, list) else None


@dataclass
class Stage:
    """A build stage: its base image (global ARG defaults expanded), its alias, its instructions."""

    base: str
    alias: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        """The stage's instructions with this keyword, in order."""
        return [i for i in self.instructions if i.keyword == keyword]


def parse_instructions(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile, with line continuations joined and comment lines dropped (as Docker does)."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction is removed before parsing
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        keyword, _, value = " ".join(part for part in pending if part).partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip(), start))
        pending = []
    if pending:
        raise ValueError(f"line {start}: instruction continues past the end of the file")
    return instructions


def _arg_default(value: str) -> tuple[str, str | None]:
    name, sep, default = value.partition("=")
    return name.strip(), (default.strip().strip('"') if sep else None)


def expand(text: str, args: dict[str, str | None]) -> str:
    """`text` with $NAME / ${NAME} replaced by the ARG defaults that are known (unknown ones stay as written)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        value = args.get(name)
        return value if value is not None else match.group(0)

    return ARG_REF.sub(replace, text)


def parse_stages(text: str) -> list[Stage]:
    """The build stages of a Dockerfile; FROM lines are expanded with the global (pre-FROM) ARG defaults."""
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for instruction in parse_instructions(text):
        if instruction.keyword == "FROM":
            words = [w for w in instruction.value.split() if not w.startswith("--platform")]
            alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(expand(words[0], global_args), alias))
        elif not stages:
            if instruction.keyword == "ARG":
                name, default = _arg_default(instruction.value)
                global_args[name] = default
        else:
            stages[-1].instructions.append(instruction)
    if not stages:
        raise ValueError("no FROM instruction")
    return stages


def final_stage(text: str) -> Stage:
    """The stage `docker build` produces without --target: the last one."""
    return parse_stages(text)[-1]


def external_bases(stages: list[Stage]) -> list[str]:
    """Base images that are not earlier stages of the same Dockerfile."""
    aliases = {s.alias for s in stages if s.alias}
    return [s.base for s in stages if s.base not in aliases]


def image_tag_problem(reference: str) -> str | None:
    """Why an image reference is not pinned to a fixed tag (unresolved variable, no tag, `latest`), or None."""
    if "$" in reference:
        return f"{reference}: base image has a variable without a default"
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"{reference}: no tag (it means `latest`)"
    tag = last.rsplit(":", 1)[1]
    if tag == "latest":
        return f"{reference}: the `latest` tag is not a pin"
    return None


# --- Compose -------------------------------------------------------------------------------------------------


def schema_problems(document: Any, schema: dict[str, Any]) -> list[str]:
    """Compose Specification schema violations, each prefixed with the path of the offending node."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        problems.append(f"{where}: {error.message}")
    return problems


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    """A service's dependencies as {name: condition} (the short list form means service_started)."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


@dataclass(frozen=True)
class Mount:
    """A service volume entry, normalized: `volume` (named), `bind` (host path) or another type."""

    kind: str
    source: str | None
    target: str


def service_mounts(service: dict[str, Any]) -> list[Mount]:
    """The service's volume entries in one shape (short `src:dst[:mode]` strings and long-form mappings)."""
    mounts = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            mounts.append(Mount(entry.get("type", "volume"), entry.get("source"), entry.get("target", "")))
            continue
        parts = entry.split(":")
        if len(parts) == 1:
            mounts.append(Mount("volume", None, parts[0]))  # anonymous volume
            continue
        source, target = parts[0], parts[1]
        is_path = source.startswith((".", "/", "~", "$"))
        mounts.append(Mount("bind" if is_path else "volume", source, target))
    return mounts


def _secret_names(service: dict[str, Any]) -> list[str]:
    return [s if isinstance(s, str) else s.get("source", "") for s in service.get("secrets") or []]


def _has_healthcheck(service: dict[str, Any], dockerfile_healthcheck: Callable[[dict[str, Any]], bool]) -> bool:
    check = service.get("healthcheck")
    if check is not None:
        return not check.get("disable", False) and check.get("test") not in (None, ["NONE"], "NONE")
    return dockerfile_healthcheck(service)


def _dependency_problems(
    name: str,
    service: dict[str, Any],
    services: dict[str, Any],
    dockerfile_healthcheck: Callable[[dict[str, Any]], bool],
) -> Iterable[str]:
    for target, condition in _depends_on(service).items():
        if target not in services:
            yield f"services/{name}/depends_on: service {target!r} does not exist"
            continue
        if condition == "service_healthy" and not _has_healthcheck(services[target], dockerfile_healthcheck):
            yield f"services/{name}/depends_on: {target!r} is awaited as service_healthy but has no healthcheck"
        restarts = services[target].get("restart") in ("always", "unless-stopped")
        if condition == "service_completed_successfully" and restarts:
            yield f"services/{name}/depends_on: {target!r} must complete, but restarts forever"


def _mount_problems(name: str, service: dict[str, Any], declared: set[str], compose_dir: Path) -> Iterable[str]:
    for mount in service_mounts(service):
        if mount.kind == "volume" and mount.source and mount.source not in declared:
            yield f"services/{name}/volumes: named volume {mount.source!r} is not declared under top-level volumes"
        relative = mount.kind == "bind" and mount.source and not mount.source.startswith(("/", "~", "$"))
        if relative and not (compose_dir / str(mount.source)).exists():
            yield f"services/{name}/volumes: bind-mounted path {mount.source!r} does not exist"


def _build_problems(name: str, service: dict[str, Any], services: dict[str, Any], compose_dir: Path) -> Iterable[str]:
    build = service.get("build")
    if not isinstance(build, dict):
        return
    context = compose_dir / build.get("context", ".")
    if not context.is_dir():
        yield f"services/{name}/build: context {build.get('context')!r} does not exist"
    elif build.get("dockerfile") and not (context / build["dockerfile"]).is_file():
        yield f"services/{name}/build: dockerfile {build['dockerfile']!r} does not exist in the context"
    extra = build.get("additional_contexts") or {}
    for value in extra.values() if isinstance(extra, dict) else []:
        other = str(value).removeprefix("service:")
        if str(value).startswith("service:") and "build" not in services.get(other, {}):
            yield f"services/{name}/build: additional context {value!r} names no service that builds"


def _service_problems(
    name: str,
    service: dict[str, Any],
    document: dict[str, Any],
    compose_dir: Path,
    dockerfile_healthcheck: Callable[[dict[str, Any]], bool],
) -> Iterable[str]:
    services = document.get("services") or {}
    yield from _dependency_problems(name, service, services, dockerfile_healthcheck)
    yield from _mount_problems(name, service, set((document.get("volumes") or {}).keys()), compose_dir)
    declared_secrets = set((document.get("secrets") or {}).keys())
    for secret in _secret_names(service):
        if secret not in declared_secrets:
            yield f"services/{name}/secrets: secret {secret!r} is not declared under top-level secrets"
    yield from _build_problems(name, service, services, compose_dir)


def cross_reference_problems(
    document: dict[str, Any],
    compose_dir: Path,
    dockerfile_healthcheck: Callable[[dict[str, Any]], bool] = lambda service: False,
) -> list[str]:
    """What the schema cannot check: dependencies, declared volumes/secrets, bind-mounted files, healthchecks.

    `dockerfile_healthcheck(service)` says whether a service without a compose healthcheck gets one from the
    image its `build` section makes.
    """
    problems: list[str] = []
    for name, service in (document.get("services") or {}).items():
        problems.extend(_service_problems(name, service or {}, document, compose_dir, dockerfile_healthcheck))
    return problems
