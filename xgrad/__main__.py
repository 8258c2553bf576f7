"""``python -m xgrad <command>``; the one command is ``demo`` (see ``xgrad/demo.py``)."""

from __future__ import annotations

import sys

COMMANDS = ("demo",)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``argv`` (default: ``sys.argv[1:]``) to a command; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m xgrad demo [--steps N] [--device DEVICE] [--compiled | --eager] [--profile [PATH]]")
        return 0 if args else 2
    if args[0] not in COMMANDS:
        print(f"xgrad: unknown command {args[0]!r}; the commands are: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    from xgrad.demo import main as demo_main

    return demo_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
