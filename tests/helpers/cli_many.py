"""Run ``python -m engine`` command lines one after another in this one process (through
``cli.main``), each with its stderr taken at the file descriptor; write
``[{"code": int, "stderr": str}, ...]`` as JSON.

    python cli_many.py CASES.json RESULTS.json

CASES.json: ``[[argv, cwd], ...]``.  One process start (torch, ~4 s of CPU) for many refusals,
so a fuzz of many files runs under one memory cap (the caller's ``RLIMIT_AS``).  Anything that
escapes ``cli.main`` (a traceback, MemoryError) is recorded as its traceback text with code
-1, and the next case runs.
"""
import json
import os
import sys
import tempfile
import traceback


def run_one(argv, cwd) -> dict:
    from shardmd.engine.cli.main import main

    os.chdir(cwd)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as err:
        os.dup2(err.fileno(), 2)
        try:
            code = main(list(argv))
        except BaseException:   # noqa: BLE001 - recorded: the test fails on it
            sys.stderr.write(traceback.format_exc())
            code = -1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return {"code": code, "stderr": err.read()}


def main() -> None:
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    results = [run_one(argv, cwd) for argv, cwd in cases]
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
