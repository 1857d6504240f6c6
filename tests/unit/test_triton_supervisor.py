"""The Triton supervisor's pure parts: restart back-off and cap, exit descriptions."""

from __future__ import annotations

import pytest

from mlrelease.serving.triton_supervisor import RestartPolicy, describe_exit, restart_delay

POLICY = RestartPolicy(first_delay_s=0.5, max_delay_s=30.0, max_restarts=5, window_s=60.0)


def test_back_off_doubles_with_each_recent_restart_up_to_the_maximum():
    now = 1000.0
    delays = [restart_delay([now - 1] * n, now, RestartPolicy(max_restarts=100)) for n in range(8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_restarts_outside_the_window_are_forgotten():
    now = 1000.0
    assert restart_delay([now - 61, now - 120, now - 300], now, POLICY) == 0.5
    assert restart_delay([now - 61, now - 10], now, POLICY) == 1.0


def test_the_cap_waits_until_the_oldest_counted_restart_leaves_the_window():
    now = 1000.0
    five = [now - 50, now - 40, now - 3, now - 2, now - 1]  # the cap (5 within 60 s) is reached
    assert restart_delay(five, now, POLICY) == pytest.approx(max(POLICY.first_delay_s * 2**5, 10.0))
    slow = RestartPolicy(first_delay_s=0.01, max_delay_s=0.5, max_restarts=5, window_s=60.0)
    assert restart_delay(five, now, slow) == pytest.approx(10.0)  # 60 s after the restart at now - 50
    assert restart_delay(five[1:], now, slow) == pytest.approx(0.16)  # four in the window: back-off only


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (-9, "killed by SIGKILL"),
        (-11, "killed by SIGSEGV"),
        (1, "exited with code 1"),
        (0, "exited with code 0"),
        (None, "exited"),
        (-99, "killed by signal 99"),
    ],
)
def test_exit_codes_in_words(code, words):
    assert describe_exit(code) == words


def test_the_supervisor_does_not_load_the_training_stack():
    """It runs for as long as Triton does and reconciles after every restart: a small process (~60 MB, not ~230)."""
    import subprocess
    import sys

    modules = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, mlrelease.serving.triton_supervisor, mlrelease.serving.reconcile, "
            "mlrelease.serving.endpoint; print(sorted(sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "sklearn" not in modules and "onnx" not in modules.split("'")
