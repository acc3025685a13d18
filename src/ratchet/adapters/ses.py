"""Approval emails through Amazon SES (v2 `SendEmail`): one message per recipient, HTML and
plain text, each with the recipient's own signed link."""

from __future__ import annotations

from typing import Any

from ratchet.approvals.messages import email_html, email_text
from ratchet.waits import ApprovalNotice


class SesNotifier:
    def __init__(self, client: Any, *, sender: str, configuration_set: str | None = None) -> None:
        """`client` is a boto3 `sesv2` client; `sender` a verified SES identity."""
        self._client = client
        self._sender = sender
        self._configuration_set = configuration_set

    def send(self, notice: ApprovalNotice) -> None:
        for invitation in notice.emails:
            request: dict[str, Any] = {
                "FromEmailAddress": self._sender,
                "Destination": {"ToAddresses": [invitation.recipient]},
                "Content": {
                    "Simple": {
                        "Subject": {"Data": notice.subject, "Charset": "UTF-8"},
                        "Body": {
                            "Text": {"Data": email_text(notice, invitation), "Charset": "UTF-8"},
                            "Html": {"Data": email_html(notice, invitation), "Charset": "UTF-8"},
                        },
                    }
                },
            }
            if self._configuration_set:
                request["ConfigurationSetName"] = self._configuration_set
            self._client.send_email(**request)
