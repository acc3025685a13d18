"""Tools from MCP servers (`Agent(mcp=[McpServer(...)])`, docs/mcp.md), over the official `mcp`
SDK: the only module that imports it, and only when an agent declares a server.

A run's MCP tools are listed once, when it is created (`pins_for`), and kept in its data under
`mcp-tools/<server>`: names, descriptions, input schemas and annotations. Every binding of the
run, in any worker or Lambda container, builds the same tools from that pin (`bind_tools`), so
a server whose list changes later never changes a running run's tools; a pinned tool the server
no longer has fails its step (`McpToolGone`).

The SDK is async and the engine calls tools on a thread of its own, so each listing and each
call opens one connection (an HTTP session, or for stdio one server process) inside its own
`anyio.run` and closes it: no loop or connection outlives a call, so nothing is shared between
the engine's threads or left half-open by a call its step abandoned.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

import anyio
import httpx2
import mcp_types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import RequestParamsMeta
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from ratchet.errors import McpServerUnavailable, McpToolGone
from ratchet.ports import MAX_DATA_VALUE_BYTES, RunData, ToolSpec
from ratchet.tools import Agent, McpServer, Tool, ToolContext

IDEMPOTENCY_KEY_META = "ratchet/idempotency_key"
"""The `_meta` key of every side-effecting call: the step's idempotency key, `<run>/step-<n>`,
the same on every attempt of the step."""
PIN_PREFIX = "mcp-tools/"
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""The tool names a model API takes (Anthropic's); MCP allows more (`.`, `/`)."""
CONNECT_SECONDS = 30.0
MAX_LIST_PAGES = 100
"""A server's tool list on more pages than this is refused: a paginator that never ends must
not hang a run's start."""

_T = TypeVar("_T")


class PinnedTool(BaseModel):
    """One tool as its server listed it when the run started."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    annotations: dict[str, Any] = Field(default_factory=dict)
    """MCP's tool annotations as on the wire (`readOnlyHint`, `idempotentHint`, ...)."""


class Pin(BaseModel):
    """What a run keeps of one server: its tools at the run's start."""

    server: str
    tools: list[PinnedTool]


class McpArguments(BaseModel):
    """A call's arguments, kept as given once the pinned input schema accepts them."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class McpTool(Tool[McpArguments]):
    """A pinned MCP tool: its spec is the server's schema, its handler one call to the server."""

    input_schema: Mapping[str, Any] = field(default_factory=dict)

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name, description=self.description, input_schema=dict(self.input_schema)
        )

    def parse(self, arguments: Mapping[str, Any]) -> McpArguments:
        """The arguments, if the pinned schema accepts them; a `ValidationError` naming the
        first field at fault otherwise, as a tool's pydantic model would."""
        import jsonschema

        given = dict(arguments)
        validator = jsonschema.Draft202012Validator(dict(self.input_schema))
        error = jsonschema.exceptions.best_match(validator.iter_errors(given))
        if error is not None:
            problem = InitErrorDetails(
                type=PydanticCustomError("mcp_arguments", "{message}", {"message": error.message}),
                loc=tuple(error.absolute_path),
                input=error.instance,
            )
            raise ValidationError.from_exception_data(self.name, [problem])
        return McpArguments.model_validate(given)


def side_effect_class(server: McpServer, annotations: Mapping[str, Any]) -> tuple[bool, bool]:
    """(side_effect, at_most_once) from a tool's annotations. `readOnlyHint: true` is no side
    effect. Any other tool is one; it is at most once unless it is `idempotentHint: true` or its
    server honours the idempotency key. A missing hint counts as MCP's default: not read-only,
    not idempotent."""
    if annotations.get("readOnlyHint") is True:
        return False, False
    idempotent = annotations.get("idempotentHint") is True
    return True, not (idempotent or server.honours_idempotency_key)


def pin_key(server: McpServer) -> str:
    return f"{PIN_PREFIX}{server.name}"


def pins_for(agent: Agent) -> dict[str, str]:
    """What a new run keeps of the agent's servers: each listed now, checked, and its pin
    (under `pin_key`) ready to write with `put_once`, so that a pin already there (a start
    retried after a crash, a fork whose hook copied its source's data) is kept, and a run's
    tools are fixed by its first pin. Raises, before anything is written, for a server that
    cannot be reached (`McpServerUnavailable`), or (`ValueError`) a tool `McpServer.tools`
    names that it lacks, two tools of one name, or a list too large to keep."""
    pins: dict[str, str] = {}
    seen = {t.name: f"agent {agent.name!r}" for t in agent.tools}
    for server in agent.mcp:
        listed = list_tools(server)
        if server.tools is not None:
            missing = sorted(set(server.tools) - {t.name for t in listed})
            if missing:
                raise ValueError(
                    f"MCP server {server.name!r} ({server.where}) has no tool {missing[0]!r}"
                )
            listed = [t for t in listed if t.name in server.tools]
        for pinned in listed:
            if not TOOL_NAME.fullmatch(pinned.name):
                raise ValueError(
                    f"MCP server {server.name!r} has a tool named {pinned.name!r}, which a "
                    "model API refuses (1-64 letters, digits, _ and -): leave it out with "
                    "McpServer(tools=[...])"
                )
            if pinned.name in seen:
                raise ValueError(
                    f"MCP server {server.name!r} has a tool {pinned.name!r}, as has "
                    f"{seen[pinned.name]}: a run's tools need distinct names"
                )
            seen[pinned.name] = f"MCP server {server.name!r}"
        value = Pin(server=server.name, tools=listed).model_dump_json()
        if len(value.encode("utf-8")) > MAX_DATA_VALUE_BYTES:
            raise ValueError(
                f"MCP server {server.name!r} lists {len(listed)} tools, over the "
                f"{MAX_DATA_VALUE_BYTES:,} bytes a run keeps per server: name the ones the "
                "agent needs with McpServer(tools=[...])"
            )
        pins[pin_key(server)] = value
    return pins


