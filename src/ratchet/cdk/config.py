"""What a deployer may choose: a prop of `RatchetAgents` (`rollover_after=500`), else CDK
context (`cdk deploy -c ratchet:rolloverAfter=500`), else the default.

Every setting is optional: the stack synthesizes with none of them. A value that the functions
would refuse at cold start (a malformed ARN, an address, a list over its bound) fails the
synth instead, naming its prop or context key. `project` (`ratchet:project`) points at a user's
project (`project.py`), whose agents join those of `agents`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

from constructs import Construct
from pydantic import StringConstraints, TypeAdapter, ValidationError

from ratchet.cdk.project import AGENT_NAME_PATTERN as AGENT_NAME_PATTERN
from ratchet.cdk.project import BUILT_IN_AGENTS as BUILT_IN_AGENTS
from ratchet.cdk.project import IMPORT_PATH_PATTERN as IMPORT_PATH_PATTERN
from ratchet.cdk.project import Project, ProjectError, check_agent

_SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[^\s]+$")
_SES_IDENTITY_ARN = re.compile(r"^arn:aws[a-z-]*:ses:[a-z0-9-]+:\d{12}:identity/[^\s,*]+$")
EMAIL_PATTERN = r"^[^@\s<>\"',;]{1,64}@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$"
"""`ratchet.state.EMAIL_PATTERN` (tests/infra keeps them equal): what a run's `notify` accepts."""
SLACK_CHANNEL_PATTERN = r"^#?[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$"
"""`ratchet.state.SLACK_CHANNEL_PATTERN`."""
MAX_NOTIFY_EMAILS = 10
"""`ratchet.state.MAX_NOTIFY_EMAILS`: the defaults become a `NotifyTargets`, which holds 10."""
_PUBLIC_URL = re.compile(r"^https://[^\s?#]+$")

INTEGER_BOUNDS = {
    "rollover_after": (1, 3000),
    "approval_timeout_seconds": (1, 365 * 24 * 3600),
    "checkpoint_retention_days": (1, 3650),
    "queue_retry_seconds": (1, 300),
    "requests_per_minute": (1, 1_000_000),
    "max_steps_per_invocation": (1, 1000),
}
"""The bounds `ratchet.runtime.aws_settings.AwsSettings` puts on these settings (tests compare)."""


