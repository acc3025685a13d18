"""`ratchet serve`: the deployment's HTTP routes on localhost, served by the same handlers.

Each request becomes the API Gateway (REST, proxy integration) event that the Lambda function
would receive, goes to the same Powertools app, and its answer goes back as the HTTP response.
So the approval page, its form and the runs API behave locally exactly as deployed; only the
runtime behind them differs (SQLite, and a decision makes the run runnable for the next
worker). Werkzeug does the HTTP; nothing here parses it by hand.
"""

from __future__ import annotations

import base64
import socket
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.utilities.typing import LambdaContext
from werkzeug.datastructures import Headers
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wrappers import Request, Response

from ratchet.errors import InvalidInput

MAX_BODY_BYTES = 1024 * 1024
STAGE = "local"


@dataclass(frozen=True)
class LocalContext:
    """The fields of Lambda's context object that the resolvers may read."""

    function_name: str = "ratchet-serve"
    aws_request_id: str = ""
    invoked_function_arn: str = "arn:aws:lambda:local:000000000000:function:ratchet-serve"
    memory_limit_in_mb: int = 256


Route = tuple[str, APIGatewayRestResolver]
"""A path prefix and the app that serves it."""


def proxy_event(request: Request) -> dict[str, Any]:
    """The API Gateway REST proxy event for a request."""
    body = request.get_data(cache=False)
    text_like = request.mimetype.startswith("text/") or request.mimetype in (
        "application/json",
        "application/x-www-form-urlencoded",
    )
    multi_query = {k: request.args.getlist(k) for k in request.args}
    headers = dict(request.headers.items())
    return {
        "resource": request.path,
        "path": request.path,
        "httpMethod": request.method,
        "headers": headers,
        "multiValueHeaders": {k: request.headers.getlist(k) for k in headers},
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "resourcePath": request.path,
            "httpMethod": request.method,
            "stage": STAGE,
            "path": request.path,
            "identity": {"sourceIp": request.remote_addr or "127.0.0.1"},
        },
        "body": (body.decode("utf-8") if text_like else base64.b64encode(body).decode())
        if body
        else None,
        "isBase64Encoded": bool(body) and not text_like,
    }


def wsgi_app(routes: Sequence[Route]) -> Callable[[dict[str, Any], Any], Iterable[bytes]]:
    def application(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        request.max_content_length = MAX_BODY_BYTES
        app = next((a for prefix, a in routes if request.path.startswith(prefix)), None)
        if app is None:
            response = Response("not found\n", status=404, content_type="text/plain")
            return response(environ, start_response)
        try:
            event = proxy_event(request)
        except UnicodeDecodeError:
            response = Response("the body is not UTF-8\n", status=400, content_type="text/plain")
            return response(environ, start_response)
        context = LocalContext(aws_request_id=event["requestContext"]["requestId"])
        answer = app.resolve(event, cast(LambdaContext, context))
        body = answer.get("body") or ""
        data = base64.b64decode(body) if answer.get("isBase64Encoded") else body.encode("utf-8")
        headers = Headers()
        for name, value in (answer.get("headers") or {}).items():
            headers[name] = str(value)
        for name, values in (answer.get("multiValueHeaders") or {}).items():
            for value in values:
                headers.add(name, str(value))
        # Given up front, the handler's headers stand alone: werkzeug adds its default
        # Content-Type only to a response that has none.
        response = Response(data, status=int(answer["statusCode"]), headers=headers)
        return response(environ, start_response)

    return application


def server(routes: Sequence[Route], *, host: str, port: int) -> BaseWSGIServer:
    """One request at a time: the local store is one SQLite connection, and a person
    clicking a link needs no more. Raises `InvalidInput` if the address cannot be used."""
    # werkzeug prints and exits the process on a taken port; find out first, with its words.
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except (OSError, OverflowError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise InvalidInput(f"cannot listen on {host}:{port}: {reason}") from None
    return make_server(host, port, wsgi_app(routes), threaded=False)
