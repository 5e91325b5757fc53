"""Each transport's code for each error kind: one table per transport, keyed by the enum,
so that a kind added to ErrorKind without a code fails a test (tests/unit/test_contract.py).
gRPC codes are named as text (grpc.StatusCode[name]): the contract imports no grpc."""
from .errors import ErrorKind

HTTP_STATUS: dict[ErrorKind, int] = {  # TGI's and Jina's routes; OpenAI's differ below
    ErrorKind.VALIDATION: 422, ErrorKind.OVERLOADED: 429, ErrorKind.GENERATION: 500,
    ErrorKind.UNPROCESSABLE: 422, ErrorKind.NOT_FOUND: 404, ErrorKind.AUTHENTICATION: 401, ErrorKind.INTERNAL: 500}

OPENAI_STATUS: dict[ErrorKind, int] = {**HTTP_STATUS, ErrorKind.VALIDATION: 400}  # OpenAI's 400

OPENAI_ERROR_TYPE: dict[ErrorKind, str] = {
    ErrorKind.VALIDATION: "invalid_request_error", ErrorKind.OVERLOADED: "overloaded_error",
    ErrorKind.GENERATION: "server_error", ErrorKind.UNPROCESSABLE: "invalid_request_error",
    ErrorKind.NOT_FOUND: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error", ErrorKind.INTERNAL: "server_error"}

ANTHROPIC_STATUS: dict[ErrorKind, int] = {  # Anthropic's Messages API: 529 for an overloaded server
    ErrorKind.VALIDATION: 400, ErrorKind.OVERLOADED: 529, ErrorKind.GENERATION: 500,
    ErrorKind.UNPROCESSABLE: 400, ErrorKind.NOT_FOUND: 404, ErrorKind.AUTHENTICATION: 401, ErrorKind.INTERNAL: 500}

ANTHROPIC_ERROR_TYPE: dict[ErrorKind, str] = {
    ErrorKind.VALIDATION: "invalid_request_error", ErrorKind.OVERLOADED: "overloaded_error",
    ErrorKind.GENERATION: "api_error", ErrorKind.UNPROCESSABLE: "invalid_request_error",
    ErrorKind.NOT_FOUND: "not_found_error", ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.INTERNAL: "api_error"}

OLLAMA_STATUS: dict[ErrorKind, int] = {  # Ollama's API: 503 when the server is busy
    **OPENAI_STATUS, ErrorKind.OVERLOADED: 503, ErrorKind.UNPROCESSABLE: 400}

# a refusal before the first token ends the call with this status; None: it comes as an
# error document, as every failure after the first token does
GRPC_STATUS: dict[ErrorKind, str | None] = {
    ErrorKind.VALIDATION: "INVALID_ARGUMENT", ErrorKind.OVERLOADED: "RESOURCE_EXHAUSTED",
    ErrorKind.GENERATION: None, ErrorKind.UNPROCESSABLE: "FAILED_PRECONDITION", ErrorKind.NOT_FOUND: "NOT_FOUND",
    ErrorKind.AUTHENTICATION: "UNAUTHENTICATED", ErrorKind.INTERNAL: None}


def error_kind(name: str | None) -> ErrorKind:
    """The kind a document's `error_type` names; anything else is internal."""
    try:
        return ErrorKind(name or "")
    except ValueError:
        return ErrorKind.INTERNAL