@dataclass(frozen=True)
class DeployConfig:
    rollover_after: int = 1000
    """Loop iterations before an execution hands the run to its successor (continue-as-new)."""
    approval_timeout_seconds: int = 7 * 24 * 3600
    checkpoint_retention_days: int = 30
    anthropic_secret_arn: str | None = None
    """A Secrets Manager secret whose value is an Anthropic API key; none: no Claude runs."""
    public_url: str | None = None
    """Where approval links point (a custom domain mapped to the API's stage); none: the
    API's own execute-api URL."""
    event_bus_name: str = "default"
    """The EventBridge bus each change of a run's status is put on (its name, or its ARN)."""
    email_sender: str | None = None
    """A verified SES identity's address that approval emails come from; none: no email."""
    ses_identity_arn: tuple[str, ...] = ()
    """The SES identities the notify function may send as; none: those of `email_sender`
    (its address and its domain)."""
    notify_emails: tuple[str, ...] = ()
    """Who is asked when a run names nobody."""
    notify_slack_channel: str | None = None
    slack_bot_token_secret_arn: str | None = None
    """A secret holding the Slack app's bot token (`xoxb-...`), read by notify only."""
    slack_signing_secret_arn: str | None = None
    """A secret holding the Slack app's signing secret, read by the approvals function only."""
    agents: Mapping[str, str] = field(default_factory=dict)
    """Agents the API may start by name: `{"billing": "my_pkg.agents:billing"}`, from
    `ratchet:agents` and the project's `agents` together."""
    bedrock_models: tuple[str, ...] = ()
    """Bedrock model ids (or cross-region inference profile ids such as `us.anthropic...`)
    that runs may name as `bedrock:<id>`: the step function may invoke these, and only
    these; none: no `bedrock:InvokeModel` grant at all."""
    prices: str | None = None
    """Prices for cost estimates beyond the built-in table, as `RATCHET_PRICES` takes them:
    a JSON object of model id pattern -> `{"input", "output"[, "cache_write", "cache_read"]}`
    in US dollars per million tokens (`src/ratchet/pricing.py`). The API's estimates use
    them; none: the built-in table only."""
    queue_retry_seconds: int = 10
    """A step queued for its agent's slot is tried again after 1 to this many seconds."""
    max_steps_per_invocation: int = 100
    """The most steps one invocation of the step function takes, each committed before the
    next (fewer when the time left would not hold another of the agent's steps): 1 is one
    state-machine loop iteration per step (docs/deploy.md, "What 1,000 steps cost")."""
    requests_per_minute: int | None = None
    """Model calls a minute shared by every run of the deployment (`ratchet:requestsPerMinute`);
    none: no limit. The step function counts them (docs/limits.md)."""
    max_concurrent: str | None = None
    """Bounds on concurrent runs, over each agent's own `max_concurrent`, by a name this
    deployment registers the agent under (`ratchet:maxConcurrent`, e.g. `{"support": 5}`), as
    `RATCHET_MAX_CONCURRENT` takes them: the step function reads them (docs/limits.md)."""
    kms_key_arn: str | None = None
    """A customer-managed KMS key (its ARN, in the stack's region) that every store of the stack
    encrypts with, or `create` for a key the stack makes; none: the AWS managed and AWS owned
    keys (docs/security.md)."""
    payload_encryption: bool = False
    """Every function seals what runs' records and blobs say of the world before it stores
    them, with data keys of the deployment's own key (`RATCHET_PAYLOAD_KEY=kms:<its ARN>`):
    needs `kms_key_arn` (docs/security.md)."""
    project: Project | None = None
    """The user's project (`ratchet:project`, a path relative to the working directory): its
    code and requirements go into the bundle, its agents join `agents`."""

    @classmethod
    def from_context(cls, scope: Construct, props: Mapping[str, Any] | None = None) -> DeployConfig:
        """The settings of `props` (a setting's name -> its value; None: not given), else of
        the `ratchet:*` context keys, else the defaults; each checked as the functions would
        check it at cold start. An unknown prop is a `TypeError` naming it."""
        given = {name: value for name, value in (props or {}).items() if value is not None}
        unknown = sorted(set(given) - set(_PARSERS))
        if unknown:
            raise TypeError(
                f"RatchetAgents has no prop {unknown[0]!r}; its props are "
                f"{', '.join(sorted(_PARSERS))} (docs/cdk-construct.md)"
            )
        keys = _Keys(frozenset(given))
        values: dict[str, Any] = {}
        for item in fields(cls):
            raw = given.get(item.name)
            if raw is None:
                raw = scope.node.try_get_context(context_key(item.name))
                if raw is None or raw == "":
                    continue
            values[item.name] = _PARSERS[item.name](keys.label(item.name), raw)
        project = values.get("project")
        if project is not None:
            values["agents"] = _merged_agents(values.get("agents", {}), project, keys)
            _check_scheduled_agents(values["agents"], project)
        if "max_concurrent" in values:
            _check_bounded_agents(values["max_concurrent"], values.get("agents", {}), keys)
        config = cls(**values)
        config._check_combinations(keys)
        return config

    @property
    def agents_json(self) -> str | None:
        """`RATCHET_AGENTS`: the registered agents as one compact JSON object."""
        if not self.agents:
            return None
        return json.dumps(dict(sorted(self.agents.items())), separators=(",", ":"))

    @property
    def slack_enabled(self) -> bool:
        return self.slack_bot_token_secret_arn is not None

    def _check_combinations(self, keys: _Keys) -> None:
        # Half a configuration deploys cleanly and then fails a person: buttons nobody can
        # press, defaults nobody sends to.
        if (self.slack_bot_token_secret_arn is None) != (self.slack_signing_secret_arn is None):
            bot, signing = "slack_bot_token_secret_arn", "slack_signing_secret_arn"
            given = bot if self.slack_bot_token_secret_arn is not None else signing
            raise ValueError(
                f"{keys.label(bot, given)} and {keys.name(signing, given)} go together: the "
                "bot token posts the buttons, the signing secret verifies a press"
            )
        if self.payload_encryption and not self.kms_key_arn:
            # The functions seal with data keys of the deployment's own key, the one the
            # stack grants them: never a key the stack does not know.
            raise ValueError(
                keys.needs("payload_encryption", "kms_key_arn")
                + f" (a key's ARN, or {CREATE_KMS_KEY!r})"
            )
        if self.ses_identity_arn and not self.email_sender:
            raise ValueError(keys.needs("ses_identity_arn", "email_sender"))
        if self.notify_emails and not self.email_sender:
            raise ValueError(keys.needs("notify_emails", "email_sender") + " to send from")
        if self.notify_slack_channel and not self.slack_enabled:
            raise ValueError(
                keys.needs("notify_slack_channel", "slack_bot_token_secret_arn")
                + f" and {keys.name('slack_signing_secret_arn', 'notify_slack_channel')}"
            )


