"""What live previews cost the visitor: previews on vs off through the real app, end to end.

``python -m benchmarks.previews [--pairs 8]`` starts the app as its own process (``app.py``,
Gradio server on loopback, as in production: the client's work is not the server's) with the
embedded default and tiny FLUX offered, and for each case sends the same request with
``previews=False`` and ``previews=True`` in interleaved pairs through ``gradio_client``. It
reports two median ratios (on / off): the denoise time per image (the engine's own figure,
read from each PNG's settings chunk) and the whole request as the client waits for it, with the
spread over pairs and what each previews-on request streamed (updates, preview frames).
``benchmarks.run`` calls :func:`measure_end_to_end` for its "previews" figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from PIL import Image


@dataclass(frozen=True)
class PreviewCase:
    """One request shape to measure: a model at one bucket (and the app's --preview-seconds, if not the default)."""

    model: str
    resolution: str
    steps: int
    num_images: int = 2
    preview_seconds: float | None = None

    @property
    def label(self) -> str:
        rate = "" if self.preview_seconds is None else f", --preview-seconds {self.preview_seconds:g}"
        return f"{self.model} {self.resolution} {self.steps} steps x{self.num_images}{rate}"


#: The embedded default as a visitor first meets it (true CFG: two transformer calls a step), tiny
#: FLUX at 128x128 and 48 steps, and tiny FLUX.2 at 128x128 and 50 steps, whose images take long
#: enough here (0.3-0.6 s) to show previews at the default rate; then the same tiny FLUX request
#: with previews five times as often as the default (one per 0.05 s): the upper bound of their cost.
DEFAULT_CASES = (PreviewCase("tiny-shapes", "64x64", 12), PreviewCase("tiny-flux", "128x128", 48),
                 PreviewCase("tiny-flux2", "128x128", 50), PreviewCase("tiny-flux", "128x128", 48, preview_seconds=0.05))
PROMPT = "a red circle on a white background"


def _denoise_seconds(item: dict) -> float:
    with Image.open(item["image"]) as image:
        return json.loads(image.text["tpu_demo"])["timings"]["denoise_seconds"]


def _cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system, every thread) a process has used so far; 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def finished_and_preview(update: Any) -> tuple[list, bool]:
    """(the finished images, whether this update carried a preview) of one /generate update: a
    (gallery, preview HTML) pair, or, from an app before the preview had its own output
    (``--app-repo``), a gallery whose last item is the preview."""
    if isinstance(update, tuple):
        gallery, preview = update
        return list(gallery or []), bool(preview)
    finished = [item for item in update if not (item.get("caption") or "").startswith("preview")]
    return finished, len(finished) < len(update)


def _one_request(client: Any, case: PreviewCase, mode: str, seed: int, previews: bool,
                 server_pid: int | None = None) -> dict[str, Any]:
    """One /generate request consumed to its end, as a visitor's client sees it."""
    server_cpu = _cpu_seconds(server_pid)
    started = time.perf_counter()
    job = client.submit(prompt=PROMPT, model=case.model, mode=mode, resolution=case.resolution,
                        num_inference_steps=case.steps, guidance_scale=_guidance(case.model), seed=seed,
                        num_images=case.num_images, previews=previews, api_name="/generate")
    updates = list(job)
    seconds = time.perf_counter() - started
    final, _ = finished_and_preview(updates[-1])
    if len(final) != case.num_images:
        raise RuntimeError(f"{case.label}: {len(final)} of {case.num_images} images came back")
    frames = sum(1 for update in updates if finished_and_preview(update)[1])
    return {"seconds": seconds, "denoise": [_denoise_seconds(item) for item in final], "updates": len(updates),
            "frames": frames, "server_cpu": _cpu_seconds(server_pid) - server_cpu}


def _guidance(model: str) -> float:
    from tpu_demo.core.catalog import get_spec

    return get_spec(model).default_guidance


def _ratio_summary(on: list[float], off: list[float]) -> dict[str, Any]:
    """Median ratio of the medians, and the per-pair ratios' spread (noise on a shared machine)."""
    per_pair = [a / b for a, b in zip(on, off)]
    return {"ratio": round(statistics.median(on) / statistics.median(off), 4),
            "pair_ratio_min": round(min(per_pair), 4), "pair_ratio_max": round(max(per_pair), 4),
            "pair_ratio_median": round(statistics.median(per_pair), 4),
            # noise on a shared machine only adds time: the fastest of each side is the cleanest comparison
            "best_ratio": round(min(on) / min(off), 4),
            "on_ms": round(1000 * statistics.median(on), 2), "off_ms": round(1000 * statistics.median(off), 2)}


