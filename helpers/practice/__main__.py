r"""The daily practice from a terminal: ``python -m helpers.practice COMMAND``.

    python -m helpers.practice due                 # what is due today, and why
    python -m helpers.practice show mha            # a card's prompt and scaffold
    python -m helpers.practice hint mha            # its hint (a pass today is then rated Hard)
    python -m helpers.practice check mha my_mha.py [--easy]   # check a solution file, record the attempt
    python -m helpers.practice stats
    python -m helpers.practice export practice.json
    python -m helpers.practice import practice.json

The store is ``$ATTN_PRACTICE_STORE`` or the user data folder; ``$ATTN_PRACTICE_NOW`` fixes the clock
(``--store`` and ``--now`` override them). Times are shown, and days counted, in the clock's zone: the
machine's local one for the real clock, the given offset (else UTC) for a fixed one. ``import`` merges an
export (a review already in the store is skipped; every entry is checked before anything is written).
Exit status: 0 on PASS or success, 1 on FAIL, 2 on an error (the message names the rule).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .daily import Clock, Practice, export_json, import_json
from .deck import PracticeError, card
from .store import Store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.practice", description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="the store file (default: $ATTN_PRACTICE_STORE or the user data folder)")
    ap.add_argument("--now", help="fix the clock, an ISO date-time, UTC unless it has an offset "
                                  "(default: $ATTN_PRACTICE_NOW or real time)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("due", help="the cards due today")
    for name in ("show", "hint"):
        sub.add_parser(name).add_argument("card")
    c = sub.add_parser("check", help="check a solution file and record the attempt")
    c.add_argument("card")
    c.add_argument("file")
    c.add_argument("--easy", action="store_true", help="rate a first-try pass Easy instead of Good")
    sub.add_parser("stats")
    sub.add_parser("export").add_argument("file")
    sub.add_parser("import").add_argument("file")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "show":  # needs no store
            print(Practice.show(args.card))
            return 0
        clock = Clock(args.now, source="--now") if args.now is not None else Clock.from_env()
        store = Store(args.store, source="--store") if args.store is not None else Store()
        p = Practice(store, now=clock)
        if args.cmd == "due":
            p.today()
        elif args.cmd == "hint":
            p.hint(args.card)
        elif args.cmd == "check":
            spec = card(args.card)
            path = Path(args.file)
            if not path.is_file():
                raise PracticeError(f"card {spec.id!r}: solution file {str(path)!r} does not exist (rule: "
                                    f"check CARD FILE takes a Python file that defines {', '.join(spec.names)})")
            return 0 if p.submit(spec.id, path.read_text(encoding="utf-8"), easy=args.easy).passed else 1
        elif args.cmd == "stats":
            p.print_stats()
        elif args.cmd == "export":
            Path(args.file).write_text(export_json(p), encoding="utf-8")
            print(f"exported {len(p.reviews())} review(s) to {args.file}")
        elif args.cmd == "import":
            path = Path(args.file)
            if not path.is_file():
                raise PracticeError(f"import: file {str(path)!r} does not exist (rule: import takes a file written by export)")
            print(f"imported {import_json(p, path.read_text(encoding='utf-8'))} review(s) from {args.file}")
    except PracticeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
