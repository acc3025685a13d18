"""The command line in the order the commands parse it, whatever order it was typed in.

`--store` and `--log-json` are options of `ratchet` itself and `--json` of each read command,
but a person types them anywhere: `ratchet status RUN --store runs.db` and
`ratchet --json status RUN` mean what `ratchet --store runs.db status RUN` and
`ratchet status RUN --json` do. `arrange` moves a `--store` or `--log-json` typed after the
command to the front and a `--json` typed before it to the end, and leaves everything after a
`--` alone. Nothing here loads a module: the quick read commands
(`ratchet.cli.quick`) arrange their arguments with it too.
"""

STORE = "--store"
LOG_JSON = "--log-json"
JSON = "--json"


def arrange(args: list[str]) -> list[str]:
    """`args` with every `--store` and `--log-json` before the command and a `--json` after
    it."""
    front: list[str] = []
    index = 0
    json_before = False
    while index < len(args) and args[index].startswith("-") and args[index] != "--":
        arg = args[index]
        if arg == STORE and index + 1 < len(args):
            front += args[index : index + 2]
            index += 2
            continue
        if arg == JSON:
            json_before = True
        else:
            front.append(arg)
        index += 1
    rest: list[str] = []
    tail = args[index:]
    while tail:
        arg = tail[0]
        if arg == "--":
            rest += tail
            break
        if arg == STORE and len(tail) > 1:
            front += tail[:2]
            tail = tail[2:]
            continue
        if arg.startswith(STORE + "=") or arg == LOG_JSON:
            front.append(arg)
        else:
            rest.append(arg)
        tail = tail[1:]
    if json_before and rest:
        end = rest.index("--") if "--" in rest else len(rest)
        rest.insert(end, JSON)
    elif json_before:
        front.append(JSON)
    return front + rest
