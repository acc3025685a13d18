"""The process a killed schedule's first life runs in: `python -m ratchet.testing.life SPEC`,
with `RATCHET_FAULT=kill:<point>@<step>`. It drives the run until the fault SIGKILLs it; it
exits 0 if the point was never reached (the run ended first)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ratchet.testing.runner import LifeSpec, live


def main() -> None:
    spec = LifeSpec.model_validate_json(Path(sys.argv[1]).read_text(encoding="utf-8"))
    live(spec, os.environ["RATCHET_FAULT"])
    sys.exit(0)


if __name__ == "__main__":
    main()
