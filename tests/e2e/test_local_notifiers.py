"""Approvals reach people off AWS, in real processes: a run a `ratchet worker` parks emails each
recipient their own link through a real SMTP server (aiosmtpd), on SQLite and on Postgres, and
the link decides on a `ratchet serve`; Slack (tests/fake_slack.py) gets the request with its
buttons, and a press on serve decides it and replaces the message. A channel that fails (a
server that refuses, one that is down, Slack answering ok:false) is said in one line by the
worker, and leaves the request open, the outbox written and the link printed, while every
other channel gets its message. Bad settings are refused in one line before any run is worked.
No output, log, outbox file or store file holds the SMTP password or the Slack token."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from ratchet.approvals.messages import SLACK_APPROVE, SLACK_REJECT
from ratchet.runtime import runtime_for
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus
from ratchet.waits import Approval, ApprovalStatus
from tests.fake_slack import FakeSlack, button_press, signed_interaction
from tests.postgres_support import Cluster
from tests.processes import Cli, PostgresCli, Served, serving
from tests.smtp_support import PASSWORD, QUIET, USER, down_port, mail_server

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings(QUIET)]

PATIENCE = 60.0
SENDER = "Ratchet <approvals@example.com>"
DANA, LEE = "dana@example.com", "lee@example.com"
SIGNING_SECRET = "slack-signing-secret-for-the-test"
LINK = re.compile(r"https?://\S+/approvals/\S+")
FAILED = re.compile(r"^m1: the approval request was not sent through (\w+): (\w+): .+$", re.M)


@pytest.fixture(params=["sqlite", "postgres"])
def cli(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cli]:
    # Every process works in the test's folder: a Postgres store's processes keep their
    # host's files (the outbox, serve's address) in its .ratchet, as a SQLite store's are.
    monkeypatch.chdir(tmp_path)
    if request.param == "sqlite":
        yield Cli(tmp_path)
        return
    postgres: Cluster = request.getfixturevalue("postgres")
    name = postgres.fresh_database()
    yield PostgresCli(tmp_path, url=postgres.url(name))
    postgres.drop_database(name)


@pytest.fixture
def sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.chdir(tmp_path)
    return Cli(tmp_path)


def _env(cli: Cli, **extra: str) -> dict[str, str]:
    env = cli.env(PYTHONUNBUFFERED="1", **extra)
    for name in [n for n in env if n.startswith(("RATCHET_SMTP", "RATCHET_SLACK", "RATCHET_N"))]:
        if name not in extra:
            del env[name]
    if "RATCHET_PUBLIC_URL" not in extra:
        env.pop("RATCHET_PUBLIC_URL", None)
    return env


def _smtp(url: str) -> dict[str, str]:
    return {"RATCHET_SMTP_URL": url, "RATCHET_EMAIL_SENDER": SENDER}


def _slack(slack: FakeSlack, *, token: str | None = None) -> dict[str, str]:
    return {
        "RATCHET_SLACK_BOT_TOKEN": token or slack.bot_token,
        "RATCHET_SLACK_API_URL": slack.api_url,
        "SSL_CERT_FILE": str(slack.trust_file),
    }


def _ratchet(cli: Cli, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli.argv(*args), env=env, capture_output=True, text=True, timeout=PATIENCE * 2, check=False
    )


def _worker(cli: Cli, **env: str) -> subprocess.CompletedProcess[str]:
    """A `ratchet worker --until-idle` with `env`: it parks the run and exits."""
    worked = _ratchet(cli, "worker", "--until-idle", env=_env(cli, **env))
    assert worked.returncode == 0, (worked.stdout, worked.stderr)
    return worked


def _start(cli: Cli, run_id: str, *notify: str) -> None:
    started = _ratchet(
        cli, "start", "--scenario", "migration", "--param", "batches=2", "--run-id", run_id,
        *notify, env=_env(cli),
    )  # fmt: skip
    assert started.returncode == 0, started.stderr


def _serve(cli: Cli, **env: str) -> AbstractContextManager[Served]:
    return serving(
        cli.argv("serve", "--port", "0", "--no-worker"),
        log=cli.root / f"serve-{time.monotonic_ns()}.log",
        env=_env(cli, **env),
        cwd=cli.root,
    )


def _approvals(cli: Cli, run_id: str) -> list[Approval]:
    runtime = runtime_for(LocalSettings(store=cli.store), create=False)
    try:
        assert isinstance(runtime, LocalRuntime)
        return list(runtime.approvals.of_run(run_id))
    finally:
        runtime.close()


def _outbox(cli: Cli) -> dict[str, dict[str, Any]]:
    """The outbox's messages, by whom they are to."""
    files = list(cli.root.rglob("*.outbox/*.json"))
    return {m["to"]: m for m in (json.loads(p.read_text(encoding="utf-8")) for p in files)}


