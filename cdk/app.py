"""The CDK app: `cdk synth` and `cdk deploy` run this module (see cdk.json).

Every synth runs cdk-nag's AWS Solutions checks through CDK's Validations API: a finding that
is not acknowledged, with a reason, next to the resource it concerns fails the synth.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from cdk.stack import ASL_PATH, RatchetStack

STACK_NAME = "Ratchet"
PROJECT_ENV = "RATCHET_PROJECT"
"""Where the user's project is (`make deploy RATCHET_PROJECT=examples/billing_agent`), when
no `-c ratchet:project=...` says otherwise."""


def build_app(
    context: Mapping[str, Any] | None = None,
    *,
    outdir: str | None = None,
    asl_path: Path = ASL_PATH,
) -> App:
    app = App(context=dict(context) if context is not None else None, outdir=outdir)
    RatchetStack(
        app,
        STACK_NAME,
        asl_path=asl_path,
        description="Ratchet: durable checkpoint/resume for long LLM agents",
    )
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


def main() -> None:
    # Context given to the App ranks below the CLI's `-c`, so an explicit option wins.
    project = os.environ.get(PROJECT_ENV, "").strip()
    build_app({"ratchet:project": project} if project else None).synth()


if __name__ == "__main__":
    main()
