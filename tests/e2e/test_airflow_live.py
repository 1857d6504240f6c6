"""Manual triggers as a user makes them: a real Airflow (API server, scheduler, dag-processor, triggerer),
the REST API with the bodies the UI trigger form posts, and the trigger form itself in a headless browser."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
import yaml

from mlrelease.data.generate import generate
from mlrelease.release_spec import nightly_dag_id
from mlrelease.summary import DATA_DOCS, TASK_ORDER
from mlrelease.timewindow import run_key
from tests.conftest import REPO, ROWS_PER_DAY, WINDOW_END, WINDOW_START, Receiver, free_port
from tests.small_world_plan import GOOD_PLAN

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
USER = "releaser"  # the SimpleAuthManager "user" role: may trigger, pause and unpause DAGs, nothing more
PIPELINE = list(TASK_ORDER)  # the 8 steps before the rollout, apply_features … benchmark
RUN_TIMEOUT_S = 900.0
HEALTH_KEYS = ("metadatabase", "scheduler", "dag_processor", "triggerer")  # /api/v2/monitor/health
TERMINAL = {"success", "failed"}
NIGHTLY = nightly_dag_id("parcel_eta")  # the model these tests release


def ui_datetime(value: datetime | str) -> str:
    """A date as the UI form sends it: JavaScript's `Date.toISOString()` (UTC, milliseconds, `Z`)."""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def form_body(
    conf: dict[str, Any],
    *,
    logical_date: datetime | str,
    data_interval: tuple[str, str] | None = None,
    note: str = "",
    dag_run_id: str = "",
) -> dict[str, Any]:
    """The JSON body the Airflow 3.3 UI trigger form POSTs to `/api/v2/dags/{dag_id}/dagRuns`.

    From apache/airflow `airflow-core/src/airflow/ui/src/queries/useTrigger.ts` (`triggerDagRun`), fed by
    `components/TriggerDag/TriggerDAGForm.tsx`: `conf` holds every param with its form value; the dates go
    through `new Date(...).toISOString()`; the data interval is `null` in the form's "auto" mode; an empty
    run id or note is `undefined`, which `JSON.stringify` leaves out. The installed 3.3.2 bundle
    (`airflow/ui/dist/assets/index-*.js`) builds the same object (with `partition_key: null`), and
    `test_trigger_form_shows_the_params` compares this shape with what the running UI really sends.
    """
    start, end = data_interval if data_interval else (None, None)
    body: dict[str, Any] = {"conf": conf}
    if dag_run_id:
        body["dag_run_id"] = dag_run_id
    body |= {
        "data_interval_end": ui_datetime(end) if end else None,
        "data_interval_start": ui_datetime(start) if start else None,
        "logical_date": ui_datetime(logical_date),
    }
    if note:
        body["note"] = note
    body["partition_key"] = None  # 3.3.2 sends an unset partition key as null
    return body


