"""docker/: the images' Dockerfiles lint clean and keep their contracts; the compose stack is valid and consistent.

Nothing here builds or runs a container (there is no engine on the test machines): hadolint, a Dockerfile
reader, the official Compose Specification schema and cross-reference checks stand in for `docker build`
and `docker compose config` (which also runs when the compose plugin is installed).
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from docker.utils.build import exclude_paths

from mlrelease.gateway.cli import DEFAULT_PORT as GATEWAY_PORT
from mlrelease.registry import MODEL_NAME
from mlrelease.yamlconfig import safe_load
from tests.container_checks import (
    cross_reference_problems,
    external_bases,
    final_stage,
    image_tag_problem,
    parse_stages,
    schema_problems,
)

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
# The official Compose Specification schema, as the check-jsonschema package ships it (with its licence).
SCHEMA = importlib.resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
HADOLINT = Path(sys.executable).parent / "hadolint"
DOCKERFILES = ("step", "gateway", "triton", "perf-analyzer", "airflow")
NUMERIC_USER = re.compile(r"^(\d+)(?::(\d+))?$")


def dockerfile(name: str) -> str:
    """The text of docker/<name>.Dockerfile."""
    return (DOCKER / f"{name}.Dockerfile").read_text(encoding="utf-8")


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose document as YAML data (anchors and merge keys resolved, as Compose does)."""
    return safe_load(path.read_text(encoding="utf-8"))


def compose_schema() -> dict[str, Any]:
    """The vendored Compose Specification schema."""
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


def lock_entries(path: Path) -> dict[str, tuple[str, set[str]]]:
    """{package: (version, the packages its `# via` lines name)} of a `uv pip compile` lock."""
    entries: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", line)
        if match:
            current = match.group(1).lower().replace("_", "-")
            entries[current] = (match.group(2), set())
            continue
        via = re.match(r"^\s+#\s+(?:via\s+)?(?:#\s+)?(\S.*)$", line)
        if current and via and via.group(1) != "via":
            entries[current][1].add(via.group(1).strip())
    return entries


def build_healthcheck(service: dict[str, Any]) -> bool:
    """Whether the image a service builds declares a HEALTHCHECK in its final stage."""
    build = service.get("build")
    if not isinstance(build, dict) or "dockerfile" not in build:
        return False
    path = COMPOSE_FILE.parent / build.get("context", ".") / build["dockerfile"]
    checks = final_stage(path.read_text(encoding="utf-8")).all("HEALTHCHECK")
    return bool(checks) and checks[-1].value.strip().upper() != "NONE"


def compose_problems(document: dict[str, Any]) -> list[str]:
    """Every schema and cross-reference problem of a compose document placed at docker/compose.yaml."""
    return schema_problems(document, compose_schema()) + cross_reference_problems(
        document, COMPOSE_FILE.parent, build_healthcheck
    )


# --- Dockerfiles ----------------------------------------------------------------------------------------------


