"""Build the KubernetesPodOperator for a step pod: image, RBAC identity, restricted security, GPU placement,
deferrable by default, on the platform team's pod template when one is configured."""

from __future__ import annotations

import functools
import os
from typing import Any

from mlrelease.exit_codes import EXIT_GATE_FAILED, EXIT_SKIPPED
from mlrelease_airflow.pod_spec import CONFIG_MOUNT, STATE_MOUNT, XCOM_PATH, ClusterSettings, StepPod
from mlrelease_airflow.ticks import defer_until_next_check


def base_exit_code(remote_pod: Any, container: str) -> int | None:
    """Exit code of the pod's step container, if it terminated (as KPO's own skip_on_exit_code reads it)."""
    statuses = (remote_pod.status.container_statuses if remote_pod and remote_pod.status else None) or []
    status = next((s for s in statuses if s.name == container), None)
    if status is None or status.state is None or status.state.terminated is None:
        return None
    return int(status.state.terminated.exit_code)


def keep_template_tolerations(pod: Any, template: Any) -> Any:
    """Add the pod template's tolerations to those the step sets (GPU steps) instead of losing them.

    The provider merges a template field by field and the operator's value wins whole, so a GPU step's own
    toleration would drop the platform team's. A toleration only allows a placement, so joining is always safe;
    a node selector restricts one, so there the step's (the GPU nodes) still replaces the template's.
    """
    if pod.spec is None or template.spec is None:
        return pod
    tolerations = list(template.spec.tolerations or [])
    tolerations += [t for t in pod.spec.tolerations or [] if t not in tolerations]
    pod.spec.tolerations = tolerations or None
    return pod


def pod_template(path: str | None) -> Any:
    """The platform's pod template (a V1Pod); None when none is configured. A configured file must exist: the
    provider would log a warning and build the pod without it, the platform's patches silently lost."""
    if not path:
        return None
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
    from airflow.sdk.exceptions import AirflowFailException

    if not os.path.isfile(path):
        raise AirflowFailException(f"pod template file {path} (MLRELEASE_K8S_POD_TEMPLATE_FILE) does not exist")
    return PodGenerator.deserialize_model_file(path)


@functools.cache
def step_pod_operator_class() -> type:
    """KubernetesPodOperator that fails a gate verdict (exit 3) without retries, like the local runner.

    Built on first use so that importing this module (at DAG parse time) does not import the provider.
    """
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    class StepPodOperator(KubernetesPodOperator):
        """A step pod; exit 3 means the same inputs would get the same verdict, so retrying is pointless.

        Exit codes are mapped in `cleanup`, which both modes end in: the synchronous `execute` and, when
        deferrable, `trigger_reentry` (the provider's resume method after the pod trigger fires), whose own
        "pod failed" error is replaced by what `cleanup` raises (skip for exit 4, fail without retry for exit 3).

        A tick step (the stage analysis) that has not decided defers until its next check, then runs a new pod.
        """

        _reentry_result: Any = None

        def execute(self, context: Any) -> Any:
            result = super().execute(context)
            if self.deferrable:
                # Reached only when the provider did not defer (the pod had already finished): it then calls
                # trigger_reentry itself and drops its return value; ours kept it.
                result = self._reentry_result
            defer_until_next_check(self, result)
            return result

        def trigger_reentry(self, context: Any, event: dict[str, Any]) -> Any:
            """Resume after the pod trigger fired: the provider reads logs, XCom and exit code; then our tick."""
            result = super().trigger_reentry(context, event)
            self._reentry_result = result
            defer_until_next_check(self, result)
            return result

        def execute_again(self, context: Any, event: Any = None) -> Any:
            """Resume after a tick's deferral: run the tick step again, in a new pod."""
            # The previous tick's pod is done: never reattach to it (an in-process run keeps this object).
            self.pod, self.pod_request_obj, self.remote_pod, self._reentry_result = None, None, None, None
            return self.execute(context)

        def build_pod_request_obj(self, context: Any = None, *, dry_run: bool = False) -> Any:
            """The pod, merged onto the platform's pod template when one is configured."""
            template = pod_template(self.pod_template_file)  # before the provider, which ignores a missing file
            pod = super().build_pod_request_obj(context, dry_run=dry_run)
            return pod if template is None else keep_template_tolerations(pod, template)

        def cleanup(self, pod: Any, remote_pod: Any, *args: Any, **kwargs: Any) -> None:
            try:
                super().cleanup(pod, remote_pod, *args, **kwargs)
            except AirflowException as exc:
                if base_exit_code(remote_pod, self.base_container_name) == EXIT_GATE_FAILED:
                    raise AirflowFailException(str(exc)) from exc
                raise

    return StepPodOperator


