"""Which failures `is_transient` says may pass by themselves: a cause that may pass makes its
error transient however deep it is, and an error no retry can fix (`TERMINAL_ERRORS`) anywhere
in the chain makes it permanent, whatever else the chain holds."""

from __future__ import annotations

import errno
import itertools

import pytest

from ratchet.errors import (
    ModelUnavailable,
    PermanentError,
    StepAttemptFailed,
    StoreBusy,
    is_transient,
)


def _chain(*errors: BaseException) -> BaseException:
    """`errors[0]` raised from `errors[1]`, raised from `errors[2]`, ..."""
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    return errors[0]


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ConnectionError("reset"), True),
        (StoreBusy("locked"), True),
        (OSError(errno.ENOSPC, "disk full"), True),
        (ModelUnavailable("rate limited"), True),
        (_chain(RuntimeError("wrapped"), TimeoutError("slow")), True),
        (_chain(StepAttemptFailed("step 1", transient=False), ConnectionError("reset")), True),
        (RuntimeError("bug"), False),
        (OSError(errno.ENOENT, "no such file"), False),
        (PermanentError("card declined"), False),
        (_chain(PermanentError("card declined"), ConnectionError("reset")), False),
        (_chain(RuntimeError("tool"), PermanentError("declined"), ConnectionError("reset")), False),
        (_chain(StepAttemptFailed("step 1", transient=True), PermanentError("declined")), False),
        (
            _chain(
                StepAttemptFailed("step 1", transient=True),
                RuntimeError("tool"),
                PermanentError("declined"),
            ),
            False,
        ),
        (None, False),
    ],
)
def test_an_error_is_transient_unless_no_retry_can_fix_anything_in_its_chain(error, transient):
    assert is_transient(error) is transient
