"""``python -m xgrad <command>`` (also installed as the ``xgrad`` script)."""

from __future__ import annotations

import sys

#: Each command, with the line ``--help`` shows for it.
COMMANDS = {
    "demo": "train a small MLP four ways (eager, compiled backward, xgrad.compile, jax.jit); check they agree, time them",
}

USAGE = "usage: python -m xgrad COMMAND [ARGS...]    (python -m xgrad COMMAND --help for a command's options)"


def _help() -> str:
    width = max(map(len, COMMANDS))
    lines = [USAGE, "", "commands:"] + [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``argv`` (default: ``sys.argv[1:]``) to a command; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_help())
        return 0 if args else 2
    if args[0] not in COMMANDS:
        print(f"xgrad: unknown command {args[0]!r}; the commands are: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    from xgrad.demo import main as demo_main

    return demo_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
