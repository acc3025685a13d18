"""`tests.bounded_agent`'s agents re-exported by another module, as a package re-exports its
agent (`pkg:agent` beside `pkg.mod:agent`): `tests.bounded_alias:two` and
`tests.bounded_agent:two` are two references to one agent."""

from tests.bounded_agent import agent, two

__all__ = ["agent", "two"]
