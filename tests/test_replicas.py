"""Replicas behind a real nginx (Debian's), configured by deploy/nginx/tpu-demo.conf as the docs give it.

Real `python app.py` processes on loopback ports, nginx on another, deploy/nginx/ready_upstreams.py
keeping nginx's replica lists to the ready ones, and gradio_client visitors (each pinned to a
replica by the cookie nginx sets). Shows: every request completes with its own images and both
replicas serve; Stop reaches the replica that runs the job; a replica that is not ready yet
receives no generation, even for a cookie that names it, and does once ready, while the visitors
already pinned stay; killing a replica mid-run fails only its own requests.
Which replica ran a request is read from the replicas' own request log lines (by seed).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from gradio_client import Client
from PIL import Image

from conftest import free_port, request_fields

REPO = Path(__file__).resolve().parents[1]
NGINX_CONF = REPO / "deploy" / "nginx" / "tpu-demo.conf"
SYNC = REPO / "deploy" / "nginx" / "ready_upstreams.py"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
FAST = dict(previews=False)  # 2 steps at 64x64: a fraction of a second
#: long enough to still be running when the test acts on it (16 images x 50 steps at 128x128)
LONG = dict(previews=False, resolution="128x128", num_inference_steps=50, num_images=16)

pytestmark = pytest.mark.skipif(not os.path.exists(NGINX), reason="Debian's nginx is not installed "
                                "(scripts/test.sh installs it)")


class Replica:
    """One `python app.py` on a loopback port, its output in a log file."""

    def __init__(self, name: str, workdir: Path, port: int):
        self.name, self.port, self.workdir = name, port, workdir
        self.address = f"127.0.0.1:{port}"
        self.log = workdir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self, *flags: str) -> "Replica":
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONUNBUFFERED": "1"}
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "app.py", "--port", str(self.port), "--cache-dir", str(self.workdir / f"cache-{self.name}"),
                 "--model", "tiny-flux", "--compile-backend", "aot_eager", "--threads", "1",
                 # every visitor reaches the replicas from 127.0.0.1 here; 16 images make a long job
                 "--max-per-ip", "0", "--max-images", "16", "--max-batch", "1", *flags],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def ready(self) -> tuple[int, str]:
        try:
            response = httpx.get(f"http://{self.address}/ready", timeout=30)
            return response.status_code, response.json()["reason"]
        except httpx.HTTPError as error:
            return 0, f"unreachable: {error}"

    def requests(self) -> list[dict]:
        """The replica's JSON request log lines."""
        marker = "tpu_demo.requests: "
        if not self.log.exists():
            return []
        return [json.loads(line.split(marker, 1)[1]) for line in self.log.read_text().splitlines() if marker in line]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


