"""`python -m ratchet.cli`: the full CLI, as the demo, the benches and the tests run it."""

from ratchet.cli.app import main

main()
