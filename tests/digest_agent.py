"""An agent whose steps carry what a real agent's often do and no line can break where a word
ends: the path of each export it archives (in its call) and the export's checksum (its result,
`sha512:` and 128 hex digits). The dashboard's browser test runs it with `ratchet run --agent
tests.digest_agent:agent`."""

from __future__ import annotations

import hashlib

from pydantic import BaseModel

from ratchet.tools import Agent, Done, StepView, Tool, ToolCall, ToolContext

EXPORTS = 3


class Export(BaseModel):
    path: str


def checksum(args: Export, ctx: ToolContext) -> str:
    return f"sha512:{hashlib.sha512(args.path.encode()).hexdigest()}"


def each_export(view: StepView) -> ToolCall | Done:
    if view.step <= EXPORTS:
        path = (
            f"exports/2026_12_06/orders_full_snapshot_part_{view.step:04d}_of_{EXPORTS:04d}.csv.gz"
        )
        return ToolCall(name="checksum", arguments={"path": path})
    return Done(summary=f"checksummed {EXPORTS} exports")


agent = Agent(
    name="digests",
    tools=[Tool("checksum", "The export's SHA-512.", Export, checksum)],
    goal="Checksum each export",
    policy=each_export,
)
