"""Ratchet's AWS deployment: the CDK app, one construct per capability.

Nothing here imports `ratchet` but `ratchet.schedules` (pydantic and croniter only): a deployed
schedule is checked by the very model a local one is, so both take the same expressions. The
Lambda code is an asset (`lambdas/`), and the names the handlers read are repeated in
`contract.py`, checked against the code by tests/infra.
"""