@dataclass
class LiveAirflow:
    """Airflow's four components as separate processes on one AIRFLOW_HOME, and an authenticated API client."""

    home: Path
    env: dict[str, str]
    port: int
    password: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    session: requests.Session = field(default_factory=requests.Session)

    @property
    def url(self) -> str:
        """The API server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def log(self, name: str) -> Path:
        """Where component `name` writes its stdout and stderr."""
        return self.home / f"{name}.log"

    def start(self) -> None:
        """Migrate the metadata DB, then start every component in its own process group."""
        subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=self.env, check=True, capture_output=True)
        for name in COMPONENTS:
            with self.log(name).open("wb") as out:
                self.procs[name] = subprocess.Popen(
                    [str(BIN / "airflow"), name],
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own group: stop() signals it with every worker it forked
                )

    def stop(self, grace_s: float = 30.0) -> list[str]:
        """SIGTERM every component's process group, wait, SIGKILL what is left; returns what had to be killed."""
        tree: list[psutil.Process] = []
        for proc in self.procs.values():
            try:
                parent = psutil.Process(proc.pid)
                tree += [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        # Task processes may have left the group; they were recorded above and are waited on by pid.
        _, alive = psutil.wait_procs(tree, timeout=grace_s)
        killed = []
        for straggler in alive:
            try:
                killed.append(f"{straggler.pid} {' '.join(straggler.cmdline()[:3])}")
                straggler.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        for proc in self.procs.values():
            proc.wait(timeout=10)
        return killed

    def tails(self, lines: int = 40) -> str:
        """The last lines of every component's log, for a failure message."""
        parts = []
        for name in COMPONENTS:
            text = self.log(name).read_text(errors="replace").splitlines() if self.log(name).exists() else []
            state = self.procs[name].poll() if name in self.procs else "not started"
            parts.append(f"----- {name} (exit {state}) -----\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def check_alive(self) -> None:
        """Fail, with the logs, if a component has exited."""
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            pytest.fail(f"Airflow components exited: {dead}\n{self.tails()}")

    def wait_for(self, what: str, probe: Callable[[], Any], timeout_s: float, interval_s: float = 1.0) -> Any:
        """Poll `probe` until it returns something truthy; fail with the component logs on timeout."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                last = probe()
            except requests.RequestException as exc:
                last = exc
            if last and not isinstance(last, Exception):
                return last
            time.sleep(interval_s)
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})\n{self.tails()}")

    def login(self) -> str:
        """`POST /auth/token` with the user's password; every later API call carries the JWT."""
        reply = requests.post(f"{self.url}/auth/token", json={"username": USER, "password": self.password}, timeout=30)
        assert reply.status_code == 201, reply.text
        token: str = reply.json()["access_token"]
        self.session.headers["Authorization"] = f"Bearer {token}"
        return token

    def api(self, method: str, path: str, expect: int | None = 200, **kwargs: Any) -> Any:
        """Call `/api/v2{path}` as the logged-in user; check the status (unless `expect` is None)."""
        reply = self.session.request(method, f"{self.url}/api/v2{path}", timeout=60, **kwargs)
        if expect is not None:
            assert reply.status_code == expect, f"{method} {path}: {reply.status_code} {reply.text[:2000]}"
        return reply.json() if reply.content else None

    def health(self) -> dict[str, Any]:
        """`GET /api/v2/monitor/health` (no login needed)."""
        reply = requests.get(f"{self.url}/api/v2/monitor/health", timeout=10)
        return reply.json() if reply.status_code == 200 else {}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, lines: int = 60) -> str:
        """The tail of one task try's log, through the API."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        reply = self.api("GET", path, expect=None)
        content = reply.get("content", []) if isinstance(reply, dict) else []
        events = [str(e.get("event", e)) if isinstance(e, dict) else str(e) for e in content]
        return "\n".join(events[-lines:])

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """The run's task instances by task id."""
        listed = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        return {ti["task_id"]: ti for ti in listed["task_instances"]}

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> dict[str, Any]:
        """Poll the run until it is terminal; fail with the failed tasks' logs when it did not succeed in time."""

        def finished() -> dict[str, Any] | None:
            # A DAG file that stops parsing mid-run stalls the run: say so now rather than at the timeout.
            errors = self.api("GET", "/importErrors")
            assert errors["total_entries"] == 0, f"a DAG file stopped parsing: {errors['import_errors']}"
            run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            return run if run["state"] in TERMINAL else None

        return self.wait_for(f"{dag_id} run {run_id} to finish", finished, timeout_s, interval_s=3.0)

    def explain(self, dag_id: str, run_id: str) -> str:
        """Task states and the logs of the tasks that did not succeed or skip, for a failure message."""
        tis = self.task_instances(dag_id, run_id)
        lines = [f"{t}: {ti['state']}" for t, ti in tis.items()]
        for task_id, ti in tis.items():
            if ti["state"] not in ("success", "skipped", None) and ti["try_number"]:
                log = self.task_log(dag_id, run_id, task_id, ti["try_number"])
                lines.append(f"----- log of {task_id} -----\n{log}")
        return "\n".join(lines)


def start_triton(env: dict[str, str]) -> None:
    """`mlrelease triton up` for this MLRELEASE_HOME (ports from `env`)."""
    subprocess.run([str(BIN / "mlrelease"), "triton", "up"], env=env, check=True, capture_output=True)


def stop_triton(env: dict[str, str]) -> None:
    """`mlrelease triton down`."""
    subprocess.run([str(BIN / "mlrelease"), "triton", "down"], env=env, check=True, capture_output=True)


@pytest.fixture(scope="module")
def live_home(tmp_path_factory: pytest.TempPathFactory, clean_offline: Path) -> Path:
    """An MLRELEASE_HOME with the clean history, shared by the module's runs (they run one after another)."""
    home = tmp_path_factory.mktemp("live-home")
    shutil.copytree(clean_offline, home / "data" / "offline")
    return home


@pytest.fixture(scope="module")
def alerts() -> Iterator[Receiver]:
    """The webhook receiver every alert of the module's runs goes to."""
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def airflow(
    tmp_path_factory: pytest.TempPathFactory, live_home: Path, alerts: Receiver, request: pytest.FixtureRequest
) -> Iterator[LiveAirflow]:
    """A real Airflow on a free port with its own AIRFLOW_HOME, a real Triton, and a logged-in API client."""
    airflow_home = tmp_path_factory.mktemp("airflow-live")
    port = free_port()
    password = secrets.token_urlsafe(16)
    # A passwords file written beforehand: SimpleAuthManager keeps the passwords it finds and generates
    # only missing ones, so the test knows the password without racing the API server's first start.
    passwords = airflow_home / "passwords.json"
    passwords.write_text(json.dumps({USER: password}))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "MLRELEASE_"))}
    env = {
        **base,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),  # the repo's dags/plugins folders, LocalExecutor, SQLite
        "MLRELEASE_REPO": str(REPO),
        "MLRELEASE_HOME": str(live_home),
        "MLRELEASE_MODEL": "parcel_eta",  # the model this Airflow releases (the repository declares two)
        "MLRELEASE_TASK_RETRIES": "0",
        "AIRFLOW_CONN_MLRELEASE_ALERTS": json.dumps({"conn_type": "http", "extra": {"url": alerts.url}}),
        "MLRELEASE_TRITON_HTTP_PORT": str(free_port()),
        "MLRELEASE_TRITON_GRPC_PORT": str(free_port()),
        "MLRELEASE_TRITON_METRICS_PORT": str(free_port()),
        "AIRFLOW__CORE__PARALLELISM": "4",
        # Real logins instead of the repo's all-admins default: the test proves the token flow and the login page.
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:user",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        # Task processes report to the execution API of this API server, not the default localhost:8080.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        # Every component signs or checks the same JWTs; unset, each process would make up its own key.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        # No cron runs: the clock is past the test data's last night, and the repo's config creates DAGs
        # unpaused, so the scheduler would start "last night" on data the test does not have. Manual runs
        # (the subject here) are scheduled as usual.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
    }
    start_triton(env)
    live = LiveAirflow(home=airflow_home, env=env, port=port, password=password)
    failed_before = request.session.testsfailed
    try:
        live.start()
        live.wait_for(
            "every component healthy",
            lambda: all(live.health().get(c, {}).get("status") == "healthy" for c in HEALTH_KEYS),
            timeout_s=180,
        )
        live.login()
        every_dag = {NIGHTLY, nightly_dag_id("late_delivery"), "rollback_release"}  # one nightly DAG per model
        live.wait_for("every DAG parsed", lambda: dag_ids(live) >= every_dag, 180)
        yield live
    finally:
        killed = live.stop()
        stop_triton(env)
        if request.session.testsfailed > failed_before or killed:
            # Module teardown output is not attached to a test report: write it where the terminal shows it.
            print(f"\nlive Airflow: killed after SIGTERM: {killed}\n{live.tails(80)}", file=sys.__stderr__)


