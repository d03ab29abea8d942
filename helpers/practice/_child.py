"""The child process of :func:`helpers.practice.runner.run_solution`.

Two ways in, one body (:func:`_answer`): :func:`serve`, forked from the runner's preloaded forkserver, and
``python -m helpers.practice._child`` (:func:`main`), a new interpreter where there is no forkserver, which reads
``{"card", "source"}`` as JSON on stdin. A module of its own (not imported by the package), so that ``-m`` runs
it without a second import. It runs :func:`~helpers.practice.runner.evaluate_source` and writes the verdicts as
JSON after :data:`~helpers.practice.runner.MARK`; whatever the learner's code printed comes before it. It then
ends with ``os._exit(0)``: a thread the learner's code left running does not keep it alive (the runner kills
what else is left of its process group).
"""
import json
import os
import sys

from helpers.practice.runner import MARK, evaluate_source


def _answer(card: str, source: str) -> None:
    result = evaluate_source(card, source)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout.write(MARK + json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve(request: dict, out_path: str, err_path: str) -> None:
    """The forked child: first a session of its own (so the runner can kill all it starts), then the
    caller's environment, working folder and thread count, stdout and stderr into the runner's files."""
    os.setsid()
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path.insert(0, request["cwd"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    _answer(request["card"], request["source"])


def main() -> None:
    request = json.loads(sys.stdin.read())
    _answer(request["card"], request["source"])


if __name__ == "__main__":
    main()
