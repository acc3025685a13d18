"""The built-in demo agents: `migration` (SQLite or DynamoDB data) and `notebook` (RunData).

`ratchet.agents.SCENARIOS` names them; the library loads them by that import path only, as it
loads any agent of yours.
"""
