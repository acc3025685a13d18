"""A refund agent for Ratchet: look the order up, ask a person above a limit, refund once."""