def context_key(name: str) -> str:
    """The context key of a setting: `rollover_after` -> `ratchet:rolloverAfter`."""
    return "ratchet:" + _camel(name)


@dataclass(frozen=True)
class _Keys:
    """How a refusal names a setting: as the prop it was given as (`RatchetAgents
    rollover_after`), or else as its context key (`context ratchet:rolloverAfter`), so that
    the message points at what the deployer wrote."""

    props: frozenset[str]

    def name(self, name: str, like: str | None = None) -> str:
        """The setting's name alone, spelt as `like` (or itself) was given."""
        return name if (like or name) in self.props else context_key(name)

    def label(self, name: str, like: str | None = None) -> str:
        """The name with where it comes from."""
        if (like or name) in self.props:
            return f"RatchetAgents {name}"
        return f"context {context_key(name)}"

    def needs(self, name: str, needed: str) -> str:
        return f"{self.label(name)} needs {self.name(needed, name)}"


def _integer(name: str) -> Callable[[str, Any], int]:
    low, high = INTEGER_BOUNDS[name]

    def parse(key: str, raw: Any) -> int:
        try:
            number = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be an integer: {raw!r}") from None
        if not low <= number <= high:
            raise ValueError(f"{key} must be between {low} and {high}: {raw!r}")
        return number

    return parse


def _matching(pattern: re.Pattern[str], what: str) -> Callable[[str, Any], str]:
    def parse(key: str, raw: Any) -> str:
        if not isinstance(raw, str) or not pattern.fullmatch(raw.strip()):
            raise ValueError(f"{key} must be {what}: {raw!r}")
        return raw.strip()

    return parse


def _listed(raw: Any) -> list[Any]:
    """A list from the CLI (`a,b`) or from cdk.json (`["a", "b"]`)."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        return [raw]
    return [i.strip() if isinstance(i, str) else i for i in items if i != ""]


def _identity_arns(key: str, raw: Any) -> tuple[str, ...]:
    arns = _listed(raw)
    for arn in arns:
        if not isinstance(arn, str) or not _SES_IDENTITY_ARN.fullmatch(arn):
            raise ValueError(f"{key} must be SES identity ARNs: {arn!r}")
    return tuple(dict.fromkeys(arns))


def _emails(key: str, raw: Any) -> tuple[str, ...]:
    emails = _listed(raw)
    for email in emails:
        if not isinstance(email, str) or not re.fullmatch(EMAIL_PATTERN, email):
            raise ValueError(f"{key} must be email addresses: {email!r}")
    unique = tuple(dict.fromkeys(emails))
    if len(unique) > MAX_NOTIFY_EMAILS:
        raise ValueError(f"{key} names {len(unique)} addresses; at most {MAX_NOTIFY_EMAILS}")
    return unique


BEDROCK_MODEL_ID = r"^[a-z][a-z0-9-]*\.[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"
"""A Bedrock model id (`anthropic.claude-...-v1:0`) or inference profile id (`us.anthropic...`)."""
INFERENCE_PROFILE_PREFIXES = ("us", "us-gov", "eu", "apac", "jp", "au", "ca", "global")
"""The geography that starts a cross-region inference profile's id."""


def _bedrock_models(key: str, raw: Any) -> tuple[str, ...]:
    models = _listed(raw)
    for model in models:
        if model == "*":
            raise ValueError(
                f"{key} must name the model ids to grant, not '*': the step function "
                "may invoke exactly the models a deployer chose"
            )
        if not isinstance(model, str) or not re.fullmatch(BEDROCK_MODEL_ID, model):
            raise ValueError(f"{key} must be Bedrock model ids: {model!r}")
    return tuple(dict.fromkeys(models))


