"""People in the loop: approvals, their signed links, the page and the messages that ask."""
