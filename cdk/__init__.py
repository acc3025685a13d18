"""The repository's CDK app (`app.py`): a thin user of the construct that ships in the package
(`ratchet.cdk`), so the stack has exactly one definition, the one a user's own app
instantiates."""
