"""A model's decision, checked and kept: validated against the agent's tools, recorded as a
payload whose hash the ledger compares, and kept by reference to the blob store when large
(records then hold a preview and the reference)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import ValidationError

from ratchet.engine import memory
from ratchet.engine.timers import tool_of
from ratchet.errors import ModelOutputInvalid
from ratchet.ports import BlobStore
from ratchet.state import INLINE_BYTES, PREVIEW_CHARS, BlobRef, Decision, Done, ToolCall
from ratchet.tools import Agent

ARGUMENT_PREVIEW_VALUE_BYTES = 80
"""In the preview of arguments kept by reference, a value whose JSON is up to this size is kept
as it is (a batch number, a flag); a larger one is replaced by its size."""
ARGUMENT_PREVIEW_KEYS = 12
"""At most this many argument names are kept in a preview; the rest are counted."""


def validated(decision: object, agent: Agent) -> Decision:
    if not isinstance(decision, ToolCall | Done):
        raise ModelOutputInvalid(
            f"the model returned {type(decision).__name__}, not a ToolCall or Done"
        )
    try:
        canonical(decision.model_dump(mode="json")).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ModelOutputInvalid(f"the model's answer is not valid Unicode: {error}") from None
    if isinstance(decision, Done):
        return decision
    if decision.name == memory.REMEMBER and memory.offers_remember(agent):
        try:
            args = memory.RememberArgs.model_validate(decision.arguments)
        except ValidationError as error:
            raise ModelOutputInvalid(f"invalid arguments for remember: {error}") from None
        return ToolCall(name=memory.REMEMBER, arguments=args.model_dump(mode="json"))
    tool = tool_of(agent, decision.name)
    if tool is None:
        known = ", ".join(t.name for t in agent.tools)
        raise ModelOutputInvalid(
            f"the model asked for unknown tool {decision.name!r}; known: {known}"
        )
    try:
        args = tool.parse(decision.arguments)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in error.errors()
        )
        raise ModelOutputInvalid(f"invalid arguments for {tool.name}: {problems}") from None
    # Record the arguments as the tool will see them, so the hash is stable across retries.
    return ToolCall(name=tool.name, arguments=args.model_dump(mode="json"))


def decision_from(payload: dict[str, Any]) -> Decision:
    if "summary" in payload:
        return Done.model_validate(payload)
    return ToolCall.model_validate(payload)


def payload_of(decision: Decision) -> dict[str, Any]:
    recorded = decision.model_dump(mode="json")
    # A call kept inline records exactly what it did before references existed, so its hash
    # (and so a ledger entry written by an older Ratchet) is unchanged.
    if recorded.get("blob", False) is None:
        del recorded["blob"]
    return recorded


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def payload_hash(recorded: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(recorded).encode("utf-8")).hexdigest()


def result_digest(text: str) -> str:
    """What the ledger keeps of a step's result: its hash. The result itself is in the step
    record, committed in the same write; keeping it twice only made each step write more."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def by_reference(decision: Decision, blobs: BlobStore) -> Decision:
    """The decision as every record keeps it: large arguments or a large summary go to the
    blob store, and the record holds a preview and the reference."""
    if isinstance(decision, Done):
        data = decision.summary.encode("utf-8")
        if len(data) <= INLINE_BYTES:
            return decision
        blob = blobs.put(data)
        return Done(summary=text_preview(decision.summary, blob))
    data = canonical(decision.arguments).encode("utf-8")
    if len(data) <= INLINE_BYTES:
        return decision
    blob = blobs.put(data)
    return ToolCall(name=decision.name, arguments=arguments_preview(decision.arguments), blob=blob)


def arguments_of(call: ToolCall, blobs: BlobStore) -> dict[str, Any]:
    """The call's full arguments, read back from the blob store if they are kept there."""
    if call.blob is None:
        return call.arguments
    # The blob store checks the bytes against their SHA-256 (`BlobCorrupt` otherwise).
    arguments = json.loads(blobs.get(call.blob))
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments blob {call.blob.sha256} does not hold an object")
    return arguments


def arguments_preview(arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments kept by reference, as records show them: small values as they are (so a
    scripted policy can still read, say, a batch number), large ones as their size."""
    preview: dict[str, Any] = {}
    for index, (name, value) in enumerate(list(arguments.items())[:ARGUMENT_PREVIEW_KEYS]):
        size = len(canonical(value).encode("utf-8"))
        shown = name if len(name) <= 64 else f"{name[:48]}…#{index}"
        preview[shown] = (
            value if size <= ARGUMENT_PREVIEW_VALUE_BYTES else f"[{size:,} bytes, by reference]"
        )
    if len(arguments) > ARGUMENT_PREVIEW_KEYS:
        preview["…"] = f"{len(arguments) - ARGUMENT_PREVIEW_KEYS} more arguments"
    return preview


def text_preview(text: str, blob: BlobRef) -> str:
    return text[:PREVIEW_CHARS] + f"… [{blob.size:,} bytes in blob {blob.sha256[:12]}]"
