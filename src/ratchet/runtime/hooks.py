"""A runtime's webhooks: making a run's hook (its URL and secret), and what the hook route is
served with, locally and on AWS.

`hook_url(runtime, run_id, name)` is what whoever tells a person that a run waits for a
webhook calls (the worker's announcement, `ratchet hook`): it makes the hook if it is new and
returns its URL. The secret is shown only by `ratchet hook` (`Hooks.open`), to whoever can
read the store's key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from ratchet.agents import LOCAL, AgentRegistry, declared_events
from ratchet.errors import EventNotAwaited, RunEnded, RunNotFound
from ratchet.ports import CheckpointStore, HookBook, OpenedHook
from ratchet.state import EventWait, RunStatus, utcnow
from ratchet.waiting.desk import EventDesk, check_event_name
from ratchet.waiting.hooks import HookKeys, WebhooksNotTaken, open_hook
from ratchet.waiting.hooks import hook_url as url_of
from ratchet.web.hooks import HookServices, Throttle

if TYPE_CHECKING:
    from ratchet.runtime.aws import AwsRuntime
    from ratchet.runtime.local import LocalRuntime


@dataclass(frozen=True)
class Hooks:
    """A runtime's hooks: where they are kept, the key they derive from, where they are
    reached (the public URL: `RATCHET_PUBLIC_URL`, `ratchet serve`'s or the API stage's).
    The `HookOpener` a client opens hooks through (`Runtime.hooks`)."""

    book: HookBook
    keys: HookKeys
    store: CheckpointStore
    public_url: str
    events_of: Callable[[str], Sequence[str] | None] = declared_events

    def open(self, run_id: str, name: str) -> OpenedHook:
        """The hook of `name` on the run, made if it is new. Refused with nothing written
        (`InvalidInput` for a bad name, `RunNotFound`, `RunEnded`, `EventNotAwaited` for a name
        the agent does not declare, `WebhooksNotTaken` if the run waits for it now with a
        wait that takes no webhook). A run that does not wait yet may have its hook: an
        early delivery is kept for the wait."""
        check_event_name(name)
        run = self.store.load_head(run_id)
        if run is None:
            raise RunNotFound(run_id)
        if run.is_finished:
            raise RunEnded(f"run {run_id!r} is {run.status.value}: it takes no more events")
        declared = self.events_of(run.agent)
        if declared is not None and name not in declared:
            listed = ", ".join(repr(n) for n in declared) or "none"
            raise EventNotAwaited(
                f"agent {run.agent!r} waits for no event named {name!r} (it waits for: {listed})"
            )
        request = run.waiting.request if run.waiting is not None else None
        if (
            run.status is RunStatus.WAITING
            and isinstance(request, EventWait)
            and request.name == name
            and not request.webhook
        ):
            raise WebhooksNotTaken(
                f"run {run_id!r} waits for {name!r} with a wait that takes no webhook "
                "(wait_for_event(..., webhook=True) does)"
            )
        hook = open_hook(self.book, self.keys, run_id, name, at=utcnow())
        return OpenedHook(
            hook=hook,
            url=url_of(self.public_url, hook.hook_id),
            secret=self.keys.secret(hook.hook_id),
        )

    def url(self, run_id: str, name: str) -> str:
        return self.open(run_id, name).url

    def services(
        self, desk: EventDesk, *, logger: Any, throttle: Throttle | None = None
    ) -> HookServices:
        """What the hook route serves with: deliveries go to `desk`."""
        return HookServices(
            book=self.book, keys=self.keys, desk=desk, logger=logger, throttle=throttle
        )


def local_hooks(runtime: LocalRuntime, agents: AgentRegistry = LOCAL) -> Hooks:
    """The hooks of a local store; `agents` those whose declared events a hook's name must be
    one of (an agent it cannot load declares none)."""
    return Hooks(
        book=runtime.hook_book,
        keys=runtime.hook_keys,
        store=runtime.store,
        public_url=runtime.public_url,
        events_of=lambda agent: declared_events(agent, agents),
    )


def aws_hooks(runtime: AwsRuntime, *, key: SecretStr, agents: AgentRegistry) -> Hooks:
    """The hooks of a deployment: items of their own partitions in the checkpoints table,
    derived from the hook key (`RATCHET_HOOK_KEY_SECRET_ARN`, read by the caller), reached on
    the API (`RATCHET_PUBLIC_URL`); `agents` the deployment's, whose declared events a hook's
    name must be one of. What `POST /runs/{id}/hooks/{name}` opens (`AwsRuntime.hooks`)."""
    return Hooks(
        book=_dynamodb_book(runtime),
        keys=HookKeys(key.get_secret_value().encode("utf-8")),
        store=runtime.store,
        public_url=runtime.settings.required_for_approvals("public_url"),
        events_of=lambda agent: declared_events(agent, agents),
    )


def aws_hook_services(
    runtime: AwsRuntime, *, key: SecretStr, desk: EventDesk, logger: Any
) -> HookServices:
    """What the hooks function serves with: the hook items, the key, and `desk` (the runtime's
    event desk, whose nudge wakes the execution parked on the wait a delivery settles). No
    throttle of its own: API Gateway throttles the route."""
    return HookServices(
        book=_dynamodb_book(runtime),
        keys=HookKeys(key.get_secret_value().encode("utf-8")),
        desk=desk,
        logger=logger,
    )


def _dynamodb_book(runtime: AwsRuntime) -> HookBook:
    # Here, not at the top: the local CLI never loads botocore for its hooks.
    from ratchet.adapters.dynamodb.hooks import DynamoDbHookBook

    return DynamoDbHookBook(runtime.dynamodb, runtime.settings.checkpoints_table)


def hook_url(runtime: LocalRuntime, run_id: str, name: str) -> str:
    """The URL a sender delivers the run's `name` event to (made if new); the refusals of
    `Hooks.open`. For a worker announcing a run parked on `wait_for_event(name,
    webhook=True)`; `ratchet hook RUN NAME` prints it with its secret."""
    return local_hooks(runtime).url(run_id, name)
