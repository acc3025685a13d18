"""An on-call agent for Ratchet with async tools: check a service's health, open one incident."""
