"""An agent's own webhooks (`Agent.webhooks`, issue 35) are checked where the agent is defined,
by the deployment's rule (`RATCHET_WEBHOOKS`): http or https with a host, no user or password,
no link-local address; and the sender sends a run's changes to them beside the deployment's."""

from __future__ import annotations

import pytest

from ratchet.runtime.local import LocalSettings
from ratchet.runtime.webhooks import WebhookSender
from ratchet.tools import Agent


@pytest.mark.parametrize(
    ("urls", "why"),
    [
        (["ftp://example.com/hook"], "only http:// or https:// URLs with a host"),
        (["file:///etc/passwd"], "only http:// or https:// URLs with a host"),
        (["http://169.254.169.254/latest/meta-data/"], "a link-local address is never sent to"),
        (["http://[fe80::1]/hook"], "a link-local address is never sent to"),
        (["https://user:pass@example.com/hook"], "no user or password in it"),
        ("https://example.com/hook", "webhooks must be a list of URLs, not one"),
        ([7], "a webhook is a URL, not 7"),
    ],
)
def test_an_agent_with_a_webhook_that_may_not_be_sent_to_is_refused(urls, why):
    with pytest.raises(ValueError, match=r"^agent 'hooked': ") as refused:
        Agent(name="hooked", tools=[], webhooks=urls)

    assert why in str(refused.value)


HOOKED = Agent(
    name="hooked",
    tools=[],
    webhooks=[" https://a.example/hook", "http://127.0.0.1:8080/h", "https://a.example/hook"],
)


def test_an_agents_webhooks_are_kept_once_each_and_sent_beside_the_deployments():
    sender = WebhookSender(
        LocalSettings(store="sqlite:///unused.db", webhooks="https://d.example/x"), secret="s"
    )

    assert HOOKED.webhooks == ("https://a.example/hook", "http://127.0.0.1:8080/h")
    assert Agent(name="plain", tools=[]).webhooks == ()
    assert sender.urls_of(f"{__name__}:HOOKED") == (
        "https://d.example/x",
        "https://a.example/hook",
        "http://127.0.0.1:8080/h",
    )
    assert sender.urls_of("migration") == ("https://d.example/x",)
    # An agent that does not load here: the deployment's URLs only.
    assert sender.urls_of(f"{__name__}:MISSING") == ("https://d.example/x",)