def measure_case(url: str, case: PreviewCase, pairs: int, mode: str = "eager",
                 gradio_cache: Path | None = None, server_pid: int | None = None) -> dict[str, Any]:
    """Interleaved pairs (off on, on off, ...) of the same request with previews off and on."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    _one_request(client, case, mode, 0, True)  # warm: model loaded, bucket run, preview map fitted
    _one_request(client, case, mode, 0, False)
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for index in range(pairs):
        order = (False, True) if index % 2 == 0 else (True, False)
        for previews in order:
            runs[previews].append(_one_request(client, case, mode, 100 + index, previews, server_pid))
    # per image, pair by pair: image k of request i with previews on vs the same image with them off
    denoise_on = [d for run in runs[True] for d in run["denoise"]]
    denoise_off = [d for run in runs[False] for d in run["denoise"]]
    cpu_on, cpu_off = (statistics.median(r["server_cpu"] for r in runs[side]) for side in (True, False))
    frames = statistics.median(r["frames"] for r in runs[True])
    return {"case": case.label, "mode": mode, "pairs": pairs,
            # the server's extra CPU per preview streamed: what one update costs, whatever the load
            "server_cpu_ms_per_preview": round(1000 * (cpu_on - cpu_off) / frames, 2) if frames else None,
            "denoise_per_image": _ratio_summary(denoise_on, denoise_off),
            "whole_request": _ratio_summary([r["seconds"] for r in runs[True]], [r["seconds"] for r in runs[False]]),
            "updates_per_request": {"on": statistics.median(r["updates"] for r in runs[True]),
                                    "off": statistics.median(r["updates"] for r in runs[False])},
            "preview_frames_per_request": statistics.median(r["frames"] for r in runs[True]),
            # CPU time the server process spent per request: robust where wall time is noisy (shared cores)
            "server_cpu_ms_per_request": {side: round(1000 * statistics.median(r["server_cpu"] for r in runs[on]), 1)
                                          for side, on in (("on", True), ("off", False))},
            "stream": {"on": stream_cost(url, case, True, gradio_cache, mode),
                       "off": stream_cost(url, case, False, gradio_cache, mode)}}


def _files_under(directory: Path | None) -> int:
    return sum(1 for path in directory.rglob("*") if path.is_file()) if directory else 0


def stream_cost(url: str, case: PreviewCase, previews: bool, gradio_cache: Path | None = None,
                mode: str = "eager") -> dict[str, Any]:
    """One request over raw HTTP (``POST /gradio_api/call/generate``, then its event stream): the
    bytes and messages on the stream, the file URLs it references (all of them: what gradio_client
    downloads on every update; distinct ones: what a browser fetches), and the files the server
    wrote into Gradio's cache."""
    body = {"data": [PROMPT, case.model, mode, case.resolution, case.steps, _guidance(case.model), 5,
                     case.num_images, previews, "", "None", 1.0, False]}  # no negative prompt, no style, as typed
    files_before = _files_under(gradio_cache)
    request = urllib.request.Request(url + "gradio_api/call/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        event_id = json.loads(response.read())["event_id"]
    stream_bytes, messages, referenced, distinct = 0, 0, 0, set()
    with urllib.request.urlopen(f"{url}gradio_api/call/generate/{event_id}", timeout=300) as response:
        for line in response:
            stream_bytes += len(line)
            if line.startswith(b"data:") and line[5:].strip() not in (b"null", b""):
                messages += 1
                urls = re.findall(rb'"url":\s*"([^"]+)"', line)
                referenced += len(urls)
                distinct.update(urls)
    return {"stream_bytes": stream_bytes, "messages": messages, "file_references": referenced,
            "distinct_files": len(distinct), "files_written": _files_under(gradio_cache) - files_before}


def measure_end_to_end(url: str, cases: Sequence[PreviewCase], pairs: int, mode: str = "eager",
                       gradio_cache: Path | None = None, server_pid: int | None = None) -> dict[str, Any]:
    return {case.label: measure_case(url, case, pairs, mode, gradio_cache, server_pid) for case in cases}


def app_flags(port: int, cache_dir: Path, cases: Sequence[PreviewCase], threads: int | None) -> list[str]:
    """An app offering every case's model, warmup off (each case warms its own bucket); the cases share
    one --preview-seconds."""
    models = ",".join(dict.fromkeys(case.model for case in cases))
    flags = ["--port", str(port), "--cache-dir", str(cache_dir), "--models", models, "--model", cases[0].model,
             "--no-warmup", "--compile-backend", "aot_eager"]
    if cases[0].preview_seconds is not None:
        flags += ["--preview-seconds", str(cases[0].preview_seconds)]
    return flags + (["--threads", str(threads)] if threads else [])


@contextlib.contextmanager
def app_process(flags: list[str], port: int, timeout: float = 300.0, repo: Path | None = None,
                gradio_cache: Path | None = None):
    """``python app.py <flags>`` in its own process (from ``repo``, default this checkout; Gradio's
    file cache in ``gradio_cache`` when given); yields (URL, pid) once ``/health`` answers."""
    repo = repo or Path(__file__).resolve().parent.parent
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")}
    if gradio_cache is not None:
        env["GRADIO_TEMP_DIR"] = str(gradio_cache)
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty server never blocks on it
    process = subprocess.Popen([sys.executable, "app.py", *flags], cwd=repo, env=env,
                               stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"app.py exited with {process.returncode}: {log.read()[-2000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "health", timeout=2) as response:
                    if response.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not answer /health within {timeout:.0f} s")
            time.sleep(0.2)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def run(cases: Sequence[PreviewCase], pairs: int, cache_dir: Path, threads: int | None = 1,
        mode: str = "eager", repo: Path | None = None) -> dict[str, Any]:
    """Start an app process per --preview-seconds among ``cases`` and measure each case."""
    from benchmarks.measure import free_port

    figures = {}
    for rate in dict.fromkeys(case.preview_seconds for case in cases):
        group = [case for case in cases if case.preview_seconds == rate]
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="gradio-cache-") as gradio_cache, \
                app_process(app_flags(port, cache_dir, group, threads), port, repo=repo,
                            gradio_cache=Path(gradio_cache)) as (url, pid):
            figures.update(measure_end_to_end(url, group, pairs, mode, Path(gradio_cache), pid))
    return figures


def markdown_rows(figures: dict[str, Any]) -> list[str]:
    rows = []
    for label, f in figures.items():
        d, w = f["denoise_per_image"], f["whole_request"]
        per_preview = "" if f["server_cpu_ms_per_preview"] is None else f" ({f['server_cpu_ms_per_preview']:.1f} per preview)"
        rows.append(f"| {label} ({f['mode']}) | {d['ratio']:.3f}x ({d['pair_ratio_min']:.2f}-{d['pair_ratio_max']:.2f}; "
                    f"{d['off_ms']:.0f} -> {d['on_ms']:.0f} ms; fastest/fastest {d['best_ratio']:.3f}x) | "
                    f"{w['ratio']:.3f}x ({w['pair_ratio_min']:.2f}-{w['pair_ratio_max']:.2f}; fastest/fastest "
                    f"{w['best_ratio']:.3f}x) | {f['preview_frames_per_request']:g} frames, "
                    f"{f['updates_per_request']['on']:g} vs {f['updates_per_request']['off']:g} updates | "
                    f"{f['server_cpu_ms_per_request']['off']:.0f} -> {f['server_cpu_ms_per_request']['on']:.0f}"
                    f"{per_preview} | {f['pairs']} |")
    return ["| request | denoise per image, on / off (pair spread; off -> on) | whole request, on / off | "
            "streamed per request (on vs off) | server CPU ms per request, off -> on | pairs |",
            "|---|---|---|---|---|---|", *rows, "", *stream_rows(figures)]


def stream_rows(figures: dict[str, Any]) -> list[str]:
    """What one request puts on the wire, previews on vs off (one request each, raw HTTP)."""
    rows = ["| request | previews | messages | bytes on the event stream | file references (distinct) | "
            "files written by the server |", "|---|---|---|---|---|---|"]
    for label, f in figures.items():
        for side in ("on", "off"):
            c = f["stream"][side]
            rows.append(f"| {label} | {side} | {c['messages']} | {c['stream_bytes']} | {c['file_references']} "
                        f"({c['distinct_files']}) | {c['files_written']} |")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.previews", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8, help="interleaved off/on pairs per case")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of the app")
    parser.add_argument("--mode", default="eager", help="execution mode of the measured requests")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tpu-demo")
    parser.add_argument("--app-repo", type=Path, default=None,
                        help="run app.py from another checkout (e.g. the commit before, for a before/after figure)")
    args = parser.parse_args(argv)

    import tpu_demo  # noqa: F401 - offline defaults before gradio/hub imports

    figures = run(DEFAULT_CASES, args.pairs, args.cache_dir, args.threads, args.mode, args.app_repo)
    print(json.dumps(figures, indent=1))
    print("\n".join(markdown_rows(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
