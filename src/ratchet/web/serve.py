"""`ratchet serve`: the deployment's HTTP routes on localhost, served by the same handlers.

Each request becomes the API Gateway (REST, proxy integration) event that the Lambda function
would receive, goes to the same Powertools app, and its answer goes back as the HTTP response.
So the approval page, its form and the runs API behave locally exactly as deployed; only the
runtime behind them differs (SQLite, and a decision makes the run runnable for the next
worker). Werkzeug reads the requests and waitress serves them; nothing here parses HTTP by hand.

Bound to an address other people can reach, the routes that act on the store itself (the
runs API, the schedules, the dashboard, whose pages carry the operator's own approval links)
take a bearer token (`BearerToken`); the approval pages, Slack's buttons and the webhooks carry
signatures of their own and stay open, as on AWS.

Waitress reads and writes every connection without blocking on any, and hands the app a
request only once it has all of it: a browser's speculative connection, or a client that sends
half a request and stops, holds up nobody, and is closed after `IDLE_SECONDS`. The app itself
runs one request at a time, on one thread of its own (`AppThread`): the local store is one
SQLite connection, and an agent's thread-bound resources stay on one thread. The routes that
hold a connection open (a run's feed, the long poll: `OffThread`, `ratchet.web.feed`) run on
their connection's own thread instead, with a store connection of their own, so a feed open
for an hour holds up no other request.

Since the app sees a request only once its body is in, a body's size is checked where waitress
reads it (`bounded_channel`): a declared `Content-Length` over the route's limit (`BodyLimit`;
`MAX_BODY_BYTES` for the others) is answered 413 as soon as the headers are in, none of the
body read and none waited for, and the connection closed; a chunked body, once it grows past
the limit.
"""

from __future__ import annotations

import base64
import hmac
import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, cast

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.utilities.typing import LambdaContext
from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import BaseWSGIServer, create_server
from waitress.utilities import RequestEntityTooLarge as WaitressTooLarge
from werkzeug.datastructures import Headers
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Request, Response

from ratchet.errors import InvalidInput

MAX_BODY_BYTES = 1024 * 1024
"""The most bytes of body a request may have, on a route with no limit of its own."""
STAGE = "local"
IDLE_SECONDS = 30
"""A connection that sends nothing and reads nothing for this long is closed (checked as
often); whatever it held, nothing else waited for it meanwhile."""
CONNECTION_LIMIT = 200
"""Connections open at once; more wait in the listen backlog until one closes."""
THREADS = 24
"""Waitress's threads: each request is handed to one. A request for the app waits there for
the app's own thread (`AppThread`); an `OffThread` route (an open feed, a long poll) is served
on it, so up to `ratchet.web.feed.MAX_FEEDS` feeds leave threads for everything else."""


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


LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
"""The addresses `ratchet serve` takes for this machine alone. Other loopback addresses
(127.0.0.2, ...) count as reachable: a container or a forwarded port may expose them, and a
test can bind one to see the token asked for."""


def is_local(host: str) -> bool:
    return host.lower() in LOCAL_HOSTS


@dataclass(frozen=True)
class BearerToken:
    """The token the routes under `prefixes` take, as `Authorization: Bearer <token>`."""

    token: str
    prefixes: tuple[str, ...]

    def refusal(self, request: Request) -> Response | None:
        """None if `request` may go on; else the 401 that says what it lacks."""
        if not request.path.startswith(self.prefixes):
            return None
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # Bytes, not str: compare_digest refuses non-ASCII text, which a header may hold.
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode("utf-8", "surrogateescape"), self.token.encode()
        ):
            return None
        error = (
            "this server is reachable from the network: send Authorization: Bearer <token>, "
            "the token in the file `ratchet serve` named when it started"
        )
        body = json.dumps({"error": error, "problems": []})
        return Response(
            body,
            status=401,
            content_type="application/json",
            headers={"WWW-Authenticate": 'Bearer realm="ratchet"', "Cache-Control": "no-store"},
        )


BodyLimit = tuple[str, int]
"""A path prefix and the most bytes of body its routes take (others take `MAX_BODY_BYTES`)."""


def body_limit(path: str, limits: Sequence[BodyLimit]) -> int:
    """The most bytes of body a request for `path` may have."""
    return next((n for prefix, n in limits if path.startswith(prefix)), MAX_BODY_BYTES)