def _post(url: str, form: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    asked = urllib.request.Request(
        url,
        data=form.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(asked, timeout=PATIENCE) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def _holding(root: Path, secret: str) -> list[str]:
    """Every file under `root` (outputs, logs, the outbox, the store) whose bytes hold `secret`."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and secret.encode() in p.read_bytes()
    )


def _email_link(text: str) -> str:
    found = LINK.findall(text)
    assert len(set(found)) == 1, found
    return str(found[0])


def test_a_parked_run_emails_each_recipient_their_own_link_which_decides_on_serve(
    cli: Cli,
) -> None:
    with mail_server() as mail, _serve(cli) as served:
        # Given a run that names two people, parked by a real worker with an SMTP server
        _start(cli, "m1", "--notify", DANA, "--notify", LEE)
        worked = _worker(cli, **_smtp(mail.url()))
        # (the worker prints the operator's link on this machine's store alone: on one that
        # many hosts share, its output is a service's log, and it says how to get one)
        said = (
            "m1 waits for a person: the request went to whom the run notifies"
            if isinstance(cli, PostgresCli)
            else "m1 waits for a person; approve or reject at: "
        )
        assert said in worked.stdout, worked.stdout

        # Then each gets one email, with a link of their own, the one the outbox keeps for them
        emails = mail.wait_for(2)
        assert sorted(str(e["To"]) for e in emails) == [DANA, LEE]
        links = {}
        for email in emails:
            text = email.get_body(("plain",))
            assert text is not None
            links[str(email["To"])] = _email_link(text.get_content())
        outbox = _outbox(cli)
        assert {to: outbox[to]["link"] for to in (DANA, LEE)} == links
        assert links[DANA] != links[LEE]
        assert all(link.startswith(f"{served.base}/approvals/") for link in links.values())
        assert mail.logins == [(USER, PASSWORD)]
        assert not FAILED.search(worked.stderr), worked.stderr

        # When Lee approves on the page their link opens
        status, page = _post(links[LEE], "decision=approve&comment=from+the+email")
        assert status == 200, page

    # Then the request is decided in Lee's name, and the next worker finishes the run
    (approval,) = _approvals(cli, "m1")
    assert (approval.status, approval.decided_by) == (ApprovalStatus.APPROVED, LEE)
    _worker(cli)
    assert cli.head("m1").status is RunStatus.DONE
    assert _holding(cli.root, PASSWORD) == []


def test_slack_gets_the_request_with_its_buttons_and_a_press_decides_and_replaces_it(
    sqlite: Cli, tmp_path: Path
) -> None:
    cli = sqlite
    with FakeSlack(tmp_path) as slack:
        # Given a run naming a channel, and one naming nobody, where the defaults ask a
        # channel and an address
        _start(cli, "m1", "--notify-slack", "#ops")
        _start(cli, "m2")
        with mail_server() as mail:
            defaults = {
                "RATCHET_NOTIFY_SLACK_CHANNEL": "#approvals",
                "RATCHET_NOTIFY_EMAILS": DANA,
            }
            _worker(cli, **_slack(slack), **_smtp(mail.url()), **defaults)
            (email,) = mail.wait_for(1)
            assert str(email["To"]) == DANA

        # Then each channel gets its message, with the token, and the buttons
        posted = {m["channel"]: m for m in slack.posted_messages()}
        assert sorted(posted) == ["approvals", "ops"]
        assert {r.authorization for r in slack.received()} == {f"Bearer {slack.bot_token}"}
        for message in posted.values():
            actions = [b for b in message["blocks"] if b["type"] == "actions"]
            buttons = {e["action_id"] for a in actions for e in a["elements"]}
            assert {SLACK_APPROVE, SLACK_REJECT} <= buttons, message

        # When someone presses Approve in #ops, on a serve that takes Slack's presses
        serve_env = {
            "RATCHET_SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "SSL_CERT_FILE": str(slack.trust_file),
        }
        with _serve(cli, **serve_env) as served:
            press = button_press(
                posted["ops"],
                SLACK_APPROVE,
                user_id="U0001",
                username="dana",
                response_url=slack.response_url("m1"),
            )
            body, headers = signed_interaction(press, SIGNING_SECRET)
            status, said = _post(f"{served.base}/slack/interactions", body, headers)
            assert status == 200, said

            # Then the run's request is approved, and its message replaced
            deadline = time.monotonic() + PATIENCE
            while not slack.responses():
                assert time.monotonic() < deadline, "the message was never replaced"
                time.sleep(0.05)
    (approval,) = _approvals(cli, "m1")
    assert approval.status is ApprovalStatus.APPROVED
    (replaced,) = slack.responses()
    assert replaced["replace_original"] is True
    assert _approvals(cli, "m2")[0].status is ApprovalStatus.PENDING
    assert _holding(tmp_path, slack.bot_token) == []
    assert _holding(tmp_path, PASSWORD) == []


@pytest.mark.parametrize("failing", ["smtp refuses", "smtp down", "slack refuses"])
def test_a_channel_that_fails_is_said_in_one_line_and_the_request_stays_open(
    sqlite: Cli, tmp_path: Path, failing: str
) -> None:
    cli = sqlite
    _start(cli, "m1", "--notify", DANA, "--notify-slack", "#ops")
    with FakeSlack(tmp_path) as slack, mail_server(password="not-the-one-given") as mail:
        smtp = {
            "smtp refuses": mail.url(password=PASSWORD),
            "smtp down": f"smtp://{USER}:{PASSWORD}@127.0.0.1:{down_port()}",
            "slack refuses": mail.url(password="not-the-one-given"),
        }[failing]
        token = "xoxb-revoked-token" if failing == "slack refuses" else None

        # When a worker parks the run with one channel failing
        started = time.monotonic()
        worked = _worker(cli, **_smtp(smtp), **_slack(slack, token=token))
        took = time.monotonic() - started

        # Then it says so in one line, naming the channel, and prints the operator's link
        said = FAILED.findall(worked.stdout + worked.stderr)
        line = FAILED.search(worked.stderr)
        print(f"{failing}: {line[0] if line else None!r} (the worker took {took:.1f} s)")
        channel = "SlackNotifier" if failing == "slack refuses" else "SmtpNotifier"
        error = "SlackError" if failing == "slack refuses" else "SmtpError"
        assert said == [(channel, error)], (worked.stdout, worked.stderr)
        # (Off a terminal, the log's JSON lines go to stderr too: one record, as on AWS.)
        printed = (worked.stdout + worked.stderr).splitlines()
        logged = [json.loads(text) for text in printed if text.startswith("{")]
        assert [t for t in printed if channel in t and not t.startswith("{")] == [
            line[0] if line else None
        ]
        failures = [r for r in logged if r["message"] == "approval notification failed"]
        assert [(r["run_id"], r["error"].split(":")[0]) for r in failures] == [("m1", channel)]
        assert "m1 waits for a person; approve or reject at: " in worked.stdout

        # And every other channel got its message, and the outbox has them all
        if failing == "slack refuses":
            (email,) = mail.wait_for(1)
            assert str(email["To"]) == DANA
        else:
            assert [m["channel"] for m in slack.posted_messages()] == ["ops"]
            assert mail.messages == []
        assert {DANA, "#ops"} <= set(_outbox(cli))

    # And the request is open, for any channel to decide
    (approval,) = _approvals(cli, "m1")
    assert approval.status is ApprovalStatus.PENDING
    assert cli.head("m1").status is RunStatus.WAITING
    assert _holding(tmp_path, PASSWORD) == []
    assert _holding(tmp_path, "xoxb-revoked-token") == []


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        pytest.param(
            _smtp(f"smtp://{USER}:{PASSWORD}@mail.example.com?starttls=false"),
            "RATCHET_SMTP_URL is not valid: a password to mail.example.com would cross the "
            "network in clear: use smtps:// or STARTTLS (drop starttls=false)",
            id="a password in clear",
        ),
        pytest.param(
            {"RATCHET_SMTP_URL": f"smtp://{USER}:{PASSWORD}@mail.example.com"},
            "RATCHET_EMAIL_SENDER is not valid: required with RATCHET_SMTP_URL (who the approval "
            "emails are from)",
            id="no sender",
        ),
        pytest.param(
            _smtp(f"http://{USER}:{PASSWORD}@mail.example.com"),
            "RATCHET_SMTP_URL is not valid: use smtp://user:password@host:587 (STARTTLS) or "
            "smtps://...:465",
            id="not smtp",
        ),
        pytest.param(
            _smtp(f"smtp://{USER}:{PASSWORD}@mail.example.com:port"),
            "RATCHET_SMTP_URL is not valid: not a URL (smtp://user:password@host:587 or "
            "smtps://...)",
            id="a bad port",
        ),
        pytest.param(
            {**_smtp("smtp://localhost:1025"), "RATCHET_EMAIL_SENDER": "approvals"},
            "RATCHET_EMAIL_SENDER is not valid: not an email address (ratchet@example.com, or "
            "Ratchet <ratchet@...>)",
            id="a sender not an address",
        ),
        pytest.param(
            {"RATCHET_NOTIFY_SLACK_CHANNEL": "#two words"},
            "RATCHET_NOTIFY_SLACK_CHANNEL is not valid: not a Slack channel (an id such as "
            "C0123ABCD, or #name)",
            id="a bad channel",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_line_before_any_run_is_worked(
    sqlite: Cli, tmp_path: Path, settings: dict[str, str], said: str
) -> None:
    cli = sqlite
    _start(cli, "m1", "--notify", DANA)
    before = cli.head("m1").version

    refused = _ratchet(cli, "worker", "--until-idle", env=_env(cli, **settings))

    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.splitlines() == [f"ratchet: {said}"]
    assert refused.stdout == ""
    assert cli.head("m1").version == before
    assert PASSWORD not in refused.stderr
    assert _holding(tmp_path, PASSWORD) == []