class Balancer:
    """Debian's nginx running deploy/nginx/tpu-demo.conf, and the readiness sync keeping its list."""

    def __init__(self, workdir: Path, replicas: list[Replica]):
        self.dir = workdir / "nginx"
        self.dir.mkdir()
        self.dir.chmod(0o777)  # nginx's workers (not root) write their temp files here
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        template = NGINX_CONF.read_text()
        assert template.count("listen 8080;") == 1
        (self.dir / "tpu-demo.conf").write_text(template.replace("listen 8080;", f"listen 127.0.0.1:{self.port};"))
        d = self.dir
        # what Debian's /etc/nginx/nginx.conf gives the file (http context), with paths in the test's folder
        (d / "nginx.conf").write_text(f"""pid {d}/nginx.pid;
error_log {d}/error.log info;
daemon off;
worker_processes 1;
events {{ worker_connections 256; }}
http {{
    include tpu-demo.conf;
    access_log {d}/access.log tpu_demo;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
}}
""")
        self.upstreams = d / "tpu-demo-upstreams.conf"
        replica_flags = [flag for r in replicas for flag in ("--replica", r.address)]
        nginx = f"{NGINX} -p {d} -c {d / 'nginx.conf'}"
        subprocess.run([sys.executable, SYNC, *replica_flags, "--output-dir", d, "--once",
                        "--reload-command", ""], check=True, capture_output=True)
        self.nginx = subprocess.Popen([NGINX, "-p", d, "-c", d / "nginx.conf"], stderr=subprocess.PIPE)
        self.sync_log = d / "sync.log"
        with open(self.sync_log, "w") as log:
            self.sync = subprocess.Popen([sys.executable, SYNC, *replica_flags, "--output-dir", d,
                                          "--interval", "0.3", "--reload-command", f"{nginx} -s reload"],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not (d / "nginx.pid").exists():
            assert self.nginx.poll() is None and time.monotonic() < deadline, self.nginx.stderr.read()
            time.sleep(0.05)

    def answers(self, path: str) -> bool:
        """Whether a new visitor (no cookie) gets 200 for ``path`` through nginx."""
        try:
            return httpx.get(self.url + path, timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def pins(self, address: str) -> bool:
        """Whether a visitor whose cookie names ``address`` is sent straight there (no new cookie)."""
        try:
            response = httpx.get(self.url + "gradio_api/info", cookies={"tpu_demo_replica": address}, timeout=10)
        except httpx.HTTPError:
            return False
        # only nginx's cookie counts: the app itself gives every new caller its owner cookie (web/callers.py)
        return response.status_code == 200 and not any(
            value.startswith("tpu_demo_replica=") for value in response.headers.get_list("set-cookie"))

    def reloaded(self, address: str) -> bool:
        """Whether the old config's worker has stopped taking connections, and the new one pins a cookie
        naming ``address``.

        One pinned answer is not enough: until the old worker handles its quit signal it still accepts
        connections and routes the cookie elsewhere, so a visitor's join and its event stream could
        reach different replicas (the stream then answers 404). A quitting worker closes its listening
        socket, then retitles itself "is shutting down"; it lives on while open connections last
        (gradio_client's heartbeat streams), so this waits for the title, not for the exit.
        The titles are read after the pinned answer: nginx's master starts the new worker before it
        tells the old one to quit, so titles read first could predate the new worker."""
        if not self.pins(address):
            return False
        try:
            titles = [" ".join(worker.cmdline()) for worker in psutil.Process(self.nginx.pid).children()]
        except psutil.NoSuchProcess:  # a worker exited while listed: look again
            return False
        accepting = [title for title in titles if "shutting down" not in title]
        return len(accepting) == 1  # worker_processes 1 (nginx.conf above)

    def listed_up(self) -> set[str]:
        return {line.split()[1] for line in self.upstreams.read_text().splitlines()
                if line.startswith("server ") and not line.rstrip(";").endswith("down")}

    def close(self) -> None:
        for process in (self.sync, self.nginx):
            process.terminate()
            process.wait(timeout=10)


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("replicas")
    replicas = {name: Replica(name, workdir, free_port()) for name in ("a", "b", "c")}
    for name in ("a", "b"):
        replicas[name].start()
    balancer = Balancer(workdir, list(replicas.values()))  # c is listed, down until it starts and is ready
    try:
        # generous: on a shared 2-core machine under load a start-up has taken minutes
        _wait(lambda: balancer.listed_up() == {replicas["a"].address, replicas["b"].address}, 600,
              "replicas a and b to be ready and listed")
        # the list is written before nginx's reload takes effect (old workers finish with the old one):
        # wait until fresh visitors really reach a replica through nginx
        _wait(lambda: all(balancer.answers("gradio_api/info") for _ in range(4)), 60,
              "nginx to route visitors to the ready replicas")
        yield balancer, replicas
    finally:
        balancer.close()
        for replica in replicas.values():
            replica.stop()
        print("nginx access log tail:\n" + "".join((balancer.dir / "access.log").read_text().splitlines(True)[-5:]))


def _served_by(replicas: dict, seed: int, wait: float = 30) -> str:
    """The replica whose request log has the request with this seed (logged when the request ends)."""
    deadline = time.monotonic() + wait
    while True:
        names = [name for name, r in replicas.items() if any(line.get("seed") == seed for line in r.requests())]
        if names or time.monotonic() > deadline:
            assert len(names) == 1, f"seed {seed} logged by {names}"
            return names[0]
        time.sleep(0.1)


def _seeds(gallery) -> list[int]:
    seeds = []
    for item in gallery:
        with Image.open(item["image"]) as image:
            seeds.append(json.loads(image.text["tpu_demo"])["seed"])
    return seeds


def _generate(client: Client, replicas: dict, seed: int, **fields) -> str:
    """One generation through nginx; checks its images are its own; returns the replica that ran it."""
    gallery, _ = client.predict(**request_fields(seed=seed, **{**FAST, **fields}), api_name="/generate")
    assert _seeds(gallery) == [seed + i for i in range(fields.get("num_images", 1))]
    return _served_by(replicas, seed)


def _client(balancer, **cookies) -> Client:
    """A new visitor; nginx's first answer (the config) pins it with the tpu_demo_replica cookie."""
    client = Client(balancer.url, verbose=False, httpx_kwargs={"cookies": cookies} if cookies else {})
    assert client.cookies.get("tpu_demo_replica"), "nginx set no affinity cookie"
    return client


def test_every_request_completes_with_its_own_images_and_both_replicas_serve(cluster):
    balancer, replicas = cluster
    clients, served = [], {}
    # new visitors until both replicas have some (random cookies: bounded, 2**-19 to miss one)
    while len(set(served.values())) < 2 and len(clients) < 20:
        clients.append(_client(balancer))
        served[len(clients) - 1] = _generate(clients[-1], replicas, seed=1000 + len(clients))
    assert set(served.values()) == {"a", "b"}, served
    # the cookie names the replica that served the first answer, and the visitor's requests went there
    assert all(clients[i].cookies["tpu_demo_replica"] == replicas[name].address for i, name in served.items())
    # several visitors at once, two requests each: every one completes, each visitor stays on its replica
    with ThreadPoolExecutor(len(clients)) as pool:
        again = list(pool.map(lambda i: [_generate(clients[i], replicas, seed=2000 + 10 * i + k, num_images=2)
                                         for k in (0, 5)], range(len(clients))))
    assert all(runs == [served[i], served[i]] for i, runs in enumerate(again)), (served, again)
    print(f"{len(clients)} visitors: " + ", ".join(f"{name} {list(served.values()).count(name)}" for name in "ab"))


def test_browsers_through_nginx_get_their_images_from_the_replica_their_cookie_names(cluster):
    from playwright.sync_api import sync_playwright

    from browser_support import guard_network, launch_chromium, wait_for_gallery_images

    balancer, replicas = cluster
    by_address = {r.address: name for name, r in replicas.items()}
    served = []
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            while set(served) != {"a", "b"} and len(served) < 12:  # new visitors until both replicas have one
                context = browser.new_context()
                blocked = guard_network(context)
                page = context.new_page()
                errors: list[str] = []
                page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(balancer.url)
                page.wait_for_selector("#generate")
                (cookie,) = [c for c in context.cookies() if c["name"] == "tpu_demo_replica"]
                name = by_address[cookie["value"]]
                before = {n: len(r.requests()) for n, r in replicas.items()}
                page.fill("#prompt textarea", "a red circle on a white background")
                page.click("#generate")
                wait_for_gallery_images(page, 1)
                _wait(lambda: len(replicas[name].requests()) == before[name] + 1, 30, "the replica's log line")
                assert {n: len(r.requests()) for n, r in replicas.items() if n != name} == \
                    {n: count for n, count in before.items() if n != name}
                assert blocked == [] and errors == [], (blocked, errors)
                served.append(name)
                context.close()
        finally:
            browser.close()
    assert set(served) == {"a", "b"}, served


def test_stop_reaches_the_replica_that_runs_the_job(cluster):
    balancer, replicas = cluster
    stopped_on = set()
    for attempt in range(20):  # a stopped job on each replica (new visitors land at random)
        client = _client(balancer)
        name = _generate(client, replicas, seed=3000 + 10 * attempt)
        if name in stopped_on:
            continue
        seed = 3001 + 10 * attempt
        job = client.submit(**request_fields(seed=seed, **LONG), api_name="/generate")
        for gallery, _ in job:
            if len(gallery) >= 1:
                client.predict(api_name="/stop")  # a separate HTTP request; only the cookie routes it
                break
        _wait(job.done, 300, "the stopped job to end")
        final, _ = job.outputs()[-1]
        assert 1 <= len(final) < LONG["num_images"], "Stop did not reach the replica running the job"
        assert _served_by(replicas, seed) == name
        (line,) = [line for line in replicas[name].requests() if line.get("seed") == seed]
        assert line["outcome"] == "stopped" and line["images_done"] == len(final)
        stopped_on.add(name)
        if stopped_on == {"a", "b"}:
            break
    assert stopped_on == {"a", "b"}


def test_a_replica_that_is_not_ready_receives_no_generation(cluster):
    balancer, replicas = cluster
    c = replicas["c"]
    # compiled mode, four buckets: several seconds of compiles before it is ready
    c.start("--mode", "compiled", "--buckets", "64x64,96x64,128x64,128x128")
    _wait(lambda: c.ready()[0] == 503, 600, "replica c to answer /ready (503 while it compiles)")
    # a cookie naming c (forged, or left from before a restart) does not reach it while it is not ready
    forged = _client(balancer, tpu_demo_replica=c.address)
    assert _generate(forged, replicas, seed=4000) in {"a", "b"}
    visitors = []  # (client, replica that served it) for visitors whose requests all ended while c was not ready
    with ThreadPoolExecutor(2) as pool:
        while c.ready()[0] == 503 and len(visitors) < 16:
            batch = [_client(balancer) for _ in range(2)]
            names = list(pool.map(lambda args: _generate(args[1], replicas, seed=4100 + len(visitors) + args[0]),
                                  enumerate(batch)))
            status, reason = c.ready()
            if status == 503:
                visitors += zip(batch, names)
                assert c.requests() == [], "a replica that was not ready ran a generation"
    assert visitors, "replica c was ready before any visitor came"
    assert {name for _, name in visitors} <= {"a", "b"}
    # once ready, the sync lists it: the cookie naming it reaches it, pinned visitors stay where they are,
    # and new visitors reach it too
    _wait(lambda: c.address in balancer.listed_up(), 600, "replica c to be listed once ready")
    # the reload's new workers take over: a cookie naming c is then pinned (nginx sets no new cookie)
    # (old workers finish their open connections first; a request needs the new ones)
    _wait(lambda: balancer.reloaded(c.address), 90, "nginx's old worker to quit and the new one to pin c")
    assert _generate(forged, replicas, seed=5000) == "c"
    after = [_generate(client, replicas, seed=5100 + i) for i, (client, _) in enumerate(visitors)]
    assert after == [name for _, name in visitors]
    newcomers = []
    while "c" not in newcomers and len(newcomers) < 30:
        newcomers.append(_generate(_client(balancer), replicas, seed=5200 + len(newcomers)))
    assert "c" in newcomers
    print(f"{len(visitors)} visitors while c was not ready ({reason!r}), all on a/b and still there after; "
          f"newcomers after: {newcomers}")


def test_killing_a_replica_mid_run_fails_only_its_own_requests(cluster):
    balancer, replicas = cluster
    by_replica: dict[str, Client] = {}
    for i in range(40):  # one visitor on each of a and b
        client = _client(balancer)
        name = _generate(client, replicas, seed=6000 + i)
        by_replica.setdefault(name, client)
        if {"a", "b"} <= set(by_replica):
            break
    assert {"a", "b"} <= set(by_replica)
    jobs = {name: by_replica[name].submit(**request_fields(seed=7000 + k, **LONG), api_name="/generate")
            for k, name in enumerate(("a", "b"))}
    _wait(lambda: all(len(job.outputs()) >= 1 for job in jobs.values()), 300, "both long jobs to stream an image")
    replicas["a"].process.send_signal(signal.SIGKILL)
    _wait(lambda: all(job.done() for job in jobs.values()), 300, "both jobs to end")
    with pytest.raises(Exception) as failure:  # the client is told; it does not hang
        jobs["a"].result()
    print(f"the killed replica's job ended with {failure.typename}: {str(failure.value)[:120]}")
    # the images a's visitor got before the kill (the client may list the failed download after them)
    galleries = [output[0] for output in jobs["a"].outputs() if isinstance(output, (list, tuple)) and output
                 and isinstance(output[0], list)]
    assert galleries and len(galleries[-1]) < LONG["num_images"]
    assert _seeds(jobs["b"].outputs()[-1][0]) == [7001 + i for i in range(LONG["num_images"])]
    # once the sync has listed a down, a's visitor is served elsewhere (its stale cookie is hashed in the
    # group); b's keeps its replica
    _wait(lambda: replicas["a"].address not in balancer.listed_up(), 30, "replica a to be listed down")
    assert _generate(by_replica["a"], replicas, seed=8000) in {"b", "c"}
    assert _generate(by_replica["b"], replicas, seed=8001) == "b"


def test_the_sync_lists_a_slow_ready_replica_until_its_patience_runs_out():
    """ready_upstreams.py against real loopback servers: 200, 503, no answer in time, refused."""
    import importlib.util
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    spec = importlib.util.spec_from_file_location("ready_upstreams", SYNC)
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    behaviour = {"status": 200, "delay": 0.0}

    class Replica(BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(behaviour["delay"])
            body = json.dumps({"ready": behaviour["status"] == 200, "reason": "compiling bucket 1 of 2"}).encode()
            self.send_response(behaviour["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    verdicts = sync.Verdicts(patience=2)
    try:
        assert sync.replica_state(address, 1.0) == (True, "compiling bucket 1 of 2")
        assert verdicts.update(address, True) is True
        behaviour["delay"] = 1.5  # busy: no answer within the timeout
        answer, reason = sync.replica_state(address, 0.3)
        assert answer is None and "no answer" in reason
        assert verdicts.update(address, answer) is True  # kept once
        assert verdicts.update(address, answer) is False  # not twice in a row
        behaviour.update(delay=0.0, status=503)
        assert verdicts.update(address, True) is True and sync.replica_state(address, 1.0) == (
            False, "compiling bucket 1 of 2")
        assert verdicts.update(address, False) is False  # a 503 takes it out at once
    finally:
        server.shutdown()
        server.server_close()
    answer, reason = sync.replica_state(address, 1.0)  # nothing listens there any more
    assert answer is False and "unreachable" in reason
    files = sync.replica_files({address: False, "127.0.0.1:1": True}, 1, 10)
    assert f"server {address} max_fails=1 fail_timeout=10s down;" in files[sync.UPSTREAMS]
    assert address not in files[sync.PINNED] and '"127.0.0.1:1" 127.0.0.1:1;' in files[sync.PINNED]
