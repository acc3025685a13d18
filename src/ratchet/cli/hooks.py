"""`ratchet hook RUN NAME`: the signed webhook URL that delivers the run's NAME event, with its
secret and a line that sends a correctly signed delivery (docs/webhooks.md)."""

from __future__ import annotations

import shlex
from typing import Annotated

import typer

from ratchet.cli.context import open_runtime, print_json, say, settings
from ratchet.cli.options import JsonOption, RunArgument
from ratchet.errors import InvalidInput

NameArgument = Annotated[
    str, typer.Argument(metavar="NAME", help="The event name the run waits for.")
]


def hook(run_id: RunArgument, name: NameArgument, as_json: JsonOption = False) -> None:
    """Print the webhook URL and secret that deliver the run's NAME event (ratchet serve takes
    the deliveries), and a curl line that sends a signed one."""
    from ratchet.runtime.hooks import local_hooks  # the run models (see ratchet.cli.context)
    from ratchet.store_urls import DYNAMODB_SCHEME

    if settings().store.startswith(DYNAMODB_SCHEME):
        raise InvalidInput(
            "ratchet hook needs a local sqlite:// store, not a dynamodb:// one: on AWS open "
            "a run's hook through the stack's runs API, POST /runs/RUN/hooks/NAME "
            "(IAM-signed; the answer holds the URL and secret)"
        )
    runtime = open_runtime(create=False)
    try:
        opened = local_hooks(runtime).open(run_id, name)
    finally:
        runtime.close()
    if as_json:
        print_json(
            {
                "run_id": opened.hook.run_id,
                "name": opened.hook.name,
                "hook_id": opened.hook.hook_id,
                "url": opened.url,
                "secret": opened.secret,
            }
        )
        return
    say(f"Webhook for run {run_id}, event {name!r} (ratchet serve takes its deliveries):")
    say(f"  URL           {opened.url}")
    say(f"  Secret        {opened.secret}")
    say("  Content type  application/json (on GitHub: Payload URL, Content type, Secret)")
    say("Send a signed delivery (GitHub's signature; edit the body):")
    say(f"  {send_line(opened.url, opened.secret)}")


def send_line(url: str, secret: str, body: str = '{"conclusion":"success"}') -> str:
    """A shell line that signs `body` as GitHub does (openssl) and posts it (curl), with a
    fresh delivery id: what docs/webhooks.md shows, for a copy and paste."""
    return (
        f"body={shlex.quote(body)}; "
        f"sig=$(printf '%s' \"$body\" | openssl dgst -sha256 -hmac {shlex.quote(secret)} "
        "| sed 's/^.*= //'); "
        f"curl -sS -X POST {shlex.quote(url)} -H 'Content-Type: application/json' "
        '-H "X-Hub-Signature-256: sha256=$sig" -H "X-GitHub-Delivery: $(openssl rand -hex 16)" '
        '--data-binary "$body"'
    )