def test_the_expected_dockerfiles_exist() -> None:
    assert sorted(p.name for p in DOCKER.glob("*.Dockerfile")) == sorted(f"{n}.Dockerfile" for n in DOCKERFILES)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name: str) -> None:
    config, path = DOCKER / ".hadolint.yaml", DOCKER / f"{name}.Dockerfile"
    proc = subprocess.run(
        [str(HADOLINT), "--config", str(config), "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert proc.returncode == 0, proc.stderr


def test_hadolint_ignores_a_rule_only_with_a_reason() -> None:
    text = (DOCKER / ".hadolint.yaml").read_text(encoding="utf-8")
    config = safe_load(text) or {}
    assert config.get("failure-threshold") == "style"  # every finding fails, not only errors
    for rule in config.get("ignored") or []:
        line = next(line for line in text.splitlines() if re.search(rf"-\s*{rule}\b", line))
        assert "#" in line and line.split("#", 1)[1].strip(), f"ignored rule {rule} has no comment saying why"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_runs_as_a_numeric_non_root_user(name: str) -> None:
    users = final_stage(dockerfile(name)).all("USER")
    assert users, f"{name}.Dockerfile: the final stage sets no USER (it would run as the base image's, often root)"
    match = NUMERIC_USER.match(users[-1].value)
    assert match, f"{name}.Dockerfile: USER {users[-1].value!r} is not numeric (runAsNonRoot cannot verify a name)"
    assert int(match.group(1)) != 0 and match.group(2) != "0", f"{name}.Dockerfile runs as root"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_images_are_pinned(name: str) -> None:
    stages = parse_stages(dockerfile(name))
    problems = [p for p in map(image_tag_problem, external_bases(stages)) if p]
    assert problems == []


def test_step_image_final_stage_has_no_build_tools() -> None:
    stages = parse_stages(dockerfile("step"))
    final = stages[-1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", final.base), final.base  # the slim image ships no compiler
    runs = " ".join(i.value for i in final.all("RUN"))
    for tool in ("apt-get", "apk ", "pip ", "uv ", "gcc", "build-essential", "make "):
        assert tool not in runs, f"the step image's final stage runs {tool.strip()!r}"
    copies = [i.value for i in final.all("COPY")]
    assert copies and all(c.startswith("--from=builder ") for c in copies), copies
    assert {c.split()[1] for c in copies} == {"/opt/venv", "/app"}  # the venv and the source, nothing else
    # Both stages must be the same interpreter: the venv's python is a symlink into the base image.
    assert stages[1].alias == "builder" and stages[1].base == final.base


@pytest.mark.parametrize("name", ["step", "perf-analyzer"])
def test_bytecode_is_compiled_at_build_and_used_at_run_time(name: str) -> None:
    text = dockerfile(name)
    envs = [i.value for stage in parse_stages(text) for i in stage.all("ENV")]
    assert not any("PYTHONDONTWRITEBYTECODE" in env for env in envs)  # the precompiled bytecode is meant to be used
    recipe = (DOCKER / "install-venv.sh").read_text(encoding="utf-8")
    assert "--compile-bytecode" in recipe and "compileall" in recipe
    assert "docker/install-venv.sh deps" in text and "docker/install-venv.sh project" in text


def test_step_and_perf_images_keep_the_pods_contract() -> None:
    from mlrelease_airflow.pod_spec import STATE_MOUNT, XCOM_PATH, ClusterSettings

    uid = ClusterSettings.__dataclass_fields__["run_as_user"].default
    for name in ("step", "perf-analyzer"):
        final = final_stage(dockerfile(name))
        assert final.all("USER")[-1].value == f"{uid}:{uid}"
        prepared = " ".join(i.value for i in final.all("RUN"))
        assert f"install -d -o {uid} -g {uid}" in prepared
        for directory in (STATE_MOUNT, str(Path(XCOM_PATH).parent)):
            assert directory in prepared, f"{name}: {directory} is not created for UID {uid}"
        env = " ".join(i.value for i in final.all("ENV"))
        assert f"MLRELEASE_HOME={STATE_MOUNT}" in env and "HOME=/tmp" in env


def test_image_tags_match_the_dag_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlrelease_airflow.pod_spec import DEFAULT_IMAGES, ClusterSettings

    monkeypatch.delenv("MLRELEASE_K8S_IMAGE", raising=False)
    compose = load_compose()["services"]
    assert compose["airflow-init"]["image"] == ClusterSettings.from_env().image
    assert compose["airflow-scheduler"]["image"] == DEFAULT_IMAGES["MLRELEASE_K8S_PERF_IMAGE"]
    assert f"-t {ClusterSettings.from_env().image} ." in dockerfile("step")
    assert f"-t {DEFAULT_IMAGES['MLRELEASE_K8S_PERF_IMAGE']} ." in dockerfile("perf-analyzer")
    gateway_base = parse_stages(dockerfile("gateway"))[0].base
    assert gateway_base == ClusterSettings.from_env().image  # the gateway is the step image plus an entrypoint
    extra = compose["gateway"]["build"]["additional_contexts"]
    assert extra == {gateway_base: "service:airflow-init"}  # compose feeds the step image it builds


def test_triton_image_serves_under_explicit_control_and_survives_bad_models() -> None:
    triton, perf = parse_stages(dockerfile("triton")), parse_stages(dockerfile("perf-analyzer"))
    release = triton[-1].base.split(":")[1].removesuffix("-py3")
    assert re.fullmatch(r"\d\d\.\d\d", release), triton[-1].base
    assert perf[-1].base == f"nvcr.io/nvidia/tritonserver:{release}-py3-sdk"  # server and perf_analyzer agree
    command = triton[-1].all("CMD")[-1].json_args()
    assert command is not None and command[0] == "tritonserver"
    for flag in (
        "--model-repository=/models",
        "--model-control-mode=explicit",
        "--exit-on-error=false",
        "--strict-readiness=true",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
    ):
        assert flag in command, flag
    assert triton[-1].all("EXPOSE")[-1].value.split() == ["8000", "8001", "8002"]
    assert not triton[-1].all("ENTRYPOINT")  # the NGC entrypoint (CUDA compatibility set-up) stays
    # compose runs the same flags, plus loading the model again after a restart.
    compose_command = load_compose()["services"]["triton"]["command"]
    assert compose_command == [*command, f"--load-model={MODEL_NAME}"]


def test_gateway_image_exposes_its_port_and_probes_liveness() -> None:
    final = final_stage(dockerfile("gateway"))
    assert final.all("EXPOSE")[-1].value == str(GATEWAY_PORT)
    assert final.all("ENTRYPOINT")[-1].json_args() == ["mlrelease", "gateway"]
    assert final.all("CMD")[-1].json_args() == ["--host", "0.0.0.0", "--port", str(GATEWAY_PORT)]
    probe = final.all("HEALTHCHECK")[-1].value
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", probe)
    assert url and url.group(1) == str(GATEWAY_PORT), probe
    source = (REPO / "src" / "mlrelease" / "gateway" / "app.py").read_text(encoding="utf-8")
    assert f'@app.get("{url.group(2)}")' in source, f"the gateway has no {url.group(2)} route"


def test_build_context_holds_every_copied_path_and_nothing_private() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    context = set(exclude_paths(str(REPO), patterns))
    for name in DOCKERFILES:
        for stage in parse_stages(dockerfile(name)):
            for copy_ in stage.all("COPY"):
                if copy_.value.startswith("--from="):
                    continue
                *sources, _dest = [part for part in copy_.value.split() if not part.startswith("--")]
                for source in sources:
                    assert source.rstrip("/") in context, f"{name}.Dockerfile copies {source}, not in the context"
    for private in (".venv", ".git", ".mlrelease", "docker/.env", "requirements.lock"):
        assert not any(p == private or p.startswith(private + "/") for p in context), private
    assert not any("__pycache__" in p for p in context)


# --- the runtime lock -----------------------------------------------------------------------------------------


def test_step_lock_is_the_runtime_subset_of_the_main_lock() -> None:
    step = lock_entries(DOCKER / "requirements-step.lock")
    main = lock_entries(REPO / "requirements.lock")
    disagree = {n: (v, main[n][0]) for n, (v, _) in step.items() if n in main and main[n][0] != v}
    assert disagree == {}, f"pins differ from requirements.lock (regenerate docker/requirements-step.lock): {disagree}"
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in step, f"{name} (pyproject.toml) is missing from docker/requirements-step.lock"
    # Dev/test packages only where a runtime package needs them (feast asks for SQLAlchemy[mypy], hence mypy).
    for requirement in project["optional-dependencies"]["dev"]:
        name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        reasons = step.get(name, ("", set()))[1] - {"-c requirements.lock", "mlrelease (pyproject.toml)"}
        assert name not in step or reasons, f"{name} is a dev/test package; it has no place in the step image"
    header = (DOCKER / "requirements-step.lock").read_text(encoding="utf-8").splitlines()[1]
    assert "-c requirements.lock" in header and "docker/requirements-step.in" in header
    assert "--extra" not in header


# --- compose --------------------------------------------------------------------------------------------------


def test_compose_file_is_valid(tmp_path: Path) -> None:
    assert compose_problems(load_compose()) == []
    docker = shutil.which("docker")
    has_plugin = docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    if has_plugin:  # the real parser as well, with throwaway values for the required secrets
        env_file = tmp_path / "compose.env"
        env_file.write_text("".join(f"{k}={secrets.token_urlsafe(16)}\n" for k in required_variables()))
        proc = subprocess.run(
            [str(docker), "compose", "-f", str(COMPOSE_FILE), "--env-file", str(env_file), "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr


def broken(mutate: Any) -> dict[str, Any]:
    """A copy of the real compose document changed by `mutate(document)`."""
    document = copy.deepcopy(load_compose())
    mutate(document)
    return document


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["services"]["gateway"]["depends_on"].update({"feast": {"condition": "service_started"}}),
            "services/gateway/depends_on: service 'feast' does not exist",
        ),
        (
            lambda d: d["volumes"].pop("model-repository"),
            "named volume 'model-repository' is not declared",
        ),
        (
            lambda d: d["services"]["prometheus"]["volumes"].append("./no-such-rules.yaml:/etc/prometheus/x.yaml:ro"),
            "bind-mounted path './no-such-rules.yaml' does not exist",
        ),
        (
            lambda d: d["services"]["redis"].pop("healthcheck"),
            "'redis' is awaited as service_healthy but has no healthcheck",
        ),
        (
            lambda d: d["services"]["airflow-init"].update({"restart": "unless-stopped"}),
            "'airflow-init' must complete, but restarts forever",
        ),
        (
            lambda d: d["services"]["mlflow"].update({"secrets": ["db_password"]}),
            "secret 'db_password' is not declared",
        ),
        (
            lambda d: d["services"]["mlflow"].update({"helthcheck": {"test": ["CMD", "true"]}}),
            "services/mlflow: Unevaluated properties are not allowed ('helthcheck' was unexpected)",
        ),
    ],
    ids=[
        "missing-dependency",
        "undeclared-volume",
        "missing-bind-file",
        "no-healthcheck",
        "restarting-init",
        "undeclared-secret",
        "schema-typo",
    ],
)
def test_broken_compose_documents_are_rejected_with_the_problem_named(mutate: Any, expected: str) -> None:
    problems = compose_problems(broken(mutate))
    assert any(expected in p for p in problems), problems


def test_depending_on_a_dockerfile_healthcheck_counts_as_a_healthcheck() -> None:
    # The gateway's healthcheck comes from gateway.Dockerfile; awaiting it as healthy is therefore fine ...
    def await_gateway(d: dict[str, Any]) -> None:
        d["services"]["prometheus"]["depends_on"]["gateway"] = {"condition": "service_healthy"}

    assert compose_problems(broken(await_gateway)) == []

    # ... but not once the Dockerfile-less image has no healthcheck of its own.
    def await_pushgateway_without_check(d: dict[str, Any]) -> None:
        d["services"]["pushgateway"].pop("healthcheck")

    assert any("'pushgateway' is awaited" in p for p in compose_problems(broken(await_pushgateway_without_check)))


def required_variables() -> list[str]:
    """Variables compose.yaml requires (`${NAME:?…}`): it refuses to start while one is unset or empty."""
    return sorted(set(re.findall(r"\$\{(\w+):\?", COMPOSE_FILE.read_text(encoding="utf-8"))))


def test_secrets_come_from_the_untracked_env_file() -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    example = dict(
        line.split("=", 1)
        for line in (DOCKER / "example.env").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    )
    referenced = set(re.findall(r"\$\{(\w+)", text))
    assert referenced <= set(example), f"not in docker/example.env: {sorted(referenced - set(example))}"
    required = required_variables()
    assert {"POSTGRES_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET", "GRAFANA_ADMIN_PASSWORD"} <= set(required)
    assert all(example[name] == "" for name in required), "example.env must not carry a real secret"
    # No literal secret anywhere in the compose file: every password/secret/key value is interpolated.
    for service in load_compose()["services"].values():
        env = service.get("environment") or {}
        for key, value in env.items():
            if re.search(r"PASSWORD|SECRET|FERNET|_KEY$", key):
                assert "${" in str(value), f"{key} has a literal value in compose.yaml"
        for key, value in env.items():
            if isinstance(value, str) and "://" in value and "@" in value:
                assert re.search(r":\$\{\w+:\?[^}]*\}@", value), f"{key} has a literal password in its URL"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(DOCKER / ".env")], cwd=REPO)
    assert ignored.returncode == 0, "docker/.env must be git-ignored"


