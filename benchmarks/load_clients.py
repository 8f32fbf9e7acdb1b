"""Visitors from outside: N gradio_client clients, each calling /generate back to back.

Run as a separate process by benchmarks/throughput.py so the clients do not share the server's
interpreter (its GIL) or get counted in its figures. It connects every client, prints ``READY``,
waits for a line on stdin, then runs and prints one JSON line: wall seconds from the go line to
the last image, images, and each request's latency as the client saw it (submit to last update).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load_clients")
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--requests", type=int, required=True, help="requests per client, back to back")
    parser.add_argument("--fields", required=True, help="JSON of the /generate fields; seed is set per request")
    args = parser.parse_args()
    from gradio_client import Client

    fields = json.loads(args.fields)
    clients = [Client(args.url, verbose=False) for _ in range(args.clients)]
    latencies: list[float] = []
    errors: list[str] = []
    images = [0]
    lock = threading.Lock()

    def visitor(index: int, client: Client) -> None:
        for request in range(args.requests):
            started = time.perf_counter()
            try:
                updates = list(client.submit(**{**fields, "seed": 20_000 + 100 * index + request},
                                             api_name="/generate"))
                with lock:
                    latencies.append(time.perf_counter() - started)
                    images[0] += len(updates[-1]) if updates else 0
            except Exception as error:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(str(error)[:200])

    print("READY", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=visitor, args=(i, c)) for i, c in enumerate(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"seconds": time.perf_counter() - started, "images": images[0], "latencies": latencies,
                      "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
