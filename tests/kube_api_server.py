"""A local stand-in for the two Kubernetes API calls the HTTPRoute router makes (no API server runs here).

It is not a cluster: it answers GET and PATCH of HTTPRoutes the way the API server does (merge patch,
resourceVersion preconditions, generation bumps, Status bodies), validates every object it would store
against the Gateway API schema, authorizes each call against RBAC rules, and plays a Gateway API
controller that accepts, refuses or ignores each new generation. Every request is recorded, so tests
can assert what the real `kubernetes` client sent.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.gateway_api_schema import validate_gateway_api

ROUTE_PATH = re.compile(r"^/apis/gateway\.networking\.k8s\.io/v1/namespaces/([^/]+)/httproutes/([^/?]+)$")
CONTROLLER = "example.net/gateway-controller"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def apply_crd_defaults(obj: dict[str, Any]) -> None:
    """Fill in what the HTTPRoute CRD defaults (as the API server does on every write): ref group and kind."""
    for ref in obj["spec"].get("parentRefs", []):
        ref.setdefault("group", "gateway.networking.k8s.io")
        ref.setdefault("kind", "Gateway")
    for rule in obj["spec"].get("rules", []):
        for backend in rule.get("backendRefs", []):
            backend.setdefault("group", "")
            backend.setdefault("kind", "Service")
            backend.setdefault("weight", 1)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class FakeKubeApi:
    """Serve HTTPRoute GET/PATCH on a free loopback port.

    :param controller: how the simulated controller answers a new generation: accept, refuse or silent.
    :param rbac_rules: RBAC PolicyRules (as in a Role) the caller holds; None allows everything.
    """

    def __init__(self, controller: str = "accept", rbac_rules: list[dict[str, Any]] | None = None) -> None:
        self.controller = controller
        self.rbac_rules = rbac_rules
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._resource_version = 100
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL to give a `kubernetes.client.Configuration` as its host."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as `kubectl apply` would create it (validated; generation 1)."""
        problem = validate_gateway_api([obj])[0]
        if problem:
            raise ValueError(f"invalid object: {problem}")
        stored = copy.deepcopy(obj)
        apply_crd_defaults(stored)
        with self._lock:
            stored["metadata"].update(generation=1, resourceVersion=self._next_version())
            self.objects[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = stored
            self._control(stored)
        return copy.deepcopy(stored)

    def status_write(self, namespace: str, name: str) -> None:
        """The controller rewrites the status (a heartbeat): resourceVersion moves, spec and generation do not."""
        with self._lock:
            obj = self.objects[(namespace, name)]
            self._control(obj)
            obj["metadata"]["resourceVersion"] = self._next_version()

    def _next_version(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def _allowed(self, verb: str, name: str) -> bool:
        if self.rbac_rules is None:
            return True
        return any(
            "gateway.networking.k8s.io" in rule.get("apiGroups", [])
            and "httproutes" in rule.get("resources", [])
            and verb in rule.get("verbs", [])
            and (not rule.get("resourceNames") or name in rule["resourceNames"])
            for rule in self.rbac_rules
        )

    def _control(self, obj: dict[str, Any]) -> None:
        """The controller's answer to the object's current generation (as status.parents conditions)."""
        if self.controller == "silent":
            return
        ok = self.controller == "accept"
        generation = obj["metadata"]["generation"]
        conditions = [
            {
                "type": "Accepted",
                "status": "True" if ok else "False",
                "reason": "Accepted" if ok else "NotAllowedByListeners",
                "message": "Route is accepted"
                if ok
                else "no listener of the Gateway allows routes from this namespace",
                "observedGeneration": generation,
                "lastTransitionTime": "2026-11-30T02:00:00Z",
            },
            {
                "type": "ResolvedRefs",
                "status": "True",
                "reason": "ResolvedRefs",
                "message": "all references resolved",
                "observedGeneration": generation,
                "lastTransitionTime": "2026-11-30T02:00:00Z",
            },
        ]
        # Like real controllers, it writes the parentRef out in full (namespace included) in status.
        namespace = obj["metadata"]["namespace"]
        parents = [
            {"parentRef": {"namespace": namespace, **ref}, "controllerName": CONTROLLER, "conditions": conditions}
            for ref in obj["spec"]["parentRefs"]
        ]
        obj["status"] = {"parents": parents}

    def _answer(self, method: str, path: str, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
        match = ROUTE_PATH.match(path.split("?")[0])
        if not match:
            return 404, _status(404, "NotFound", f"no such path {path}")
        namespace, name = match.groups()
        verb = {"GET": "get", "PATCH": "patch"}.get(method)
        if verb is None:
            return 405, _status(405, "MethodNotAllowed", method)
        if not self._allowed(verb, name):
            return 403, _status(403, "Forbidden", f'httproutes "{name}" is forbidden: cannot {verb}')
        with self._lock:
            current = self.objects.get((namespace, name))
            if current is None:
                return 404, _status(404, "NotFound", f'httproutes.gateway.networking.k8s.io "{name}" not found')
            if verb == "get":
                return 200, copy.deepcopy(current)
            if content_type != "application/merge-patch+json":
                return 415, _status(415, "UnsupportedMediaType", f"unsupported patch type {content_type}")
            patch = json.loads(body)
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                return 409, _status(409, "Conflict", "the object has been modified; please apply your changes")
            merged = merge_patch(current, patch)
            merged.pop("status", None)
            apply_crd_defaults(merged)
            problem = validate_gateway_api([merged])[0]
            if problem:
                return 422, _status(
                    422, "Invalid", f"HTTPRoute.gateway.networking.k8s.io {name!r} is invalid: {problem}"
                )
            merged["status"] = current.get("status", {})
            if merged["spec"] != current["spec"]:
                merged["metadata"]["generation"] = current["metadata"]["generation"] + 1
            merged["metadata"]["resourceVersion"] = self._next_version()
            self.objects[(namespace, name)] = merged
            self._control(merged)
            return 200, copy.deepcopy(merged)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                api.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "content_type": content_type,
                        "body": json.loads(body) if body else None,
                    }
                )
                code, payload = api._answer(self.command, self.path, content_type, body)
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_PUT = do_POST = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