def dag_ids(live: LiveAirflow) -> set[str]:
    """The DAG ids the API lists; fails at once, naming them, on any import error."""
    errors = live.api("GET", "/importErrors")
    assert errors["total_entries"] == 0, errors["import_errors"]
    return {d["dag_id"] for d in live.api("GET", "/dags", params={"limit": 100})["dags"]}


# Every param of the parcel model's nightly DAG as the form sends it: the demo's values where it leaves the defaults
# (scripts/release_demo.sh: demo stage durations, perf ratios loosened for this 2-core machine), and an
# overlap of 3 h instead of 2 so that the materialize step's own outcome shows the form's value arrived.
NIGHT_CONF: dict[str, Any] = {
    "materialize_overlap_hours": 3,
    "reference_days": 7,
    "training_days": 7,
    "mae_tolerance": 0.05,
    "max_p99_ratio": 1.5,
    "min_throughput_ratio": 0.67,
    "rollout_profile": "demo",
    "rollout_plan": "config/rollout_plan.yaml",
    "psi_threshold": 0.25,
}
NIGHT_KEY = run_key(datetime.fromisoformat(WINDOW_END))  # the run's artifact folder
ROLLBACK_CONF: dict[str, Any] = {
    "model": "parcel_eta",
    "action": "abort_rollout",
    "target_version": None,
    "reason": "live e2e: abort whatever is rolling out",
}


def form_now() -> datetime:
    """The logical date the form pre-fills: now, to the second."""
    return datetime.now(UTC).replace(microsecond=0)


