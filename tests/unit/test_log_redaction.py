"""A Step Functions task token is a bearer credential for its execution: whatever a Ratchet
logger is asked to log, no token reaches the line, and nothing else is lost."""

from __future__ import annotations

import io
import json
import logging
import secrets
from base64 import b64encode
from collections.abc import Callable

from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from ratchet.handlers import _wiring
from ratchet.observability import REDACTED, json_logger, redact, redacted_json

# Shaped as AWS's are: base64 of several hundred bytes (its header is always the same).
TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAA" + b64encode(secrets.token_bytes(520)).decode()


def test_a_token_under_its_name_is_redacted_at_any_depth_and_in_any_spelling():
    event = {
        "run_id": "r-1",
        "task_token": "short-moto-token",
        "nested": [{"taskToken": "t2"}, {"TaskToken": "t3", "kept": "yes"}],
    }

    assert redact(event) == {
        "run_id": "r-1",
        "task_token": REDACTED,
        "nested": [{"taskToken": REDACTED}, {"TaskToken": REDACTED, "kept": "yes"}],
    }


def test_a_token_written_into_text_beside_its_name_or_shaped_like_one_is_redacted():
    texts = [
        f'sending {{"task_token": "{TOKEN}"}} on',
        "SendTaskSuccess taskToken=moto-1234-abcd failed",
        f"An error occurred (TaskTimedOut): token {TOKEN} closed",
        f"{TOKEN}",
    ]

    redacted = [redact(text) for text in texts]

    assert all(TOKEN not in text and "moto-1234-abcd" not in text for text in redacted)
    assert redacted[1] == f"SendTaskSuccess taskToken={REDACTED} failed"
    assert redacted[2] == f"An error occurred (TaskTimedOut): token {REDACTED} closed"


def test_what_is_not_a_token_is_logged_as_it_is():
    line = {
        "run_id": "refund-2026-12-01",
        "approval_id": secrets.token_urlsafe(24),
        "sig": secrets.token_hex(32),
        "url": "https://api.example.test/v1/approvals/abc?run=r-1&exp=1767225600",
        "steps": 3,
        "ok": True,
    }

    assert redact(line) == line
    assert json.loads(redacted_json(line)) == line


def _lines_written(write: Callable[[logging.Logger], None]) -> str:
    """What a logger formatted as Ratchet's are (Powertools' formatter, `redacted_json`)
    writes."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LambdaPowertoolsFormatter(json_serializer=redacted_json))
    logger = logging.getLogger(f"ratchet.tests.redaction.{secrets.token_hex(4)}")
    logger.propagate = False
    logger.addHandler(handler)
    write(logger)
    return stream.getvalue()


def test_no_token_is_written_from_a_message_an_extra_or_an_exception():
    def write(logger: logging.Logger) -> None:
        logger.warning({"task_token": TOKEN, "run_id": "r-1"}, extra={"taskToken": TOKEN})
        try:
            raise RuntimeError(f"Invalid token {TOKEN}")
        except RuntimeError:
            logger.exception(f"resume failed for {TOKEN}")

    written = _lines_written(write)

    assert TOKEN not in written
    lines = [json.loads(line) for line in written.splitlines()]
    assert lines[0]["message"] == {"task_token": REDACTED, "run_id": "r-1"}
    assert lines[0]["taskToken"] == REDACTED
    assert lines[1]["message"] == f"resume failed for {REDACTED}"
    assert lines[1]["exception"].endswith(f"RuntimeError: Invalid token {REDACTED}")


def test_every_ratchet_logger_writes_through_redacted_json():
    # The handlers' logger and the CLI's are Powertools loggers of the `ratchet` service: the
    # first one made in a process attaches the handler that writes every line of both.
    json_logger(io.StringIO()).debug("made")  # made when first used
    handlers = logging.getLogger(_wiring.SERVICE).handlers
    assert handlers
    for handler in handlers:
        assert isinstance(handler.formatter, LambdaPowertoolsFormatter)
        assert handler.formatter.json_serializer is redacted_json


def test_a_line_keeps_its_non_ascii_text_as_powertools_writes_it():
    assert redacted_json({"message": "approuvé par Zoë"}) == '{"message":"approuvé par Zoë"}'
