"""pytest -p scripts.breaker3.ports_plugin: private redis-servers of tests on ports 40000-45000 only."""
import random
import socket

import tests.worker.redis_proc as redis_proc


def _free_port() -> int:
    for _ in range(500):
        port = random.randint(40000, 45000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 40000-45000")


redis_proc.free_port = _free_port