def kubernetes_step_operator(task_id: str, pod: StepPod, cluster: ClusterSettings, **kwargs: Any) -> Any:
    """A KubernetesPodOperator running `mlrelease step …` under the restricted Pod Security profile."""
    # Imported here, not at module level: the provider costs ~3 s and only cluster runs need it.
    from kubernetes.client import models as k8s

    limits = {"cpu": pod.resources.cpu_limit, "memory": pod.resources.memory_limit}
    requests = {"cpu": pod.resources.cpu, "memory": pod.resources.memory}
    node_selector, tolerations = None, None
    if pod.needs_gpu:
        limits["nvidia.com/gpu"] = str(pod.resources.gpus)
        requests["nvidia.com/gpu"] = str(pod.resources.gpus)
        node_selector = dict(cluster.gpu_node_selector)
        tolerations = [k8s.V1Toleration(key=cluster.gpu_toleration_key, operator="Exists", effect="NoSchedule")]
    restricted = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return step_pod_operator_class()(
        task_id=task_id,
        skip_on_exit_code=EXIT_SKIPPED,
        name=f"mlrelease-{pod.step}",
        namespace=cluster.namespace,
        image=cluster.image_for(pod),
        cmds=pod.cmds,
        arguments=list(pod.args),
        # HOME on the writable /tmp volume: Feast and GX write small caches there under a read-only root.
        # pod.env_vars carries the task's identity (templated): the step records its outcome on the state volume.
        env_vars={
            **pod.env_vars,
            "MLRELEASE_HOME": STATE_MOUNT,
            "MLRELEASE_XCOM_PATH": XCOM_PATH,
            "HOME": "/tmp",
            "MLRELEASE_TRAFFIC_ROUTER": cluster.traffic_router,
            "MLRELEASE_METRICS_SOURCE": cluster.metrics_source,
            "MLRELEASE_PROMETHEUS_URL": cluster.prometheus_url,
            "MLRELEASE_PROMETHEUS_SELECTOR": cluster.prometheus_selector,
            "MLRELEASE_GATEWAY_CONFIG": f"{CONFIG_MOUNT}/gateway.yaml",
            "MLRELEASE_HTTPROUTE_CONFIG": f"{CONFIG_MOUNT}/httproute.yaml",
        },
        env_from=[k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=cluster.env_secret))],
        service_account_name=cluster.service_account,
        # Least privilege: no API token, except for routing steps that patch their HTTPRoute (RBAC: that one object).
        automount_service_account_token=cluster.needs_api_token(pod),
        container_resources=k8s.V1ResourceRequirements(requests=requests, limits=limits),
        node_selector=node_selector,
        tolerations=tolerations,
        security_context={
            "runAsNonRoot": True,
            "runAsUser": cluster.run_as_user,
            "runAsGroup": cluster.run_as_user,
            "fsGroup": cluster.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        container_security_context=restricted,
        xcom_sidecar_container_security_context=restricted,
        volumes=[
            k8s.V1Volume(
                name="state",
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=cluster.state_claim),
            ),
            k8s.V1Volume(name="tmp", empty_dir=k8s.V1EmptyDirVolumeSource(size_limit="1Gi")),
            k8s.V1Volume(
                name="gateway-config", config_map=k8s.V1ConfigMapVolumeSource(name=cluster.gateway_config_map)
            ),
        ],
        volume_mounts=[
            k8s.V1VolumeMount(name="state", mount_path=STATE_MOUNT),
            k8s.V1VolumeMount(name="tmp", mount_path="/tmp"),
            k8s.V1VolumeMount(name="gateway-config", mount_path=CONFIG_MOUNT, read_only=True),
        ],
        labels={"app.kubernetes.io/name": "mlrelease", "app.kubernetes.io/component": pod.step},
        do_xcom_push=True,
        get_logs=True,
        on_finish_action="delete_succeeded_pod",
        startup_timeout_seconds=600 if pod.needs_gpu else 120,
        # Deferrable: once the pod runs, the task waits in the triggerer and frees its worker slot.
        deferrable=cluster.deferrable,
        # The platform's pod template, under the step's settings (the restricted security context always wins).
        pod_template_file=cluster.pod_template_file,
        **kwargs,
    )
