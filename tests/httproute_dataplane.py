"""A local stand-in for a Gateway API data plane (no Envoy, Istio or cluster runs here): it routes HTTP requests by
the HTTPRoute the Kubernetes API stand-in holds, as a Gateway API implementation does.

It implements the part of HTTPRoute the rollout uses: `PathPrefix` path matches, `Exact` and `RegularExpression`
header matches (full match, as Envoy's RE2 `safe_regex`), precedence by the longest path prefix and then the largest
number of header matches (the Gateway API spec's order), weighted `backendRefs` and a `URLRewrite` filter with
`ReplacePrefixMatch`. It re-reads the route every `poll_s` from the API (as a controller watches it), so a patch
moves traffic within that long. Services are named by `--service NAME=URL`.

`python -m tests.httproute_dataplane --kube URL --namespace NS --name ROUTE --port P --service NAME=URL …`
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
from collections.abc import Mapping
from typing import Any

ROUTE_API = "/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/httproutes/{name}"


def _path_matches(match: dict[str, Any] | None, path: str) -> int | None:
    """The prefix's length when `path` is under it (element by element), else None."""
    prefix = (match or {"type": "PathPrefix", "value": "/"})["value"].rstrip("/")
    if path == prefix or path.startswith(prefix + "/") or prefix == "":
        return len(prefix)
    return None


def _header_matches(match: dict[str, Any], headers: Mapping[str, str]) -> bool:
    value = headers.get(match["name"].lower())
    if value is None:
        return False
    if match.get("type", "Exact") == "RegularExpression":
        return re.fullmatch(match["value"], value) is not None
    return bool(value == match["value"])


def pick(route: dict[str, Any], path: str, headers: Mapping[str, str], rng: random.Random) -> dict[str, Any] | None:
    """The backendRef that serves a request (headers with lower-case names); None when no rule matches (a 404)."""
    best: tuple[int, int] | None = None
    chosen: dict[str, Any] | None = None
    for rule in route["spec"].get("rules", []):
        for match in rule.get("matches") or [{}]:
            prefix = _path_matches(match.get("path"), path)
            wanted = match.get("headers") or []
            if prefix is None or not all(_header_matches(h, headers) for h in wanted):
                continue
            rank = (prefix, len(wanted))
            if best is None or rank > best:  # ties: the earlier rule, as the spec orders rules of one route
                best, chosen = rank, rule
    if chosen is None:
        return None
    backends = [b for b in chosen.get("backendRefs", []) if b.get("weight", 1) > 0]
    if not backends:
        return None
    return rng.choices(backends, weights=[b.get("weight", 1) for b in backends])[0]


def rewritten(backend: dict[str, Any], path: str, route: dict[str, Any]) -> str:
    """The path the backend receives: its `URLRewrite` `ReplacePrefixMatch` applied to the matched prefix."""
    for spec in backend.get("filters") or []:
        rewrite = (spec.get("urlRewrite") or {}).get("path") or {}
        if spec.get("type") == "URLRewrite" and rewrite.get("type") == "ReplacePrefixMatch":
            prefixes = [
                m["path"]["value"] for r in route["spec"]["rules"] for m in r.get("matches") or [] if m.get("path")
            ]
            prefix = max((p for p in prefixes if path.startswith(p)), key=len, default="")
            return str(rewrite["replacePrefixMatch"]) + path[len(prefix) :]
    return path


async def serve(kube: str, namespace: str, name: str, port: int, services: dict[str, str], poll_s: float) -> None:
    """Route requests on `port` by the route, re-read every `poll_s`, until cancelled."""
    import aiohttp
    from aiohttp import web

    state: dict[str, Any] = {"route": None}
    rng = random.Random(0)
    url = kube.rstrip("/") + ROUTE_API.format(namespace=namespace, name=name)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def watch() -> None:
        while True:
            try:
                async with session.get(url) as reply:
                    if reply.status == 200:
                        state["route"] = await reply.json()
            except aiohttp.ClientError:
                pass  # the API stand-in restarting: keep routing by the last route read
            await asyncio.sleep(poll_s)

    async def forward(request: web.Request) -> web.StreamResponse:
        route = state["route"]
        headers = {k.lower(): v for k, v in request.headers.items()}
        backend = pick(route, request.path, headers, rng) if route else None
        if backend is None:
            return web.Response(status=404, text="no HTTPRoute rule matches")
        target = services[backend["name"]] + rewritten(backend, request.path, route)
        body = await request.read()
        passed = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with session.request(request.method, target, data=body, headers=passed) as reply:
            content = await reply.read()
            return web.Response(status=reply.status, body=content, content_type=reply.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await watch()
    finally:
        await session.close()
        await runner.cleanup()


def main() -> None:
    """Parse the arguments and serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kube", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service", action="append", default=[], metavar="NAME=URL")
    parser.add_argument("--poll-s", type=float, default=0.2)
    args = parser.parse_args()
    services = dict(item.split("=", 1) for item in args.service)
    asyncio.run(serve(args.kube, args.namespace, args.name, args.port, services, args.poll_s))


if __name__ == "__main__":
    main()