def test_compose_gateway_config_differs_only_in_the_stack_settings() -> None:
    base = safe_load((REPO / "config" / "gateway.yaml").read_text(encoding="utf-8"))
    stack = safe_load((DOCKER / "gateway.yaml").read_text(encoding="utf-8"))
    assert stack.pop("triton_url") == "http://triton:8000"
    assert stack["routing"].pop("state_url").startswith("redis://redis:6379/")
    base.pop("triton_url", None)
    base["routing"].pop("state_url")
    assert stack == base, "docker/gateway.yaml drifted from config/gateway.yaml beyond Triton and routing state"
    from mlrelease.gateway.config import load_config

    load_config(DOCKER / "gateway.yaml")  # and it is a valid gateway config


def test_prometheus_scrapes_what_the_alert_rules_name(tmp_path: Path) -> None:
    config = safe_load((DOCKER / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["mlrelease-gateway"]["static_configs"][0]["targets"] == [f"gateway:{GATEWAY_PORT}"]
    assert jobs["triton"]["static_configs"][0]["targets"] == ["triton:8002"]
    assert jobs["pushgateway"]["honor_labels"] is True  # pushed series keep their own job/model labels
    mounts = load_compose()["services"]["prometheus"]["volumes"]
    rules = next(m for m in mounts if m.startswith("../deploy/monitoring/prometheus/alerts.yaml:"))
    assert rules.split(":")[1] in config["rule_files"]
    # promtool checks the scrape config and the rule file together (rule path pointed at the repository copy).
    local = tmp_path / "prometheus.yml"
    config["rule_files"] = [str(REPO / "deploy" / "monitoring" / "prometheus" / "alerts.yaml")]
    local.write_text(yaml.safe_dump(config), encoding="utf-8")
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package `prometheus`)"
    proc = subprocess.run([promtool, "check", "config", str(local)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_airflow_image_pins_what_the_lock_pins() -> None:
    """The Airflow image's provider pins are the ones the tests ran with (requirements.lock)."""
    locked = dict(
        line.split("==", 1)
        for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines()
        if line.startswith("apache-airflow") and "==" in line
    )
    pins = re.findall(r'"(apache-airflow[a-z-]*)==([^"]+)"', dockerfile("airflow"))
    assert pins and all(locked.get(name) == version for name, version in pins), (pins, locked)
    # The image the Helm values run is the one this file builds.
    values = safe_load((REPO / "deploy" / "airflow" / "values.yaml").read_text(encoding="utf-8"))
    assert values["images"]["airflow"]["repository"] == "ghcr.io/mlrelease/airflow"
