"""Ratchet's AWS deployment: the CDK app, one construct per capability.

Nothing here imports `ratchet`: the Lambda code is an asset (`lambdas/`), and the names the
handlers read are repeated in `contract.py`, checked against the code by tests/infra.
"""
