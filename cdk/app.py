"""The repository's CDK app: `cdk synth` and `cdk deploy` run this module (see cdk.json).

One user of the construct among others (`ratchet.cdk`, docs/cdk-construct.md): a stack named
`Ratchet` holding one `RatchetAgents`, whose settings come from the `ratchet:*` context keys
(`-c ratchet:project=...`, or `RATCHET_PROJECT`). Every synth runs cdk-nag's AWS Solutions
checks through CDK's Validations API: a finding that is not acknowledged, with a reason, next
to the resource it concerns fails the synth.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App

from ratchet.cdk import RatchetStack, add_checks

STACK_NAME = "Ratchet"
PROJECT_ENV = "RATCHET_PROJECT"
"""Where the user's project is (`make deploy RATCHET_PROJECT=examples/billing_agent`), when
no `-c ratchet:project=...` says otherwise."""


def build_app(
    context: Mapping[str, Any] | None = None,
    *,
    outdir: str | None = None,
    asl_path: Path | None = None,
) -> App:
    app = App(context=dict(context) if context is not None else None, outdir=outdir)
    RatchetStack(
        app,
        STACK_NAME,
        asl_path=asl_path,
        description="Ratchet: durable checkpoint/resume for long LLM agents",
    )
    add_checks(app)
    return app


def main() -> None:
    # Context given to the App ranks below the CLI's `-c`, so an explicit option wins.
    project = os.environ.get(PROJECT_ENV, "").strip()
    build_app({"ratchet:project": project} if project else None).synth()


if __name__ == "__main__":
    main()
