"""The child process of :func:`helpers.practice.runner.run_solution`: ``python -m helpers.practice._child``.

A module of its own (not imported by the package), so that ``-m`` runs it without a second import.
It reads ``{"card", "source"}`` as JSON on stdin, runs :func:`~helpers.practice.runner.evaluate_source`
and writes the verdicts as JSON after :data:`~helpers.practice.runner.MARK`; whatever the learner's code
printed comes before it. It then ends with ``os._exit(0)``: a thread the learner's code left
running does not keep it alive (the runner kills what else is left of its process group).
"""
import json
import os
import sys

from helpers.practice.runner import MARK, evaluate_source


def main() -> None:
    request = json.loads(sys.stdin.read())
    result = evaluate_source(request["card"], request["source"])
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout.write(MARK + json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