class _BodyTooLarge(WaitressTooLarge):
    """Waitress's 413, in the routes' JSON envelope."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"body: over the {limit:,}-byte limit")
        self.limit = limit

    # Waitress writes the body it is given as bytes (its stubs say str).
    def to_response(self, ident: str | None = None) -> Any:
        return (
            "413 Request Entity Too Large",
            [("Content-Type", "application/json")],
            _too_large(self.limit).get_data(),
        )


def bounded_channel(limits: Sequence[BodyLimit]) -> type[HTTPChannel]:
    """Waitress's connection, refusing a body over its route's limit as soon as it knows:
    waitress reads a request's whole body before the app can look at it (a 40 MiB body read
    to a file to be refused), and waits `IDLE_SECONDS` for one declared and never sent."""

    class BoundedRequest(HTTPRequestParser):
        def received(self, data: bytes) -> int:
            consumed = super().received(data)
            # Called first with the headers alone (the body comes in later calls), so a
            # declared length over the limit is refused before a byte of the body is read.
            # Waitress's own refusal (over its cap) gets the routes' words too.
            refused = self.error is not None and not isinstance(self.error, WaitressTooLarge)
            if self.headers_finished and not refused:
                # `path` is set with the headers (waitress's stubs leave it out).
                limit = body_limit(getattr(self, "path", ""), limits)
                so_far = len(self.body_rcv) if self.body_rcv is not None else 0
                if max(self.content_length, so_far) > limit:
                    # An error completes the request: waitress answers it, reads nothing more
                    # from the connection and closes it.
                    self.error = _BodyTooLarge(limit)
                    self.completed = True
                    self.expect_continue = False  # no "100 Continue" inviting the body
            return consumed

    class BoundedChannel(HTTPChannel):
        parser_class = BoundedRequest

    return BoundedChannel


class OffThread(Protocol):
    """A route served on its connection's own thread rather than the app's: one that holds
    the connection open (a feed, a long poll), reading a store connection of its own."""

    def claims(self, request: Request) -> bool:
        """Whether `request` is this route's."""
        ...

    def __call__(
        self, request: Request, environ: dict[str, Any], start_response: Any
    ) -> Iterable[bytes] | None:
        """The answer, or None to hand the request on to the app (after waiting: a long
        poll)."""
        ...

    def stop(self) -> None:
        """End what it holds open: the server is stopping."""
        ...