def run_count(live: LiveAirflow, dag_id: str) -> int:
    """How many runs `dag_id` has."""
    return int(live.api("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 1})["total_entries"])


def dag_params(live: LiveAirflow, dag_id: str) -> dict[str, dict[str, Any]]:
    """The DAG's params as the API serves them to the form (value, schema, description)."""
    params: dict[str, dict[str, Any]] = live.api("GET", f"/dags/{dag_id}/details")["params"]
    return params


def outcomes(home: Path, key: str) -> dict[str, dict[str, Any]]:
    """The step outcomes the runner recorded under the run's artifact folder, by task id."""
    steps = home / "artifacts" / "parcel_eta" / key / "steps"
    return {p.stem: json.loads(p.read_text()) for p in steps.glob("*.json")} if steps.is_dir() else {}


def test_the_api_wants_a_login(airflow: LiveAirflow) -> None:
    assert requests.get(f"{airflow.url}/api/v2/dags", timeout=30).status_code == 401
    wrong = {"username": USER, "password": airflow.password + "x"}
    assert requests.post(f"{airflow.url}/auth/token", json=wrong, timeout=30).status_code == 401
    assert airflow.api("GET", f"/dags/{NIGHTLY}")["dag_id"] == NIGHTLY  # with the JWT


def test_trigger_form_shows_the_params(airflow: LiveAirflow, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = Path("/usr/bin/chromium")
    assert chromium.is_file(), "the trigger-form test needs Debian's chromium (apt-get install chromium)"
    page_errors: list[str] = []
    sent: dict[str, list[dict[str, Any]]] = {}
    runs_before = {d: run_count(airflow, d) for d in (NIGHTLY, "rollback_release")}

    def capture(route: Any) -> None:
        # Keep what the form POSTs, and stop it there: this test creates no run.
        if route.request.method != "POST":
            route.continue_()
            return
        dag_id = route.request.url.split("/dags/")[1].split("/")[0]
        sent.setdefault(dag_id, []).append(route.request.post_data_json)
        route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium))
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.route("**/api/v2/dags/*/dagRuns", capture)
            # A user opens the DAG page, is sent to the login page, signs in and comes back.
            page.goto(f"{airflow.url}/dags/{NIGHTLY}")
            page.get_by_label("Username").fill(USER)
            page.get_by_label("Password").fill(airflow.password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"**/dags/{NIGHTLY}")

            dialog = open_trigger_dialog(page)
            text = dialog.inner_text()
            params = dag_params(airflow, NIGHTLY)
            assert set(params) == set(NIGHT_CONF)
            for name, param in params.items():
                assert name in text, f"the form does not show param {name}"
                assert param["description"] in text, f"the form does not show {name}'s description"
            assert "Specify Manually" in text  # a cron DAG: the data interval can be set by hand
            choices = dropdown_choices(page, dialog, "rollout_profile")
            assert choices == params["rollout_profile"]["schema"]["enum"] == ["production", "demo"]
            dialog.screenshot(path=str(tmp_path / "trigger-form.png"))
            page.screenshot(path=str(tmp_path / "trigger-page.png"))
            shutil.copy(tmp_path / "trigger-form.png", "/tmp/trigger-form.png")
            submit(page, dialog)

            page.goto(f"{airflow.url}/dags/rollback_release")
            dialog = open_trigger_dialog(page)
            text = dialog.inner_text()
            manual_params = dag_params(airflow, "rollback_release")
            for name, param in manual_params.items():
                assert name in text and param["description"] in text, f"rollback_release's form lacks {name}"
            assert "Data Interval" not in text  # schedule=None: no interval to choose
            assert dropdown_choices(page, dialog, "model") == ["late_delivery", "parcel_eta"]  # every declared model
            submit(page, dialog)
        finally:
            browser.close()

    assert page_errors == []
    # What the running UI posted has the shape form_body() builds for the REST tests, and the DAG's defaults.
    night = sent[NIGHTLY][0]
    assert list(night) == list(form_body(NIGHT_CONF, logical_date=form_now()))
    assert night["data_interval_start"] is night["data_interval_end"] is night["partition_key"] is None
    assert night["conf"] == {name: p["value"] for name, p in params.items()}
    assert {k: type(v) for k, v in night["conf"].items()} == {k: type(v) for k, v in NIGHT_CONF.items()}
    assert night["logical_date"] == ui_datetime(night["logical_date"])  # toISOString's form, "…:SS.000Z"
    manual = sent["rollback_release"][0]
    assert list(manual) == list(form_body(ROLLBACK_CONF, logical_date=form_now()))
    assert manual["conf"] == {name: p["value"] for name, p in manual_params.items()}
    assert manual["conf"]["target_version"] is None  # null|integer left empty is sent as null
    assert {d: run_count(airflow, d) for d in runs_before} == runs_before


def open_trigger_dialog(page: Any) -> Any:
    """Click the DAG page's Trigger button the way a user does; the dialog once its params are loaded."""
    page.get_by_test_id("trigger-dag-button").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Run Parameters").wait_for()
    page.wait_for_load_state("networkidle")
    return dialog


def submit(page: Any, dialog: Any) -> None:
    """Click the form's Trigger button and wait until its POST has gone out (to the capturing route)."""
    with page.expect_request(lambda request: request.method == "POST" and request.url.endswith("/dagRuns")):
        dialog.get_by_test_id("trigger-dag-submit").click()


def dropdown_choices(page: Any, dialog: Any, param: str) -> list[str]:
    """Open an enum param's dropdown (a react-select combobox), read its choices, keep the value shown."""
    box = dialog.get_by_role("combobox", name=param)
    shown = dialog.locator(f"input[name='element_{param}']").input_value()
    box.click()
    options = page.get_by_role("option")
    options.first.wait_for()
    choices: list[str] = options.all_inner_texts()
    # Escape would close the whole dialog; choosing the shown value closes only the menu.
    options.filter(has_text=shown).first.click()
    return choices


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)  # a whole night on a real scheduler: ~4-6 min on 2 busy cores
def test_nightly_release_triggered_like_the_form_releases_the_first_model(
    airflow: LiveAirflow, live_home: Path, alerts: Receiver
) -> None:
    # The form unpauses a paused DAG before it triggers (TriggerDAGForm onSubmit → togglePause).
    assert airflow.api("PATCH", f"/dags/{NIGHTLY}", json={"is_paused": False})["is_paused"] is False
    # A user re-running the night that ended at WINDOW_END: "Specify Manually" with that data interval,
    # the logical date left at the form's "now", every param sent with its form value, a note.
    body = form_body(
        NIGHT_CONF,
        logical_date=form_now(),
        data_interval=(WINDOW_START, WINDOW_END),
        note="live e2e: the night ending 2026-11-29",
    )
    run = airflow.api("POST", f"/dags/{NIGHTLY}/dagRuns", json=body)
    run_id = run["dag_run_id"]
    assert (run["run_type"], run["triggered_by"], run["triggering_user_name"]) == ("manual", "rest_api", USER)
    assert run["conf"] == NIGHT_CONF and run["note"] == body["note"]
    interval = (run["data_interval_start"], run["data_interval_end"])
    assert tuple(datetime.fromisoformat(t) for t in interval) == (
        datetime.fromisoformat(WINDOW_START),
        datetime.fromisoformat(WINDOW_END),
    )

    finished = airflow.wait_for_run(NIGHTLY, run_id)
    assert finished["state"] == "success", airflow.explain(NIGHTLY, run_id)

    # Task states from the scheduler: the pipeline green, then a first release: nothing to roll out
    # against (benchmark makes v1 champion, shadow exits 4 → skipped, the rollout tasks skip after it),
    # rollback not triggered (one_failed), the none_failed verdict green, and the report teardown written.
    tis = airflow.task_instances(NIGHTLY, run_id)
    tasks = {t["task_id"] for t in airflow.api("GET", f"/dags/{NIGHTLY}/tasks")["tasks"]}
    assert set(tis) == tasks
    states = {task: ti["state"] for task, ti in tis.items()}
    green = [*PIPELINE, "release_complete", "report"]
    expected = {task: "skipped" for task in tasks} | {task: "success" for task in green}
    assert states == expected, airflow.explain(NIGHTLY, run_id)

    # The form's values reached the commands the tasks ran (rendered templates, as the UI shows them).
    def args(task: str) -> list[str]:
        rendered: list[str] = tis[task]["rendered_fields"]["arguments"]
        return rendered

    assert args("materialize") == ["--start", WINDOW_START, "--end", WINDOW_END, "--overlap-hours", "3"]
    assert args("validate_data")[4:] == [
        "--overlap-hours",
        "3",
        "--training-days",
        "7",
        "--reference-days",
        "7",
        "--psi-threshold",
        "0.25",
    ]
    assert args("train")[4:] == ["--training-days", "7", "--mae-tolerance", "0.05"]
    assert args("benchmark") == ["--model-version", "1", "--max-p99-ratio", "1.5", "--min-throughput-ratio", "0.67"]

    # …and the steps' own outcomes, recorded by this run.
    steps = outcomes(live_home, NIGHT_KEY)
    assert [t for t in PIPELINE if steps.get(t, {}).get("status") == "success"] == PIPELINE
    assert {steps[t]["run_id"] for t in PIPELINE} == {run_id}
    materialized = steps["materialize"]["result"]
    assert materialized["window"] == {"start": WINDOW_START, "end": WINDOW_END}
    assert materialized["overlap_s"] == 3 * 3600 and materialized["loaded_from"] == "2026-11-27T23:00:00+00:00"
    assert (live_home / "artifacts" / "parcel_eta" / NIGHT_KEY / DATA_DOCS).is_file()  # GX Data Docs of validate_data
    assert alerts.bodies == []
    # The model half: v1 was trained from this interval, exported, served, benchmarked, and bootstrapped.
    assert steps["train"]["result"]["model_version"] == 1
    assert steps["export"]["result"]["model_version"] == 1  # the version came through XCom
    assert (live_home / "model_repository/parcel_eta/1/model.onnx").is_file()
    assert steps["benchmark"]["result"]["status"].startswith("bootstrap")
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{live_home / 'mlflow/mlflow.db'}")
    mlflow_run = client.get_model_version("parcel_eta", "1").run_id
    assert int(client.get_model_version_by_alias("parcel_eta", "champion").version) == 1
    quality = json.loads(Path(client.download_artifacts(mlflow_run, "data_quality/summary.json")).read_text())
    assert quality["success"] is True and quality["rows"]["orders"] > 0

    summary = subprocess.run(
        [str(BIN / "mlrelease"), "summary", "--end", WINDOW_END],
        env={**airflow.env, "MLRELEASE_HOME": str(live_home)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "result: ok: first release" in summary and "validate_data    ok" in summary
    # The first champion has nothing to be rolled out against: the rollout ends skipped, the run is green.
    assert steps["shadow"]["status"] == "skipped" and "champion already" in steps["shadow"]["reason"]
    assert not any(task in steps for task in ("rollout_stage_1", "analyze_1", "promote", "rollback"))


# The next night (the interval after the first one's): a retrained candidate against the first night's champion,
# rolled out under live traffic by the DAG's own rollout tasks on the real scheduler and triggerer. The plan is the
# rollout tests' small-world plan (this world's traffic is ~1/1000 of a production stage), with room for the
# scheduler's round trips between looks: each look is one execution of analyze_N, deferred between looks.
NEXT_START, NEXT_END = WINDOW_END, "2026-11-30T02:00:00+00:00"
NEXT_KEY = run_key(datetime.fromisoformat(NEXT_END))
LIVE_TRAFFIC_RATE = 200.0  # as the rollout tests: each arm's evidence for a pass gathers in seconds
# A contract no window of this world can decide (it needs far more calls than a stage gets): its stage is
# inconclusive at its maximum exposure and pauses for a human, whatever the candidate does.
UNDECIDABLE = {"metric": "error_rate", "bad": "higher", "tolerance": 0.02, "min_samples": 10_000_000}
# The last stage asks: its maximum exposure is short, as it can only end inconclusive.
LIVE_PLAN = {
    **GOOD_PLAN,
    "stages": [
        *({**stage, "max_exposure_s": {"production": 7200, "demo": 120}} for stage in GOOD_PLAN["stages"][:2]),
        {
            **GOOD_PLAN["stages"][2],
            "max_exposure_s": {"production": 7200, "demo": 30},
            "guardrails": [*GOOD_PLAN["stages"][2]["guardrails"], UNDECIDABLE],
        },
    ],
}
ROLLOUT_TASKS = [
    "shadow",
    *(f"{task}_{n}" for n in (1, 2, 3) for task in ("rollout_stage", "wait", "analyze", "approve", "answer")),
    "promote",
    "wait_retire",
    "retire",
]
HUMAN = "awaiting_input"  # the state of an approval task waiting for its answer (Airflow 3.3)


def trigger_night(
    airflow: LiveAirflow, home: Path, interval: tuple[str, str], plan: dict[str, Any], *, seed: int, note: str
) -> str:
    """Generate the data of the day the interval ends (as the earlier tests did), then trigger the nightly run for the
    interval as the form does, under `plan`; the run's id."""
    day = datetime.fromisoformat(interval[1]).date()
    generate(home / "data" / "offline", day, day, rows_per_day=ROWS_PER_DAY, seed=seed)
    path = home / f"plan-{seed}.yaml"
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    body = form_body(
        {**NIGHT_CONF, "rollout_plan": str(path)},
        logical_date=form_now(),
        data_interval=interval,
        note=f"live e2e: {note}",
    )
    run_id: str = airflow.api("POST", f"/dags/{NIGHTLY}/dagRuns", json=body)["dag_run_id"]
    return run_id


def hitl_path(run_id: str, task_id: str, dag_id: str = NIGHTLY) -> str:
    """The REST path of a task's human-in-the-loop detail (what the UI's Required Actions page reads and answers)."""
    return f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails"


def wait_for_question(airflow: LiveAirflow, run_id: str, task_id: str) -> dict[str, Any]:
    """Wait until `task_id` asks (awaiting input); its HITL detail."""
    airflow.wait_for(
        f"{task_id} to ask",
        lambda: (
            airflow.task_instances(NIGHTLY, run_id).get(task_id, {}).get("state") == HUMAN
            or airflow.api("GET", f"/dags/{NIGHTLY}/dagRuns/{run_id}")["state"] in TERMINAL
        ),
        timeout_s=RUN_TIMEOUT_S,
        interval_s=2.0,
    )
    assert airflow.task_instances(NIGHTLY, run_id)[task_id]["state"] == HUMAN, airflow.explain(NIGHTLY, run_id)
    detail: dict[str, Any] = airflow.api("GET", hitl_path(run_id, task_id))
    return detail


@pytest.fixture
def live_gateway(airflow: LiveAirflow, live_home: Path) -> Iterator[tuple[str, str]]:
    """The gateway (a real process, replaying the next night's features) on the live home; its URL and an API key."""
    from mlrelease_drills.devkit import gateway_process

    def cli(*args: str) -> str:
        done = subprocess.run(
            [str(BIN / "mlrelease"), *args], env=airflow.env, capture_output=True, text=True, check=True
        )
        return done.stdout

    cli("routing", "init")  # stable = the champion the first night made
    key = json.loads(cli("gateway-key", "add", "live-e2e"))["api_key"]
    config = live_home / "gateway-live.yaml"
    raw = yaml.safe_load((REPO / "config" / "gateway.yaml").read_text(encoding="utf-8"))
    config.write_text(yaml.safe_dump({**raw, "replay_as_of": NEXT_END}), encoding="utf-8")
    with gateway_process(config, free_port(), env=airflow.env) as url:
        yield url, key


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_the_next_night_rolls_a_retrained_candidate_out_under_live_traffic(
    airflow: LiveAirflow,
    live_home: Path,
    alerts: Receiver,
    live_gateway: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlrelease.gateway import traffic
    from mlrelease.gateway.config import load_config
    from mlrelease.rollout.machine import Phase
    from mlrelease.rollout.store import RolloutStore
    from mlrelease.settings import Settings
    from mlrelease_drills import devkit

    url, key = live_gateway
    offline = live_home / "data" / "offline"
    run_id = trigger_night(
        airflow, live_home, (NEXT_START, NEXT_END), LIVE_PLAN, seed=11, note="the next night, a retrained candidate"
    )
    # Traffic once the benchmark is done, as `make run` does: perf_analyzer measures the same CPU Triton.
    airflow.wait_for(
        "the benchmark to pass",
        lambda: (
            airflow.task_instances(NIGHTLY, run_id).get("benchmark", {}).get("state") == "success"
            or airflow.api("GET", f"/dags/{NIGHTLY}/dagRuns/{run_id}")["state"] in TERMINAL
        ),
        timeout_s=RUN_TIMEOUT_S,
        interval_s=2.0,
    )
    pool = traffic.order_pool(offline, datetime.fromisoformat(NEXT_END), load_config().cohorts)
    bodies = traffic.build_requests(pool, 3_000, None, supply_features=False, seed=3)
    with devkit.background_traffic(url, bodies, key, LIVE_TRAFFIC_RATE) as report:
        # The last stage cannot decide: it pauses, and approve_3 asks on the Required Actions page, with the evidence.
        asked = wait_for_question(airflow, run_id, "approve_3")
        assert asked["options"] == ["Promote", "Roll back", "Extend the stage"] and asked["defaults"] == ["Roll back"]
        assert asked["subject"] == "v2, stage 3 paused: promote, roll back or extend?"
        assert "still inconclusive after" in asked["body"] and "| * | error_rate" in asked["body"]
        assert "Unanswered after 10 min: **Roll back**" in asked["body"]  # the plan's demo timeout: 600 s
        # An option the task does not offer is refused, naming the ones it does; nothing is recorded.
        reply = airflow.session.patch(
            f"{airflow.url}/api/v2{hitl_path(run_id, 'approve_3')}",
            json={"chosen_options": ["Ship it"], "params_input": {}},
            timeout=60,
        )
        assert reply.status_code == 400 and "Invalid options ['Ship it']" in reply.text, reply.text
        assert airflow.task_instances(NIGHTLY, run_id)["approve_3"]["state"] == HUMAN
        # The release manager promotes it, as the UI's Required Actions page does.
        answered = airflow.api(
            "PATCH", hitl_path(run_id, "approve_3"), json={"chosen_options": ["Promote"], "params_input": {}}
        )
        assert answered["chosen_options"] == ["Promote"] and answered["responded_by"]["name"] == USER
        finished = airflow.wait_for_run(NIGHTLY, run_id)
    assert finished["state"] == "success", airflow.explain(NIGHTLY, run_id)

    # Every rollout task ran on the scheduler: three stages opened, waited for and analysed; the first two decided
    # alone (nothing to ask: their approval and answer skipped), the third asked and was answered; then the promotion
    # and the old champion's retirement; rollback (one_failed) skipped; the verdict green.
    tis = airflow.task_instances(NIGHTLY, run_id)
    states = {task: ti["state"] for task, ti in tis.items()}
    expected = {task: "success" for task in [*PIPELINE, *ROLLOUT_TASKS, "release_complete", "report"]}
    unasked = {f"{task}_{n}": "skipped" for n in (1, 2) for task in ("approve", "answer")}
    assert states == expected | unasked | {"rollback": "skipped"}, airflow.explain(NIGHTLY, run_id)

    steps = outcomes(live_home, NEXT_KEY)
    assert steps["train"]["result"]["model_version"] == 2  # retrained on the next interval, not a copy
    assert steps["shadow"]["status"] == "success"
    monkeypatch.setenv("MLRELEASE_HOME", str(live_home))
    settings = Settings.from_env()
    record = RolloutStore.from_settings(settings, "parcel_eta").read()
    assert record is not None and record.phase is Phase.PROMOTED and record.candidate_version == 2
    looks = [event.stage for event in record.history if event.kind == "analysis"]
    assert sorted(set(looks)) == [1, 2, 3], looks  # each stage judged on its own window
    # The answer is in the record (who, when) and the promotion was a human's.
    (approval,) = [event for event in record.history if event.kind == "approval"]
    assert approval.stage == 3 and approval.detail["choice"] == "promote" and approval.detail["by"] == USER
    assert record.history[-1].kind == "promoted" and record.history[-1].detail["by_hand"] is True
    assert steps["answer_3"]["result"]["answer"]["by"] == USER
    page = (Path(steps["report"]["result"]["report"]) / "index.html").read_text(encoding="utf-8")
    assert f"promote at stage 3 (answered by {USER})" in page
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{live_home / 'mlflow/mlflow.db'}")
    assert int(client.get_model_version_by_alias("parcel_eta", "champion").version) == 2
    assert report.errors == 0, report.summary()
    assert any("/v2/model" in served for served in report.served), report.served
    assert [b["body"]["event"] for b in alerts.bodies] == ["approval_needed", "promoted"]


def test_rollback_release_abort_with_nothing_rolling_out_ends_skipped(
    airflow: LiveAirflow, live_home: Path, alerts: Receiver
) -> None:
    alerts_before = len(alerts.bodies)
    assert airflow.api("PATCH", "/dags/rollback_release", json={"is_paused": False})["is_paused"] is False
    body = form_body(ROLLBACK_CONF, logical_date=form_now())
    run = airflow.api("POST", "/dags/rollback_release/dagRuns", json=body)
    run_id = run["dag_run_id"]
    assert run["conf"] == ROLLBACK_CONF
    finished = airflow.wait_for_run("rollback_release", run_id, timeout_s=300)

    # No rollout record: the step says "nothing to roll back" and exits 4, the runner skips the task
    # (mlrelease.cli EXIT_SKIPPED: "nothing to do … the task ends as skipped"), and a run whose only task
    # skipped is green, with no alert (failures alone alert).
    assert finished["state"] == "success", airflow.explain("rollback_release", run_id)
    tis = airflow.task_instances("rollback_release", run_id)
    assert {t: ti["state"] for t, ti in tis.items()} == {"manual_release": "skipped"}
    assert tis["manual_release"]["rendered_fields"]["arguments"] == [
        "--action",
        "abort_rollout",
        "--model",
        "parcel_eta",
        "--to-version",
        "",
        "--reason",
        f"{ROLLBACK_CONF['reason']} (rollback_release run {run_id})",
    ]
    # schedule=None: the inferred data interval is the logical date, which keys the outcome's folder.
    key = run_key(datetime.fromisoformat(finished["data_interval_end"]))
    outcome = outcomes(live_home, key)["manual_release"]
    assert outcome["status"] == "skipped" and outcome["run_id"] == run_id
    assert "nothing to roll back" in outcome["reason"]
    assert len(alerts.bodies) == alerts_before


@pytest.mark.parametrize(
    ("param", "value", "complaint"),
    [
        ("action", "explode", "'explode' is not one of ['rollback_to_version', 'abort_rollout', 'promote_paused']"),
        ("target_version", "two", "'two' is not of type 'null', 'integer'"),
        ("reason", "no", "'no' is too short"),
    ],
)
def test_a_bad_param_is_refused_before_any_run(airflow: LiveAirflow, param: str, value: Any, complaint: str) -> None:
    runs_before = run_count(airflow, "rollback_release")
    body = form_body({**ROLLBACK_CONF, param: value}, logical_date=form_now())
    reply = airflow.session.post(f"{airflow.url}/api/v2/dags/rollback_release/dagRuns", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    detail = reply.json()["detail"]
    assert f"Invalid input for param {param}: {complaint}" in detail
    assert run_count(airflow, "rollback_release") == runs_before


# The night after: a candidate whose first stage cannot decide, so it asks; the plan's question goes to an on-call
# user only, with a short timeout. Nobody answers (the test's user may not: 403), and the default rolls it back.
THIRD_START, THIRD_END = NEXT_END, "2026-12-01T02:00:00+00:00"
ASKING_PLAN = {
    **GOOD_PLAN,
    "approval": {"timeout_s": {"production": 3600, "demo": 20}, "default": "rollback", "assigned_users": ["oncall"]},
    "stages": [
        {
            **GOOD_PLAN["stages"][0],
            "max_exposure_s": {"production": 7200, "demo": 10},
            "guardrails": [*GOOD_PLAN["stages"][0]["guardrails"], UNDECIDABLE],
        },
        *GOOD_PLAN["stages"][1:],
    ],
}


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_an_unanswered_question_times_out_to_its_default_and_rolls_the_candidate_back(
    airflow: LiveAirflow, live_home: Path, alerts: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlrelease.rollout.machine import Phase
    from mlrelease.rollout.store import RolloutStore
    from mlrelease.settings import Settings

    alerts_before = len(alerts.bodies)
    run_id = trigger_night(
        airflow, live_home, (THIRD_START, THIRD_END), ASKING_PLAN, seed=12, note="a question nobody answers"
    )
    asked = wait_for_question(airflow, run_id, "approve_1")  # no traffic at all: stage 1 cannot pass, it asks
    assert asked["assigned_users"] == [{"id": "oncall", "name": "oncall"}]
    reply = airflow.session.patch(
        f"{airflow.url}/api/v2{hitl_path(run_id, 'approve_1')}",
        json={"chosen_options": ["Promote"], "params_input": {}},
        timeout=60,
    )
    assert reply.status_code == 403 and f"User={USER}" in reply.text, reply.text  # not a respondent of this one
    finished = airflow.wait_for_run(NIGHTLY, run_id)

    # The scheduler took the default after 20 s: roll back. answer_1 carried it out and failed, as every rollback of
    # a release does; the rollback task (one_failed) finished the clean-up; the run's verdict is failed.
    assert finished["state"] == "failed", airflow.explain(NIGHTLY, run_id)
    states = {task: ti["state"] for task, ti in airflow.task_instances(NIGHTLY, run_id).items()}
    assert {t: states[t] for t in ("approve_1", "answer_1", "rollout_stage_2", "promote", "rollback")} == {
        "approve_1": "success",
        "answer_1": "failed",
        "rollout_stage_2": "upstream_failed",
        "promote": "upstream_failed",
        "rollback": "success",
    }, airflow.explain(NIGHTLY, run_id)
    detail = airflow.api("GET", hitl_path(run_id, "approve_1"))
    assert detail["chosen_options"] == ["Roll back"] and detail["responded_by_user"] is None
    monkeypatch.setenv("MLRELEASE_HOME", str(live_home))
    record = RolloutStore.from_settings(Settings.from_env(), "parcel_eta").read()
    assert record is not None and record.phase is Phase.ROLLED_BACK and record.candidate_version == 3
    (approval,) = [event for event in record.history if event.kind == "approval"]
    assert approval.detail["choice"] == "rollback" and approval.detail["timed_out"] is True
    assert record.reason == "stage 1: roll back (nobody answered in time: the default)"
    steps = outcomes(live_home, run_key(datetime.fromisoformat(THIRD_END)))
    page = (Path(steps["report"]["result"]["report"]) / "index.html").read_text(encoding="utf-8")
    assert "rollback at stage 1 (nobody answered in time: the default)" in page
    events = [b["body"]["event"] for b in alerts.bodies[alerts_before:]]
    assert events == ["approval_needed", "task_failed", "rolled_back"], events
