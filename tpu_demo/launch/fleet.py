"""Run ``--chips``: N engines behind nginx on this host (or one tensor-parallel group), one command.

The launcher never imports torch. Engines start one after another, each once the previous one's
``/ready`` says 200, each pinned to its chip and all sharing the compile cache; nginx sends visitors to
ready engines only. Ctrl-C / SIGTERM stops them all; an engine that dies stops the others (exit 1). A
tensor-parallel plan replaces this process with ``scripts/serve_tp.sh N``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from tpu_demo.launch.chips import ENGINES, ChipsError, ChipsPlan, Host, plan_chips
from tpu_demo.launch.config import AppConfig

log = logging.getLogger("tpu_demo.chips")

REPO = Path(__file__).resolve().parents[2]
NGINX_CONF = REPO / "deploy" / "nginx" / "tpu-demo.conf"
SYNC = REPO / "deploy" / "nginx" / "ready_upstreams.py"
#: what a child inherits must not make it a launcher again, nor move it off its own port
_LAUNCHER_ONLY_ENV = ("TPU_DEMO_CHIPS", "TPU_DEMO_HOST", "TPU_DEMO_PORT", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT")


def without_flags(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """``argv`` without ``--name value`` / ``--name=value`` for each name (what engines must not get)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
        elif not any(arg.startswith(name + "=") for name in names):
            out.append(arg)
    return out


def probe_host(argv: Sequence[str]) -> tuple[Host, tuple[str, ...]]:
    """The host's chips and the offered models, from a child process that exits before engines start."""
    code = ("import json, sys; from tpu_demo.device import scan_tpu_chips; from tpu_demo.launch.config import parse_config; "
            "from tpu_demo.launch.offer import offered_models; chips, name, hbm = scan_tpu_chips(); "
            "print('HOST ' + json.dumps({'chips': chips, 'name': name, 'hbm': hbm, "
            "'models': list(offered_models(parse_config(sys.argv[1:])))}))")
    env = {**_child_base_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # a PCI scan, never the runtime
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    line = next((l for l in out.stdout.splitlines() if l.startswith("HOST ")), None)
    if out.returncode != 0 or line is None:
        raise ChipsError(f"could not read this host's chips and models: {out.stderr.strip()[-1500:]}")
    found = json.loads(line.removeprefix("HOST "))
    host = (Host("tpu", found["chips"], found["name"], (found["hbm"] or 0) / 1e9) if found["chips"] > 0
            else Host("cpu", 0, "CPU"))
    return host, tuple(found["models"])


def _child_base_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in _LAUNCHER_ONLY_ENV}


def engine_ports(port: int, count: int) -> list[int]:
    """port+1 .. port+count next to the public port, or free ones when the public port is picked (0)."""
    if port:
        return [port + 1 + index for index in range(count)]
    ports = []
    for _ in range(count):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def engine_settled(port: int) -> bool:
    """Whether the engine on 127.0.0.1:``port`` is done warming: ``/ready`` says 200, or that it failed."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as response:
            return response.status == 200
    except urllib.error.HTTPError as error:  # 503: still warming, or failed (the next engine would fail too)
        try:
            return json.loads(error.read() or b"{}").get("reason", "").startswith("failed")
        except ValueError:
            return False
    except (OSError, ValueError):  # not listening yet
        return False


def nginx_binary() -> str | None:
    """Debian's nginx (on PATH or /usr/sbin, which a non-root PATH may lack), or None."""
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def nginx_files(workdir: Path, host: str, port: int) -> Path:
    """deploy/nginx/tpu-demo.conf listening on host:port, in an nginx.conf of its own (no root needed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    template = NGINX_CONF.read_text()
    if template.count("listen 8080;") != 1:
        raise ChipsError(f"{NGINX_CONF} no longer has one 'listen 8080;' line to point at --host/--port")
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    (workdir / "tpu-demo.conf").write_text(template.replace("listen 8080;", f"listen {listen};"))
    d = workdir
    (d / "nginx.conf").write_text(f"""pid {d}/nginx.pid;
