"""Visitors from outside: N clients, each calling /generate back to back.

Run as a separate process by benchmarks/throughput.py so the clients do not share the server's
interpreter (its GIL) or get counted in its figures. It connects every client, prints ``READY``,
waits for a line on stdin, then runs and prints one JSON line: wall seconds from the go line to
the last image, images, each request's latency as the client saw it (submit to the last image
downloaded) and this process's CPU seconds.

Three kinds of client (``--client``):

- ``gradio_client``: the real ``gradio_client``, waiting on ``job.result()``. It downloads every
  output file, but it reads its event stream by polling a queue every 50 ms (gradio_client's
  ``stream_sse_v1plus``), so each request waits up to 50 ms after the server has finished.
- ``gradio_client_one_ssl_context``: the same client handed one SSL context to reuse
  (``ssl_verify=ssl.create_default_context()``, passed through to ``httpx`` as ``verify``).
  ``gradio_client`` calls ``httpx.post`` / ``httpx.stream`` afresh for the join, the event stream
  and each download, and each builds a new SSL context, loading certifi's CA bundle, even for an
  ``http://`` URL: most of its CPU per request. This kind shows what is left without that.
- ``http``: raw HTTP as a curl user or a browser does it, with ``httpx``: ``POST
  /gradio_api/call/generate``, read the event stream until ``complete``, then ``GET`` each image
  of the gallery. No polling: the latency is the server's. Each visitor keeps one session (a
  ``session_hash``, as a browser tab does): without one, Gradio builds a new session state, a
  copy of the whole page's config, for every request.
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

#: /generate's inputs in the handler's order (the raw API takes them positionally)
INPUTS = ("prompt", "model", "mode", "resolution", "num_inference_steps", "guidance_scale", "seed", "num_images",
          "previews", "negative_prompt", "style", "style_scale", "upsample_prompt")
#: what an input left out of ``fields`` is sent as (the prompt as typed: benchmarks/upsampler.py measures the rewrite)
DEFAULTS = {"negative_prompt": "", "style": "None", "style_scale": 1.0, "upsample_prompt": False}


class GradioClientVisitor:
    def __init__(self, url: str, one_ssl_context: bool = False):
        import ssl

        from gradio_client import Client

        self.client = Client(url, verbose=False,
                             **({"ssl_verify": ssl.create_default_context()} if one_ssl_context else {}))

    def generate(self, fields: dict) -> int:
        gallery, _preview = self.client.submit(**fields, api_name="/generate").result()
        return len(gallery)


class HttpVisitor:
    def __init__(self, url: str):
        import secrets

        import httpx

        self.http = httpx.Client(base_url=url, timeout=120)
        self.session_hash = secrets.token_hex(6)

    def generate(self, fields: dict) -> int:
        body = {"data": [fields.get(name, DEFAULTS.get(name, "")) for name in INPUTS], "session_hash": self.session_hash}
        event_id = self.http.post("gradio_api/call/generate", json=body).raise_for_status().json()["event_id"]
        event, payload = None, None
        with self.http.stream("GET", f"gradio_api/call/generate/{event_id}") as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event in ("complete", "error"):
                    payload = line[6:]
                    break
        if event != "complete":
            raise RuntimeError(f"generate ended with {event}: {payload}")
        gallery, _preview = json.loads(payload)
        for item in gallery:
            self.http.get(item["image"]["url"]).raise_for_status()  # the image, as a browser fetches it
        return len(gallery)


VISITORS = {"gradio_client": GradioClientVisitor, "http": HttpVisitor,
            "gradio_client_one_ssl_context": lambda url: GradioClientVisitor(url, one_ssl_context=True)}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load_clients")
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--requests", type=int, required=True, help="requests per client, back to back")
    parser.add_argument("--fields", required=True, help="JSON of the /generate fields; seed is set per request")
    parser.add_argument("--client", choices=sorted(VISITORS), default="gradio_client")
    args = parser.parse_args()

    fields = json.loads(args.fields)
    visitors = [VISITORS[args.client](args.url) for _ in range(args.clients)]
    latencies: list[float] = []
    errors: list[str] = []
    images = [0]
    lock = threading.Lock()

    def visit(index: int, visitor) -> None:
        for request in range(args.requests):
            started = time.perf_counter()
            try:
                count = visitor.generate({**fields, "seed": 20_000 + 100 * index + request})
                with lock:
                    latencies.append(time.perf_counter() - started)
                    images[0] += count
            except Exception as error:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(str(error)[:200])

    print("READY", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=visit, args=(i, v)) for i, v in enumerate(visitors)]
    cpu, started = time.process_time(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"seconds": time.perf_counter() - started, "images": images[0], "latencies": latencies,
                      "errors": errors, "client_cpu_seconds": time.process_time() - cpu}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
