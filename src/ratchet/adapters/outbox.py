"""The local notifier: every message a deployment would send, written to a folder instead.

`<store>.outbox/` beside the SQLite file holds one JSON file per message (an email per
recipient with its own signed link, or the Slack message with its buttons), so a person, a
test or a browser can open exactly what would have been sent.
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
from ratchet.waits import ApprovalNotice

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class OutboxNotifier:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def send(self, notice: ApprovalNotice) -> None:
        stem = f"{notice.run_id}-step-{notice.step}-{notice.approval_id[:8]}"
        for invitation in notice.emails:
            self._write(
                # The digest keeps recipients apart whom the safe-name rule would merge.
                f"{stem}-email-{_UNSAFE.sub('_', invitation.recipient)[:80]}-"
                f"{hashlib.sha256(invitation.recipient.encode()).hexdigest()[:12]}",
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
        return [json.loads(p.read_text(encoding="utf-8")) for p in files]

    def _write(self, name: str, message: dict[str, Any]) -> None:
        private_folder(self.folder)
        path = self.folder / f"{_UNSAFE.sub('_', name)[:200]}.json"
        # mkstemp: owner-only from the start (the links in it decide in their recipient's
        # name), and a draft of this call's own.
        handle, draft = tempfile.mkstemp(dir=self.folder, prefix=f".{path.name}.")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(json.dumps(message, indent=2, ensure_ascii=False))
        os.replace(draft, path)