def bind_tools(agent: Agent, data: RunData | None) -> Agent:
    """The agent with the run's pinned MCP tools beside its own. A server the agent declares
    and the run has no pin for (the run started before it was declared) adds no tools, as does
    a pin of a server the agent no longer declares (it could not be called)."""
    if not agent.mcp:
        return agent
    if data is None:
        raise ValueError(
            f"agent {agent.name!r} takes MCP tools, and this run has no data to read them from"
        )
    tools: list[Tool[Any]] = []
    for server in agent.mcp:
        stored = data.get(pin_key(server))
        if stored is None:
            continue
        for pinned in Pin.model_validate_json(stored).tools:
            side_effect, at_most_once = side_effect_class(server, pinned.annotations)
            tools.append(
                McpTool(
                    name=pinned.name,
                    description=pinned.description or f"{pinned.name} (MCP: {server.name})",
                    args=McpArguments,
                    handler=_Call(server, pinned.name, side_effect),
                    side_effect=side_effect,
                    at_most_once=at_most_once,
                    input_schema=pinned.input_schema,
                )
            )
    return replace(agent, tools=[*agent.tools, *tools])


@dataclass(frozen=True)
class _Call:
    server: McpServer
    tool: str
    side_effect: bool

    def __call__(self, args: McpArguments, ctx: ToolContext) -> str:
        key = ctx.idempotency_key if self.side_effect else None
        return call_tool(self.server, self.tool, args.model_dump(mode="json"), key=key)


def list_tools(server: McpServer) -> list[PinnedTool]:
    """Every tool the server lists now, page by page."""

    async def listing() -> list[PinnedTool]:
        async with _connected(server) as client:
            return [_pinned(tool) for tool in await _listed(server, client)]

    return _run(server, "listing its tools", listing)


def call_tool(server: McpServer, name: str, arguments: dict[str, Any], *, key: str | None) -> str:
    """One call, as text for the model; `key`, the step's idempotency key, goes in the
    request's `_meta` (side-effecting tools only). A result the server marks as an error is
    the step's result (the tool ran and said why it failed, for the model to read). A tool the
    server no longer lists, whether it answers with such a result or with a protocol error
    (MCP's `Unknown tool`), is `McpToolGone`: no retry can bring it back."""
    meta = cast("RequestParamsMeta", {IDEMPOTENCY_KEY_META: key}) if key is not None else None

    async def calling() -> str:
        async with _connected(server) as client:
            try:
                result = await client.call_tool(name, arguments, meta=meta)
            except MCPError:
                await _still_listed(server, client, name)
                raise
            if result.is_error:
                await _still_listed(server, client, name)
                return f"{name} reported an error: {_text(result)}"
            return _text(result)

    return _run(server, f"calling {name}", calling)


async def _listed(server: McpServer, client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise McpServerUnavailable(
        f"MCP server {server.name!r} ({server.where}) lists its tools on more than "
        f"{MAX_LIST_PAGES} pages"
    )


async def _still_listed(server: McpServer, client: Client, name: str) -> None:
    if all(tool.name != name for tool in await _listed(server, client)):
        raise McpToolGone(
            f"MCP server {server.name!r} ({server.where}) no longer has the tool {name!r} "
            "this run pinned when it started: the run cannot call it"
        )


@asynccontextmanager
async def _connected(server: McpServer) -> AsyncIterator[Client]:
    if server.url is not None:
        http = httpx2.AsyncClient(
            headers=dict(server.headers),
            timeout=httpx2.Timeout(CONNECT_SECONDS, read=server.timeout_seconds),
        )
        async with (
            http,
            Client(
                streamable_http_client(server.url, http_client=http),
                read_timeout_seconds=server.timeout_seconds,
            ) as client,
        ):
            yield client
        return
    assert server.command is not None
    params = StdioServerParameters(
        command=server.command,
        args=list(server.args),
        env=dict(server.env) if server.env is not None else None,
    )
    async with Client(params, read_timeout_seconds=server.timeout_seconds) as client:
        yield client


def _run(server: McpServer, doing: str, work: Callable[[], Awaitable[_T]]) -> _T:
    try:
        return anyio.run(work)
    except (
        McpToolGone,
        McpServerUnavailable,
        MCPError,
        OSError,
        TimeoutError,
        httpx2.HTTPError,
        ExceptionGroup,
    ) as error:
        # The SDK's task groups wrap a transport's failure in an exception group: what went
        # wrong is its first leaf. Anything else there (a bug) is raised as it came.
        reason = _first(error)
        if isinstance(reason, McpToolGone | McpServerUnavailable):
            raise reason from None
        if not isinstance(reason, MCPError | OSError | TimeoutError | httpx2.HTTPError):
            raise
        raise McpServerUnavailable(
            f"MCP server {server.name!r} ({server.where}) failed {doing}: "
            f"{type(reason).__name__}: {' '.join(str(reason).split()) or 'no detail'}"
        ) from reason


def _first(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _pinned(tool: mcp_types.Tool) -> PinnedTool:
    wire = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    return PinnedTool(
        name=tool.name,
        description=tool.description or "",
        input_schema=wire.get("inputSchema") or {"type": "object"},
        annotations=wire.get("annotations") or {},
    )


def _text(result: mcp_types.CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:
            kind = getattr(block, "type", type(block).__name__)
            mime = getattr(block, "mime_type", None)
            parts.append(f"[{kind}{f': {mime}' if mime else ''}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True))
    return "\n".join(parts)
