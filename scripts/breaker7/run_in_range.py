"""Run another breaker script with every port it picks in 42000-42999.

``.venv/bin/python -m scripts.breaker7.run_in_range scripts.breaker5.stack_faults stop 8 3``
"""
import random
import runpy
import socket
import sys

import publisher.stack
import scripts.breaker.harness as harness


def free_port() -> int:
    for _ in range(500):
        port = random.randint(42500, 42999)  # noqa: S311
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 42500-42999")


harness.free_port = free_port
publisher.stack.free_port = free_port

if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
