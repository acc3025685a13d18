"""Importing a user's object by its `module:attr` path: an agent, a model."""

from __future__ import annotations

import importlib
import re

from ratchet.errors import ImportInterrupted

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
"""A `module:attr` path (`attr` may be dotted), checked before anything is imported."""


class ImportFailed(ValueError):
    """The path does not import, or names nothing; the message says which, in one line."""


def import_object(target: str, *, what: str, reference: str) -> object:
    """The object `module:attr` (`attr` may be dotted) names, for a `what` (agent, model) the
    user called `reference`. Importing the user's module runs their code, which can fail in any
    way (ImportError, SyntaxError, anything it raises, even `sys.exit()`): each is a bad
    reference, said in one line (`ImportFailed`); a KeyboardInterrupt is `ImportInterrupted`."""
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        # The user's code raised it, or a Ctrl-C came mid-import: either way the command ends
        # interrupted (exit 130), saying where, not silently.
        raise ImportInterrupted(
            f"interrupted while importing {module_name!r} for {what} {reference!r} "
            "(KeyboardInterrupt)"
        ) from None
    except (Exception, SystemExit) as error:
        reason = " ".join(str(error).split())
        raise ImportFailed(
            f"cannot import {module_name!r} for {what} {reference!r}: "
            f"{type(error).__name__}" + (f": {reason}" if reason else "")
        ) from None
    found: object = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if found is None:
        raise ImportFailed(f"{module_name!r} has no {attribute!r} for {what} {reference!r}")
    return found
