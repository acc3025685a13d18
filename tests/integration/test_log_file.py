"""The log beside the store (`ratchet.observability.AppendedLines`, `ratchet.cli.context.log_path`):
named as the store's other files are, made only when a line is written, appended to, and
stderr when it cannot be opened."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from ratchet.cli.context import log_path
from ratchet.observability import AppendedLines


@pytest.mark.parametrize(
    ("store", "log"),
    [
        ("sqlite:///.ratchet/ratchet.db", ".ratchet/ratchet.log"),
        ("sqlite:////srv/runs.db", "/srv/runs.log"),
        ("sqlite:///runs", "runs.log"),
        ("sqlite:///odd.log", "odd.log.log"),  # never the store itself
    ],
)
def test_the_log_is_named_after_the_store_beside_it(store, log):
    assert log_path(store) == Path(log)


@pytest.mark.parametrize("store", ["dynamodb://t?ledger=l&app=a", "sqlite:///"])
def test_a_store_with_no_file_has_no_log_beside_it(store):
    assert log_path(store) is None


def test_the_log_is_made_at_the_first_line_and_appended_to(tmp_path):
    path = tmp_path / "new" / "ratchet.log"
    path_lines = AppendedLines(path)
    path_lines.flush()
    assert not path.parent.exists(), "nothing logged, nothing made"

    path_lines.write('{"message":"one"}\n')
    AppendedLines(path).write('{"message":"two"}\n')

    assert path.read_text(encoding="utf-8") == '{"message":"one"}\n{"message":"two"}\n'


def test_a_log_that_cannot_be_opened_goes_to_stderr(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("", encoding="utf-8")
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)

    AppendedLines(blocked / "ratchet.log").write('{"message":"kept"}\n')

    assert stderr.getvalue() == '{"message":"kept"}\n'
