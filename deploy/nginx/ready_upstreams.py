#!/usr/bin/env python3
"""Keep nginx's replica lists to the replicas that are ready (open-source nginx checks upstreams only
passively, by failed requests, so it would send visitors to a replica that is still compiling).

Every ``--interval`` seconds: ``GET http://<replica>/ready``. Two files for deploy/nginx/tpu-demo.conf:
``tpu-demo-upstreams.conf``, one ``server`` line per replica with ``down`` unless it answered 200
(a replica that does not answer is down too), and ``tpu-demo-pinned.conf``, the ready replicas a
visitor's cookie may pin. When they change, they are replaced atomically and nginx reloaded
(running streams finish on the old workers). Standard library only: it runs on the balancer host
without the app's dependencies.

    deploy/nginx/ready_upstreams.py --replica 10.0.0.11:7860 --replica 10.0.0.12:7860 \\
        --output-dir /etc/nginx --reload-command "nginx -s reload"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def _address(text: str) -> str:
    """host:port, nothing else (it is written into nginx's configuration)."""
    if not re.fullmatch(r"[A-Za-z0-9.\-]+:[0-9]{1,5}|\[[0-9A-Fa-f:]+\]:[0-9]{1,5}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port")
    return text


def replica_state(replica: str, timeout: float) -> tuple[bool | None, str]:
    """(ready, reason) from the replica's /ready: True, False (it said 503, or refused the
    connection: not ready for sure), or None (no answer in time: maybe just busy)."""
    try:
        with urllib.request.urlopen(f"http://{replica}/ready", timeout=timeout) as response:
            return True, json.load(response).get("reason", "ready")
    except urllib.error.HTTPError as error:  # 503: not ready, the body says why
        try:
            return False, json.load(error).get("reason", f"HTTP {error.code}")
        except ValueError:
            return False, f"HTTP {error.code}"
    except (TimeoutError, socket.timeout) as error:
        return None, f"no answer in {timeout:g} s: {error}"
    except urllib.error.URLError as error:
        if isinstance(error.reason, (TimeoutError, socket.timeout)):
            return None, f"no answer in {timeout:g} s"
        return False, f"unreachable: {error.reason}"
    except (OSError, ValueError) as error:
        return False, f"unreachable: {error}"


class Verdicts:
    """A ready replica stays listed through up to ``patience`` checks in a row without an answer
    (a loaded host can be slow to answer); a 503 or a refused connection takes it out at once."""

    def __init__(self, patience: int):
        self.patience = patience
        self.ready: dict[str, bool] = {}
        self.silent: dict[str, int] = {}

    def update(self, replica: str, answer: bool | None) -> bool:
        if answer is None:
            self.silent[replica] = self.silent.get(replica, 0) + 1
            if self.silent[replica] >= self.patience:
                self.ready[replica] = False
        else:
            self.silent[replica] = 0
            self.ready[replica] = answer
        return self.ready.get(replica, False)


UPSTREAMS, PINNED = "tpu-demo-upstreams.conf", "tpu-demo-pinned.conf"


def replica_files(states: dict[str, bool], max_fails: int, fail_timeout: int) -> dict[str, str]:
    """The two included files' text: every replica (down unless ready), and the ready ones to pin."""
    header = "# written by deploy/nginx/ready_upstreams.py: only replicas whose GET /ready answered 200"
    upstreams = [header + " are up"] + [
        f"server {replica} max_fails={max_fails} fail_timeout={fail_timeout}s{'' if ready else ' down'};"
        for replica, ready in states.items()]
    # nginx needs at least one server: with every replica down, requests get 502 until one is ready
    pinned = [header + " may be pinned"] + [f'"{replica}" {replica};' for replica, ready in states.items() if ready]
    return {UPSTREAMS: "\n".join(upstreams) + "\n", PINNED: "\n".join(pinned) + "\n"}


def write_atomically(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=path.name + ".") as handle:
        handle.write(text)
    os.chmod(handle.name, 0o644)
    os.replace(handle.name, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replica", action="append", required=True, type=_address,
                        help="host:port of one replica (repeat)")
    parser.add_argument("--output-dir", type=Path, required=True,
                        help=f"where tpu-demo.conf includes {UPSTREAMS} and {PINNED} from (nginx's conf dir)")
    parser.add_argument("--reload-command", default="nginx -s reload", help="run when the list changed ('' = none)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between checks")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds a /ready answer may take")
    parser.add_argument("--max-fails", type=int, default=1,
                        help="nginx's passive check: failed connections before a replica is skipped ...")
    parser.add_argument("--fail-timeout", type=int, default=10, help="... for this many seconds")
    parser.add_argument("--patience", type=int, default=3,
                        help="checks in a row without an answer before a ready replica is listed down")
    parser.add_argument("--once", action="store_true", help="check and write once, then exit")
    args = parser.parse_args(argv)
    previous: dict[str, str] | None = None
    verdicts = Verdicts(args.patience)
    while True:
        states, reasons = {}, {}
        for replica in args.replica:
            answer, reasons[replica] = replica_state(replica, args.timeout)
            states[replica] = verdicts.update(replica, answer)
        files = replica_files(states, args.max_fails, args.fail_timeout)
        if files != previous:
            for name, text in files.items():
                write_atomically(args.output_dir / name, text)
            for replica in args.replica:
                print(f"{replica}: {'ready' if states[replica] else 'down'} ({reasons[replica]})", flush=True)
            reloaded = True
            if args.reload_command:
                result = subprocess.run(shlex.split(args.reload_command), capture_output=True, text=True)
                reloaded = result.returncode == 0
                if not reloaded:  # tried again at the next check
                    print(f"reload failed ({result.returncode}): {result.stderr.strip()}", file=sys.stderr, flush=True)
            previous = files if reloaded else None
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