error_log {d}/error.log info;
daemon off;
events {{ worker_connections 1024; }}
http {{
    include tpu-demo.conf;
    access_log {d}/access.log tpu_demo;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
}}
""")
    return d / "nginx.conf"


def main(argv: Sequence[str], config: AppConfig) -> int:
    """Plan and run ``--chips``; returns the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine_argv = without_flags(argv, ("--chips", "--host", "--port"))
    try:
        host, models = probe_host(engine_argv)
        plan = plan_chips(config.chips or "all", host, models)
    except ChipsError as error:
        sys.stderr.write(f"app.py: error: {error}\n")
        return 2
    log.info("%s", plan.describe())
    if plan.layout != ENGINES:
        tp_argv = without_flags(argv, ("--chips", "--models")) + ["--models", ",".join(plan.models)]
        env = _child_base_env()
        env.pop("TPU_DEMO_CHIPS", None)
        os.chdir(REPO)
        os.execvpe("bash", ["bash", "scripts/serve_tp.sh", str(plan.count), *tp_argv], env)
    return run_engines(plan, config, engine_argv)


def run_engines(plan: ChipsPlan, config: AppConfig, engine_argv: list[str]) -> int:
    """Start the engines, nginx and the readiness sync; wait for a signal or an engine's death."""
    nginx = nginx_binary()
    if nginx is None:
        sys.stderr.write("app.py: error: --chips puts the engines behind nginx: install it (apt install nginx)\n")
        return 2
    public_port = config.port or engine_ports(0, 1)[0]
    workdir = config.resolved_cache_dir / f"chips-{public_port}"
    conf = nginx_files(workdir, config.host, public_port)
    workdir.chmod(0o777)  # nginx's workers (not root when started by root) write their temp files here
    ports = engine_ports(config.port, plan.count)
    processes: list[subprocess.Popen] = []
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    def start_engine(index: int) -> None:
        env = {**_child_base_env(), **plan.engine_environment(index)}
        with open(workdir / f"engine-{index}.log", "w") as out:
            processes.append(subprocess.Popen(
                [sys.executable, str(REPO / "app.py"), *engine_argv, "--host", "127.0.0.1", "--port", str(ports[index])],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
        log.info("engine %d: 127.0.0.1:%d%s, log %s", index, ports[index],
                 f", chip {index} ({plan.host.name})" if plan.host.kind == "tpu" else "",
                 workdir / f"engine-{index}.log")

    try:
        start_engine(0)  # the others start one by one, each once the one before is ready (see below)
        started = 1
        replicas = [flag for port in ports for flag in ("--replica", f"127.0.0.1:{port}")]
        nginx_command = [nginx, "-p", str(workdir), "-c", str(conf)]
        subprocess.run([sys.executable, str(SYNC), *replicas, "--output-dir", str(workdir), "--once",
                        "--reload-command", ""], check=True, capture_output=True)
        processes.append(subprocess.Popen(nginx_command, stderr=open(workdir / "nginx.stderr", "w")))
        reload_command = " ".join(nginx_command + ["-s", "reload"])
        with open(workdir / "sync.log", "w") as out:
            processes.append(subprocess.Popen([sys.executable, str(SYNC), *replicas, "--output-dir", str(workdir),
                                               "--interval", "1", "--reload-command", reload_command],
                                              stdout=out, stderr=subprocess.STDOUT))
        log.info("serving on http://%s:%d/ through nginx (%s); engines join as their /ready says 200",
                 config.host, public_port, conf)
        while not stopping:
            dead = [p for p in processes if p.poll() is not None]
            if dead:
                log.error("%s exited with %s: stopping every engine", " ".join(map(str, dead[0].args[:3])),
                          dead[0].returncode)
                return 1
            if started < len(ports) and engine_settled(ports[started - 1]):
                # engines warm one after another: each graph is compiled once, by the first engine, and read
                # from the shared compile cache by the next ones instead of compiled by all at the same time
                log.info("engine %d is ready: starting engine %d (it reads the compile cache)", started - 1, started)
                start_engine(started)
                started += 1
            time.sleep(0.5)
        return 0
    finally:
        for process in processes:  # engines drain on SIGTERM; nginx and the sync stop at once
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
