"""Waiting on the world: events sent to a run, their webhooks, and timers (the person's
decision is `ratchet.approvals`). Every wait settles through the engine's one conditional
write (`Engine.decide_waiting`)."""