def profiled_model(model_id: str) -> str | None:
    """The foundation model id if `model_id` is a cross-region inference profile (its
    geography, then the model's id), else None."""
    geography, _, rest = model_id.partition(".")
    return rest if geography in INFERENCE_PROFILE_PREFIXES and "." in rest else None


def _json_object(key: str, raw: Any, like: str) -> dict[Any, Any]:
    """A non-empty object from the CLI (JSON text) or from cdk.json (an object)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise ValueError(f"{key} must be a JSON object: {raw!r}") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{key} must be an object like {like}")
    return raw


def _agents(key: str, raw: Any) -> dict[str, str]:
    raw = _json_object(key, raw, '{"name": "module:attr"}')
    for name, target in raw.items():
        problem = check_agent(name, target) if isinstance(name, str) else f"{name!r} is no name"
        if problem:
            raise ValueError(f"{key}: {problem}")
    return dict(raw)


PRICE_FIELDS = {"input": True, "output": True, "cache_write": False, "cache_read": False}
"""`ratchet.pricing.Prices`'s fields, and whether each is required (tests/infra compares)."""


def _prices(key: str, raw: Any) -> str:
    """The price table as the API reads it (`RATCHET_PRICES`), checked as it checks it."""
    raw = _json_object(key, raw, '{"claude-opus-9*": {"input": 20, "output": 100}}')
    for pattern, prices in raw.items():
        if not _valid_prices(prices):
            raise ValueError(
                f"{key}: bad prices for {pattern!r}: give input and output (and "
                "optionally cache_write, cache_read) as numbers of US dollars per million tokens"
            )
    return json.dumps(raw, separators=(",", ":"))


MAX_CONCURRENT_RUNS = 10_000
"""`ratchet.tools.MAX_CONCURRENT_RUNS` (tests/infra compares)."""


def _max_concurrent(key: str, raw: Any) -> str:
    """The bounds as the step function reads them (`RATCHET_MAX_CONCURRENT`)."""
    raw = _json_object(key, raw, '{"support": 5}')
    for name, bound in raw.items():
        if (
            isinstance(bound, bool)
            or not isinstance(bound, int)
            or not 1 <= bound <= MAX_CONCURRENT_RUNS
        ):
            raise ValueError(
                f"{key}: the bound of {name!r} must be a whole number of runs from 1 "
                f"to {MAX_CONCURRENT_RUNS:,}, not {bound!r}"
            )
    return json.dumps(raw, separators=(",", ":"))


def _valid_prices(prices: Any) -> bool:
    if not isinstance(prices, dict) or not set(prices) <= set(PRICE_FIELDS):
        return False
    if any(required and name not in prices for name, required in PRICE_FIELDS.items()):
        return False
    return all(
        isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
        for value in prices.values()
    )


def _project(key: str, raw: Any) -> Project:
    if not isinstance(raw, str | Path):
        raise ValueError(f"{key} must be a path to a folder or a .toml file: {raw!r}")
    try:
        return Project.load(Path(raw.strip()) if isinstance(raw, str) else raw)
    except ProjectError as error:
        raise ValueError(f"{key}={raw}: {error}") from None


def _merged_agents(
    from_context: Mapping[str, str], project: Project, keys: _Keys
) -> dict[str, str]:
    twice = sorted(set(from_context) & set(project.agents))
    if twice:
        raise ValueError(
            f"agent {twice[0]!r} is named both in {keys.label('agents')} and in "
            f"{project.config_file} ({project.key_prefix}agents): name each agent once"
        )
    return {**from_context, **project.agents}


def _check_scheduled_agents(agents: Mapping[str, str], project: Project) -> None:
    """A fire starts its run as `POST /runs` does, which starts only what the deployment
    registers: a name of `agents`, its `module:attr`, or a built-in scenario."""
    startable = {*agents, *agents.values(), *BUILT_IN_AGENTS}
    for index, spec in enumerate(project.schedules):
        if spec.agent not in startable:
            known = ", ".join(sorted({*agents, *BUILT_IN_AGENTS}))
            raise project.error(
                f"schedules.{index}.agent",
                f"{spec.agent!r} is not an agent this deployment registers ({known})",
            )


