"""Ratchet on AWS, as a CDK construct for your own app (`pip install 'ratchet-agents[cdk]'`).

    from pathlib import Path

    import aws_cdk as cdk
    from ratchet.cdk import RatchetAgents, add_checks

    app = cdk.App()
    stack = cdk.Stack(app, "MyAgents")
    agents = RatchetAgents(stack, "Ratchet", project=Path(__file__).parent)
    add_checks(app)
    app.synth()

`RatchetAgents` builds what Ratchet's own stack is (tables, blob bucket, functions, the
agent-run state machine, the API and its approval, Slack and webhook routes, schedules,
secrets, permissions, the wake sweep) for the agents of a `[tool.ratchet]` project, with the
settings the `ratchet:*` context keys give as props; `RatchetStack` is a stack holding one and
nothing else; `add_checks` runs cdk-nag's AWS Solutions checks on every synth. The names are
pinned by tests/infra/test_cdk_face.py; every other module here is internal.
docs/cdk-construct.md is the guide.

Names load on first use, so that `ratchet.cdk.project` (the project file's checks) imports no
CDK: the CLI and the local runtime read a project without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratchet.cdk.nag import add_checks as add_checks
    from ratchet.cdk.stack import RatchetAgents as RatchetAgents
    from ratchet.cdk.stack import RatchetStack as RatchetStack

__all__ = ["RatchetAgents", "RatchetStack", "add_checks"]

_MODULE_OF = {
    "RatchetAgents": "ratchet.cdk.stack",
    "RatchetStack": "ratchet.cdk.stack",
    "add_checks": "ratchet.cdk.nag",
}

_MISSING_EXTRA = (
    "ratchet.cdk needs the AWS CDK, which the [cdk] extra brings: pip install 'ratchet-agents[cdk]'"
)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ratchet.cdk' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as error:
        if error.name not in ("aws_cdk", "constructs", "cdk_nag", "jsii"):
            raise
        raise ModuleNotFoundError(_MISSING_EXTRA, name=error.name) from error
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
