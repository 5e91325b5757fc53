"""What operators and probes read: Prometheus metrics, health, and the replicas' and router's
state. With several replicas they speak for all of them (gateway/fleet/fleet.py)."""
from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from gateway.mapping.protocol import Upstream


def ops_router(backend: Upstream) -> APIRouter:
    router = APIRouter(tags=["operations"])

    @router.get("/metrics", summary="Prometheus metrics, under vLLM's names, labelled by replica")
    async def metrics() -> Response:
        return PlainTextResponse(await backend.metrics(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @router.get("/health", summary="TGI's: 200 while a replica answers, else 503")
    async def health() -> Response:
        try:
            healthy = (await backend.stats()).get("healthy", False)
        except Exception:  # noqa: BLE001 - unreachable executor
            healthy = False
        return Response(status_code=200 if healthy else 503)

    @router.get("/stats", summary="batch occupancy and counters, summed over the replicas, each replica's own, "
                                  "and the router's choices")
    async def stats() -> Response:
        return JSONResponse(await backend.stats())

    return router
