"""OpenAI's Responses API, for the responses this gateway keeps: `background: true` (with
`store: true`) answers at once with the response's id, and the answer is generated on whoever
reads it; then `GET /v1/responses/{id}` (a snapshot, or with `stream=true&starting_after=N` the
events after sequence number N), `POST /v1/responses/{id}/cancel` and `DELETE /v1/responses/{id}`;
and a request's `previous_response_id`, which goes on from a kept response's conversation.

The events are the stream store's (gateway/edge/resumable.py), kept within its bounds: a response
is gone LLM_RESUME_SECONDS after it ended. An event's sequence number is its place in the stream,
so `starting_after` is the store's own position.
"""
import json
from typing import Any, Optional, Union

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response, StreamingResponse

from contract import ErrorKind
from gateway.edge.backend import error_doc
from gateway.edge.resumable import StoredStream, streams
from gateway.mapping.inputs import BadRequest
from gateway.mapping.protocol import SSE, SSE_HEADERS
from gateway.protocols.openai_routes import openai_refusal

ROUTE = "/v1/responses"  # where a response's stream was made


def _stored(response_id: str) -> Optional[StoredStream]:
    stored = streams().by_id(ROUTE, response_id)
    return stored if stored is not None and stored.background else None


def _missing(response_id: str) -> Response:
    return openai_refusal(error_doc(f"response_id: no response {response_id!r} is kept here (a background "
                                      f"response is kept LLM_RESUME_SECONDS after it ended)",
                                      ErrorKind.NOT_FOUND, "response_id"))


async def _stop(response_id: str) -> Union[StoredStream, Response]:
    """The kept response, its generation stopped (a 404 answer when none is kept)."""
    stored = _stored(response_id)
    if stored is None:
        return _missing(response_id)
    await streams().cancel(stored)
    return stored


def earlier_items(response_id: str) -> list[dict[str, Any]]:
    """The items a response with `previous_response_id` goes on from: the kept response's input
    items (its own earlier ones first), then its output."""
    stored = _stored(response_id)
    if stored is None:
        raise BadRequest(f"previous_response_id: no response {response_id!r} is kept here (background responses "
                         f"are kept, LLM_RESUME_SECONDS after they end)", "previous_response_id")
    if not stored.done:
        raise BadRequest(f"previous_response_id: {response_id!r} is still in progress", "previous_response_id")
    return list(stored.context.items) + list(snapshot(stored).get("output", []))


def snapshot(stored: StoredStream) -> dict[str, Any]:
    """The response as its latest event that carries it says, with the status of now."""
    response: dict[str, Any] = {}
    error = None
    for frame in stored.frames:
        data = json.loads(frame.split("data: ", 1)[1])
        if "response" in data:
            response = data["response"]
        elif data.get("type") == "error":
            error = {"code": data.get("code"), "message": data.get("message")}
    if stored.cancelled:
        return {**response, "status": "cancelled"}
    if error is not None:
        return {**response, "status": "failed", "error": error}
    if stored.done and response.get("status") == "in_progress":  # ended without its last event
        return {**response, "status": "failed", "error": {"code": "generation", "message": "the response ended early"}}
    return response


def add_stored_routes(router: APIRouter) -> None:
    """GET, cancel and DELETE of a kept response, on the Responses router (its prefix, /v1)."""

    @router.get("/responses/{response_id}", summary="A kept response: whole, or its events (stream=true)")
    async def retrieve(response_id: str, stream: bool = False,
                       starting_after: Optional[int] = None) -> Response:
        stored = _stored(response_id)
        if stored is None:
            return _missing(response_id)
        if not stream:
            return JSONResponse(snapshot(stored))
        start = 0 if starting_after is None else starting_after + 1
        if start < 0:
            return openai_refusal(error_doc("starting_after: must be a sequence number, 0 or more",
                                              ErrorKind.VALIDATION, "starting_after"))
        return StreamingResponse(streams().read(stored, start), media_type=SSE, headers=SSE_HEADERS)

    @router.post("/responses/{response_id}/cancel", summary="Stop a background response")
    async def cancel(response_id: str) -> Response:
        stopped = await _stop(response_id)
        return stopped if isinstance(stopped, Response) else JSONResponse(snapshot(stopped))

    @router.delete("/responses/{response_id}", summary="Forget a kept response (stopping it first)")
    async def delete(response_id: str) -> Response:
        stopped = await _stop(response_id)
        if isinstance(stopped, Response):
            return stopped
        streams().forget(stopped)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})
