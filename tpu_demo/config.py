"""Command-line flags and ``TPU_DEMO_*`` environment variables -> AppConfig.

Every flag has an environment twin (``--memory-budget`` <-> ``TPU_DEMO_MEMORY_BUDGET``); the
command line wins. A bad value exits with status 2 and one line naming the flag.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .buckets import Bucket, BucketError, parse_bucket_list
from .catalog import CATALOG, Placement
from .modes import ExecutionMode

ENV_PREFIX = "TPU_DEMO_"


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpu-demo"


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be from 0 to 65535")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or a positive integer")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be 0 or a positive number")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be a positive number")
    return value


def _model_list(text: str) -> tuple[str, ...]:
    models = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [model for model in models if model not in CATALOG]
    if unknown or not models:
        raise ValueError(f"unknown model(s) {unknown or text!r}; known: {', '.join(CATALOG)}")
    return models


def _known_model(text: str) -> str:
    if text not in CATALOG:
        raise ValueError(f"unknown model {text!r}; known: {', '.join(CATALOG)}")
    return text


def _buckets(text: str) -> tuple[Bucket, ...]:
    try:
        return parse_bucket_list(text)
    except BucketError as error:
        raise ValueError(str(error)) from None


def _choice(values: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(f"must be one of: {', '.join(values)}")
        return text

    return parse


#: (flag, parser or None for on/off switches, default, help)
_FLAGS: tuple[tuple[str, Callable[[str], Any] | None, Any, str], ...] = (
    ("host", str, "127.0.0.1", "address to listen on (0.0.0.0 to serve the network)"),
    ("port", _port, 7860, "port to listen on (0 = pick a free one)"),
    ("model", _known_model, None, "model selected at start (default: the first offered)"),
    ("models", _model_list, None, "comma-separated model ids offered to users "
                                  "(default: the tiny models plus real ones present locally)"),
    ("buckets", _buckets, None, "resolution buckets of the start model, e.g. 64x64,128x96"),
    ("mode", _choice([m.value for m in ExecutionMode]), ExecutionMode.EAGER.value, "execution mode at start"),
    ("placement", _choice([p.value for p in Placement]), None, "force a placement instead of choosing by size"),
    ("memory-budget", _positive_float, None, "GB of weights that may stay loaded together when switching models"),
    ("compile-backend", _choice(["inductor", "aot_eager", "eager"]), "inductor",
     "torch.compile backend off TPU (TPU always uses torch-tpu's 'tpu')"),
    ("cache-dir", Path, None, "where built tiny models and compile caches live (default ~/.cache/tpu-demo)"),
    ("threads", _positive_int, None, "torch CPU threads (default: torch's choice)"),
    ("device", _choice(["tpu", "cuda", "cpu"]), None, "restrict device detection (default: tpu, then cuda, then cpu)"),
    ("preview-every", _non_negative_int, 1, "stream a latent preview every N denoising steps (0: off)"),
    ("max-queue", _positive_int, 32, "requests that may wait in the queue; more are told the app is busy"),
    ("max-images", _positive_int, 4, "most images one request may ask for"),
    ("max-prompt-chars", _positive_int, 1000, "longest prompt accepted"),
    ("max-per-session", _non_negative_int, 1, "requests one browser session / API client may have waiting "
                                               "or running (0: no limit)"),
    ("max-per-ip", _non_negative_int, 4, "requests one client address may have waiting or running (0: no limit)"),
    ("request-timeout", _non_negative_float, 300.0, "seconds a request may run from its first denoising step "
                                                    "before it is stopped (0: no limit)"),
    ("log-prompts", None, False, "include prompts in the per-request log lines"),
    ("no-warmup", None, False, "do not warm the buckets at start-up"),
    ("share", None, False, "create a public gradio.live link (contacts Gradio's share servers)"),
    ("tensor-parallel", None, False, "one rank of a tensor-parallel group started by torchrun "
                                     "(use scripts/serve_tp.sh N); rank 0 serves the UI"),
    ("tp-timeout", _positive_float, 60.0, "seconds a tensor-parallel rank may lag beyond the expected step "
                                          "time before rank 0 reports the group failed"),
)


@dataclass(frozen=True)
class AppConfig:
    host: str
    port: int
    model: str | None
    models: tuple[str, ...] | None
    buckets: tuple[Bucket, ...] | None
    mode: str
    placement: str | None
    memory_budget: float | None
    compile_backend: str
    cache_dir: Path | None
    threads: int | None
    device: str | None
    preview_every: int
    max_queue: int
    max_images: int
    max_prompt_chars: int
    max_per_session: int
    max_per_ip: int
    request_timeout: float
    log_prompts: bool
    no_warmup: bool
    share: bool
    tensor_parallel: bool = False
    tp_timeout: float = 60.0

    @property
    def resolved_cache_dir(self) -> Path:
        return self.cache_dir or _default_cache_dir()

    @property
    def start_mode(self) -> ExecutionMode:
        return ExecutionMode(self.mode)


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # noqa: D401 - argparse hook
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="app.py", description="TPU diffusion demo (Gradio)")
    for name, parse, default, help_text in _FLAGS:
        env = ENV_PREFIX + name.upper().replace("-", "_")
        if parse is None:
            parser.add_argument(f"--{name}", action="store_true", help=f"{help_text} [{env}]")
        else:
            parser.add_argument(f"--{name}", type=_named(parse, f"--{name}"), default=None,
                                help=f"{help_text} [{env}; default {default}]")
    return parser


def _named(parse: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    def wrapper(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, TypeError) as error:
            raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None

    wrapper.__name__ = flag
    return wrapper


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> AppConfig:
    """Parse flags, falling back to ``TPU_DEMO_*`` variables, then defaults; exit 2 on bad values."""
    environ = os.environ if environ is None else environ
    args = vars(_parser().parse_args(argv))
    values: dict[str, Any] = {}
    for name, parse, default, _ in _FLAGS:
        key = name.replace("-", "_")
        env = ENV_PREFIX + name.upper().replace("-", "_")
        if args[key] is not None and args[key] is not False:
            values[key] = args[key]
        elif env in environ and environ[env] != "":
            raw = environ[env]
            if parse is None:
                values[key] = raw.strip().lower() in ("1", "true", "yes", "on")
                continue
            try:
                values[key] = parse(raw)
            except (ValueError, TypeError) as error:
                sys.stderr.write(f"app.py: error: {env} (--{name}) {raw!r}: {error}\n")
                raise SystemExit(2) from None
        else:
            values[key] = default
    return AppConfig(**values)
