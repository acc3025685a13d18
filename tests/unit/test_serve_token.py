"""`ratchet serve` off localhost: which requests the bearer token guards, and how a request
without it is answered (the e2e test, tests/e2e/test_serve_local.py, runs the real server)."""

from __future__ import annotations

import json

import pytest
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from ratchet.web.serve import BearerToken, base_url, is_local, listening_url

TOKEN = "Zm9vYmFyYmF6cXV1eF9mb29iYXJiYXpxdXV4X2Zvb2Jh"
GUARD = BearerToken(TOKEN, ("/runs", "/schedules", "/dashboard"))


def asked(path: str, authorization: str | None = None, method: str = "GET") -> Request:
    headers = [("Authorization", authorization)] if authorization is not None else []
    return Request(EnvironBuilder(path=path, method=method, headers=headers).get_environ())


@pytest.mark.parametrize(
    "path", ["/runs", "/runs/r1/approve", "/runs/r1/hooks/ci", "/schedules", "/dashboard/runs/x"]
)
def test_the_runs_api_schedules_and_dashboard_take_the_token(path):
    refused = GUARD.refusal(asked(path, method="POST"))

    assert refused is not None
    assert refused.status_code == 401
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert refused.mimetype == "application/json"
    body = json.loads(refused.get_data(as_text=True))
    assert "Authorization: Bearer <token>" in body["error"]
    assert body["problems"] == []
    assert TOKEN not in refused.get_data(as_text=True)
    assert GUARD.refusal(asked(path, f"Bearer {TOKEN}", method="POST")) is None


@pytest.mark.parametrize(
    "path", ["/approvals/abc", "/slack/interactions", "/hooks/h1", "/", "/nowhere"]
)
def test_signed_routes_take_no_token(path):
    assert GUARD.refusal(asked(path, method="POST")) is None


@pytest.mark.parametrize(
    "authorization",
    [
        "",
        TOKEN,
        f"Basic {TOKEN}",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN.upper()}",
        "Bearer ",
        "Bearer é" + TOKEN,
    ],
    ids=["empty", "no-scheme", "basic", "short", "long", "case", "blank", "non-ascii"],
)
def test_anything_but_the_token_is_refused(authorization):
    assert GUARD.refusal(asked("/runs", authorization)) is not None


def test_the_scheme_is_case_insensitive_as_http_says():
    assert GUARD.refusal(asked("/runs", f"bearer {TOKEN}")) is None


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.2", False),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
    ],
)
def test_only_these_three_names_are_this_machine_alone(host, local):
    assert is_local(host) is local


def test_urls_bracket_ipv6_and_name_the_machine_for_every_interface(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "build-box")

    assert listening_url("::1", 8771) == "http://[::1]:8771"
    assert base_url("127.0.0.1", 8771) == "http://127.0.0.1:8771"
    assert base_url("0.0.0.0", 8771) == "http://build-box:8771"
    assert base_url("::", 8771) == "http://build-box:8771"
