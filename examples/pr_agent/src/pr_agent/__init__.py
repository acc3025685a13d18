"""A pull-request agent that waits on the world (see agent.py)."""