def _check_bounded_agents(bounds_json: str, agents: Mapping[str, str], keys: _Keys) -> None:
    """Each bound names an agent as `POST /runs` starts it (a name of `agents`, its
    `module:attr`, or a built-in scenario), which is how the step function reads it: a key
    naming none would bound nothing, and two naming one agent would leave its bound to chance.
    The step function holds its runs under the agent's name, whichever of these they used."""
    key = keys.label("max_concurrent")
    seen: dict[str, str] = {}
    for name in json.loads(bounds_json):
        target = agents.get(name, name)
        if target not in {*agents.values(), *BUILT_IN_AGENTS}:
            known = ", ".join(sorted({*agents, *BUILT_IN_AGENTS}))
            raise ValueError(f"{key}: {name!r} names no agent this deployment registers ({known})")
        if target in seen:
            raise ValueError(
                f"{key}: {seen[target]!r} and {name!r} name one agent: give it one bound"
            )
        seen[target] = name


CREATE_KMS_KEY = "create"
"""`ratchet:kmsKeyArn=create`: the stack makes the key (rotated yearly, retained with the data)."""
KMS_KEY_ARN_PATTERN = (
    r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/"
    r"(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|mrk-[0-9a-f]{32})$"
)
_KMS_KEY_ARN: TypeAdapter[str] = TypeAdapter(
    Annotated[str, StringConstraints(strip_whitespace=True, pattern=KMS_KEY_ARN_PATTERN)]
)


def _kms_key(key: str, raw: Any) -> str:
    """A key's own ARN, not an alias's: IAM grants and key policies name the key itself, and
    an alias could be pointed at another key after the deploy."""
    if isinstance(raw, str) and raw.strip() == CREATE_KMS_KEY:
        return CREATE_KMS_KEY
    try:
        return _KMS_KEY_ARN.validate_python(raw, strict=True)
    except ValidationError:
        raise ValueError(
            f"{key} must be a KMS key's ARN (arn:aws:kms:<region>:<account>:key/<key id>, "
            f"not an alias) or {CREATE_KMS_KEY!r}: {raw!r}"
        ) from None


_FLAGS = {"true": True, "false": False}


def _flag(key: str, raw: Any) -> bool:
    """`true` or `false`: a boolean from cdk.json, or its text from `cdk deploy -c`."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _FLAGS:
        return _FLAGS[raw.strip().lower()]
    raise ValueError(f"{key} must be true or false: {raw!r}")


_SECRET = _matching(_SECRET_ARN, "a Secrets Manager secret ARN")
_EVENT_BUS = re.compile(
    r"^(?:[A-Za-z0-9._\-]{1,256}|arn:aws[a-z-]*:events:[a-z0-9-]+:\d{12}:event-bus/[A-Za-z0-9._\-/]{1,256})$"
)

_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "rollover_after": _integer("rollover_after"),
    "approval_timeout_seconds": _integer("approval_timeout_seconds"),
    "checkpoint_retention_days": _integer("checkpoint_retention_days"),
    "queue_retry_seconds": _integer("queue_retry_seconds"),
    "max_steps_per_invocation": _integer("max_steps_per_invocation"),
    "requests_per_minute": _integer("requests_per_minute"),
    "anthropic_secret_arn": _SECRET,
    "public_url": lambda key, raw: _matching(_PUBLIC_URL, "an https URL")(key, raw).rstrip("/"),
    "email_sender": _matching(re.compile(EMAIL_PATTERN), "an email address"),
    "event_bus_name": _matching(_EVENT_BUS, "an EventBridge bus name or ARN"),
    "ses_identity_arn": _identity_arns,
    "notify_emails": _emails,
    "notify_slack_channel": _matching(re.compile(SLACK_CHANNEL_PATTERN), "a Slack channel"),
    "slack_bot_token_secret_arn": _SECRET,
    "slack_signing_secret_arn": _SECRET,
    "agents": _agents,
    "bedrock_models": _bedrock_models,
    "prices": _prices,
    "max_concurrent": _max_concurrent,
    "kms_key_arn": _kms_key,
    "payload_encryption": _flag,
    "project": _project,
}


PROPS = tuple(sorted(_PARSERS))
"""The props of `RatchetAgents`: one per setting, named as `DeployConfig`'s fields."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
