"""The local notifier: every message a deployment would send, written to a folder instead.

`<store>.outbox/` beside the SQLite file holds one JSON file per message (an email per
recipient with its own signed link, or the Slack message with its buttons), so a person, a
test or a browser can open exactly what would have been sent. With a payload codec, each file
is a sealed envelope (`ratchet.stored.sealed_record_text`, its run in clear): the recipients,
the question and the link are read back through `messages`, and the link is printed by the
worker that parks the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from ratchet.adapters.private import private_folder
from ratchet.approvals.messages import email_html, email_text, slack_blocks
from ratchet.sealing import PayloadCodec
from ratchet.stored import open_record_text, sealed_record_text
from ratchet.waits import ApprovalNotice

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class OutboxNotifier:
    def __init__(self, folder: Path, codec: PayloadCodec | None = None) -> None:
        self.folder = folder
        self._codec = codec

    def send(self, notice: ApprovalNotice) -> None:
        stem = f"{notice.run_id}-step-{notice.step}-{notice.approval_id[:8]}"
        for invitation in notice.emails:
            self._write(
                self._email_name(stem, invitation.recipient),
                notice.run_id,
                {
                    "channel": "email",
                    "to": invitation.recipient,
                    "subject": notice.subject,
                    "link": invitation.url,
                    "text": email_text(notice, invitation),
                    "html": email_html(notice, invitation),
                },
            )
        if notice.slack_channel:
            self._write(
                f"{stem}-slack-{notice.slack_channel}",
                notice.run_id,
                {
                    "channel": "slack",
                    "to": notice.slack_channel,
                    "text": notice.subject,
                    "blocks": slack_blocks(notice),
                },
            )

    def messages(self) -> list[dict[str, Any]]:
        """Every message in the outbox, oldest first."""
        if not self.folder.exists():
            return []
        files = sorted(self.folder.glob("*.json"), key=lambda p: (p.stat().st_mtime_ns, p.name))
        return [
            json.loads(open_record_text(p.read_text(encoding="utf-8"), self._codec, part="outbox"))
            for p in files
        ]

    def _email_name(self, stem: str, recipient: str) -> str:
        # The digest keeps recipients apart whom the safe-name rule would merge. With a codec
        # the name holds no address, only a keyed hash of it: the file's name is in clear.
        if self._codec is not None:
            return f"{stem}-email-{self._codec.address(recipient.encode())[:24]}"
        return (
            f"{stem}-email-{_UNSAFE.sub('_', recipient)[:80]}-"
            f"{hashlib.sha256(recipient.encode()).hexdigest()[:12]}"
        )

    def _write(self, name: str, run_id: str, message: dict[str, Any]) -> None:
        text = json.dumps(message, indent=2, ensure_ascii=False)
        # No blob is in a message, and its link's signature must not be named in clear.
        text = sealed_record_text(
            text, self._codec, part="outbox", run_id=run_id, names_blobs=False
        )
        private_folder(self.folder)
        path = self.folder / f"{_UNSAFE.sub('_', name)[:200]}.json"
        # mkstemp: owner-only from the start (the links in it decide in their recipient's
        # name), and a draft of this call's own.
        handle, draft = tempfile.mkstemp(dir=self.folder, prefix=f".{path.name}.")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(draft, path)
