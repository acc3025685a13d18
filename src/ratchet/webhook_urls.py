"""Where a run's webhooks may be sent: the rules for a URL of `RATCHET_WEBHOOKS` and of an
agent's `webhooks` (`ratchet.tools.Agent`), on the lowest floor so that the agent, the
deployment's settings and the sender check one rule.

A webhook URL is http or https with a host, holds no user or password, and names no link-local
address (169.254.0.0/16, fe80::/10: a cloud's instance metadata, whose credentials a delivery
must never reach). A name that resolves to one is refused by the sender when it sends
(`any_link_local`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from ratchet.errors import InvalidInput


def check_webhook_url(url: str) -> str:
    """`url` if a webhook may be sent there; else `InvalidInput` saying why: it must be http
    or https with a host, and not a link-local address (169.254.0.0/16, fe80::/10: a cloud's
    instance metadata, whose credentials a delivery must never reach)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"webhook URL {url!r}: only http:// or https:// URLs with a host")
    if parts.username or parts.password:
        raise InvalidInput(f"webhook URL {url!r}: no user or password in it")
    if link_local(parts.hostname):
        raise InvalidInput(f"webhook URL {url!r}: a link-local address is never sent to")
    return url.strip()


def parse_webhook_urls(text: str) -> tuple[str, ...]:
    """The URLs of `RATCHET_WEBHOOKS` (separated by commas or spaces), each checked."""
    return tuple(check_webhook_url(u) for u in text.replace(",", " ").split())


def link_local(host: str) -> bool:
    """Whether `host` is a link-local IP address (a name is checked once resolved)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_link_local or (mapped is not None and mapped.is_link_local))


def any_link_local(addresses: Sequence[Any]) -> bool:
    """Whether any of `socket.getaddrinfo`'s answers is link-local: a name that resolves there
    is refused as its address would be."""
    return any(link_local(str(info[4][0]).split("%")[0]) for info in addresses)
