"""The child process of :func:`helpers.practice.runner.run_solution`: ``python -m helpers.practice._child``.

A module of its own (not imported by the package), so that ``-m`` runs it without a second import.
It reads ``{"card", "source"}`` as JSON on stdin, runs :func:`~helpers.practice.runner.evaluate_source`
and writes the verdicts as JSON after :data:`~helpers.practice.runner.MARK`; whatever the learner's code
printed comes before it.
"""
import json
import sys

from helpers.practice.runner import MARK, evaluate_source


def main() -> None:
    request = json.loads(sys.stdin.read())
    result = evaluate_source(request["card"], request["source"])
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout.write(MARK + json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