class AppThread:
    """The one thread the apps run on, one request at a time: they share the runtime's one
    SQLite connection (and its transactions), and an agent's resources bound to a thread stay
    on it. A request waits for it on the server's thread that took it."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratchet-serve-app")

    def run(self, answer: Callable[[], Iterable[bytes]]) -> Iterable[bytes]:
        return self._executor.submit(answer).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def wsgi_app(
    routes: Sequence[Route],
    *,
    body_limits: Sequence[BodyLimit] = (),
    bearer: BearerToken | None = None,
    off_thread: Sequence[OffThread] = (),
    app_thread: AppThread | None = None,
) -> Callable[[dict[str, Any], Any], Iterable[bytes]]:
    """The WSGI application of `routes`: the bearer's check first, then an `off_thread` route
    that claims the request, then the apps, on `app_thread` (or, without one, one request at
    a time on whichever thread calls)."""
    one_at_a_time = threading.Lock()

    def answer(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        with one_at_a_time:
            return _answer(routes, body_limits, bearer, environ, start_response)

    def application(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if off_thread:
            request = Request(environ)
            refusal = bearer.refusal(request) if bearer is not None else None
            route = next((r for r in off_thread if r.claims(request)), None)
            if refusal is None and route is not None:
                answered = route(request, environ, start_response)
                if answered is not None:
                    return answered
        if app_thread is None:
            return answer(environ, start_response)
        return app_thread.run(lambda: answer(environ, start_response))

    return application


def _answer(
    routes: Sequence[Route],
    body_limits: Sequence[BodyLimit],
    bearer: BearerToken | None,
    environ: dict[str, Any],
    start_response: Any,
) -> Iterable[bytes]:
    request = Request(environ)
    refusal = bearer.refusal(request) if bearer is not None else None
    if refusal is not None:
        return refusal(environ, start_response)
    # Checked here too for the app served by something other than `LocalServer` (werkzeug's
    # test client, a WSGI server of the user's).
    request.max_content_length = body_limit(request.path, body_limits)
    app = next((a for prefix, a in routes if request.path.startswith(prefix)), None)
    if app is None:
        response = Response("not found\n", status=404, content_type="text/plain")
        return response(environ, start_response)
    try:
        # A body over the limit is refused on its Content-Length, before it is read.
        event = proxy_event(request)
    except RequestEntityTooLarge:
        return _too_large(request.max_content_length)(environ, start_response)
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


def _too_large(limit: int) -> Response:
    error = f"body: over the {limit:,}-byte limit"
    body = json.dumps({"error": error, "problems": [{"field": "body", "message": error}]})
    return Response(body, status=413, content_type="application/json")


class LocalServer:
    """`ratchet serve`'s HTTP server on one listening socket: waitress, whose one task thread
    runs the app (so an agent's thread-bound resources stay on one thread, as in a worker)."""

    def __init__(
        self,
        application: Any,
        listening: socket.socket,
        idle_seconds: int,
        body_limits: Sequence[BodyLimit] = (),
        *,
        app_thread: AppThread | None = None,
        off_thread: Sequence[OffThread] = (),
    ) -> None:
        self._sockets: dict[int, Any] = {}
        self._app_thread = app_thread
        self._off_thread = off_thread
        self.server_port: int = listening.getsockname()[1]
        server = create_server(
            application,
            map=self._sockets,
            sockets=[listening],
            threads=THREADS if app_thread is not None else 1,
            channel_timeout=idle_seconds,
            cleanup_interval=idle_seconds,
            connection_limit=CONNECTION_LIMIT,
            asyncore_use_poll=True,  # select() cannot watch a descriptor over 1,023
            ident="ratchet",
            # Waitress's own cap (it refuses a length equal to it), under the bounded channel.
            max_request_body_size=max([MAX_BODY_BYTES, *(n for _, n in body_limits)]) + 1,
        )
        # One listening socket: one server, not waitress's MultiSocketServer of several.
        assert isinstance(server, BaseWSGIServer)
        server.channel_class = bounded_channel(body_limits)
        self._server = server

    def serve_forever(self) -> None:
        """Serve until a KeyboardInterrupt (Ctrl-C, or SIGTERM as `ratchet serve` maps it)."""
        self._server.run()

    def server_close(self) -> None:
        for route in self._off_thread:
            route.stop()  # an open feed would hold its thread until the dispatcher gives up
        self._server.task_dispatcher.shutdown()
        wasyncore.close_all(self._sockets)
        if self._app_thread is not None:
            self._app_thread.shutdown()


def server(
    routes: Sequence[Route],
    *,
    host: str,
    port: int,
    idle_seconds: int = IDLE_SECONDS,
    body_limits: Sequence[BodyLimit] = (),
    bearer: BearerToken | None = None,
    off_thread: Sequence[OffThread] = (),
) -> LocalServer:
    """The server of `routes` on `host:port` (0: any free port). Raises `InvalidInput` if the
    address cannot be used."""
    return serve_on(
        listen(host, port),
        routes,
        idle_seconds=idle_seconds,
        body_limits=body_limits,
        bearer=bearer,
        off_thread=off_thread,
    )


def serve_on(
    listening: socket.socket,
    routes: Sequence[Route],
    *,
    idle_seconds: int = IDLE_SECONDS,
    body_limits: Sequence[BodyLimit] = (),
    bearer: BearerToken | None = None,
    off_thread: Sequence[OffThread] = (),
) -> LocalServer:
    """The server of `routes` (and of the `off_thread` routes, each on its connection's
    thread) on a socket `listen` bound."""
    app_thread = AppThread() if off_thread else None
    app = wsgi_app(
        routes,
        body_limits=body_limits,
        bearer=bearer,
        off_thread=off_thread,
        app_thread=app_thread,
    )
    return LocalServer(
        app, listening, idle_seconds, body_limits, app_thread=app_thread, off_thread=off_thread
    )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (0: any free port), before anything is served on it: so
    what is served knows its address. Raises `InvalidInput` if the address cannot be used."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listening = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:
        raise InvalidInput(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((host, port))
    except (OSError, OverflowError) as error:
        listening.close()
        reason = getattr(error, "strerror", None) or str(error)
        raise InvalidInput(f"cannot listen on {host}:{port}: {reason}") from None
    return listening


def listening_url(host: str, port: int) -> str:
    """`http://host:port`, an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def base_url(host: str, port: int) -> str:
    """Where a server listening on `host:port` is reached: the machine's name for an address
    of every interface (0.0.0.0, ::), which names none."""
    return listening_url(socket.gethostname() if host in ("0.0.0.0", "::") else host, port)
