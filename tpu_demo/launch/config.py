"""Command-line flags and ``TPU_DEMO_*`` environment variables -> AppConfig.

Every flag has an environment twin and the command line wins; ``--host`` and ``--port`` then fall back
to Gradio's ``GRADIO_SERVER_NAME`` / ``GRADIO_SERVER_PORT``. A bad value exits with status 2 and one
line naming the flag.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tpu_demo.core.buckets import BATCH_SIZES, Bucket, BucketError, parse_bucket_list
from tpu_demo.core.catalog import CATALOG, Placement
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import RequestLimits
from tpu_demo.launch.chips import chip_count
from tpu_demo.web.admission import AdmissionLimits

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


_known_model.choices = tuple(CATALOG)  # type: ignore[attr-defined]
_model_list.choices = tuple(CATALOG)  # type: ignore[attr-defined]


def _buckets(text: str) -> tuple[Bucket, ...]:
    try:
        return parse_bucket_list(text)
    except BucketError as error:
        raise ValueError(str(error)) from None


def _batch_size(text: str) -> int:
    """A batch size, or ``auto`` (0): each model's own from the catalog."""
    value = 0 if text.strip().lower() == "auto" else int(text)
    if value not in (0, *BATCH_SIZES):
        raise ValueError(f"must be auto or one of: {', '.join(map(str, BATCH_SIZES))}")
    return value


_batch_size.choices = ("auto", *map(str, BATCH_SIZES))  # type: ignore[attr-defined]


def _choice(values: Sequence[str]) -> Callable[[str], str]:
    """A parser of one of ``values``; ``--help`` lists them (read from ``parse.choices``)."""
    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(f"must be one of: {', '.join(values)}")
        return text

    parse.choices = tuple(values)  # type: ignore[attr-defined]
    return parse


def flag(default: Any, description: str, parse: Callable[[str], Any] | None = str,
         also_env: tuple[str, ...] = ()) -> Any:
    """One flag, declared once: its default, help and parser (None: an on/off switch).

    The flag name is the field's (``memory_budget`` -> ``--memory-budget``), the environment
    twin ``TPU_DEMO_`` + the upper-cased name; ``also_env`` are further variables read after it.
    """
    return field(default=default, metadata={"help": description, "parse": parse, "also_env": also_env})


@dataclass(frozen=True)
class AppConfig:
    """Every setting of the app; ``python app.py --help`` is generated from these fields."""

    host: str = flag("127.0.0.1", "address to listen on (0.0.0.0 to serve the network)",
                     also_env=("GRADIO_SERVER_NAME",))
    port: int = flag(7860, "port to listen on (0 = pick a free one)", _port, also_env=("GRADIO_SERVER_PORT",))
    model: str | None = flag(None, "model selected at start (default: the embedded default when offered)", _known_model)
    models: tuple[str, ...] | None = flag(None, "comma-separated model ids offered to users "
                                                "(default: the tiny models plus real ones present locally)", _model_list)
    buckets: tuple[Bucket, ...] | None = flag(None, "resolution buckets of the start model, e.g. 64x64,128x96", _buckets)
    mode: str = flag(ExecutionMode.EAGER.value, "execution mode at start", _choice([m.value for m in ExecutionMode]))
    placement: str | None = flag(None, "force a placement instead of choosing by size",
                                 _choice([p.value for p in Placement]))
    memory_budget: float | None = flag(None, "GB of weights that may stay loaded together when switching models",
                                       _positive_float)
    compile_backend: str = flag("inductor", "torch.compile backend off TPU (TPU always uses torch-tpu's 'tpu')",
                                _choice(["inductor", "aot_eager", "eager"]))
    cache_dir: Path | None = flag(None, "where built tiny models and compile caches live (default ~/.cache/tpu-demo)",
                                  Path)
    threads: int | None = flag(None, "torch CPU threads (default: torch's choice)", _positive_int)
    device: str | None = flag(None, "use only this device; tpu or cuda exits with an error naming the reason when "
                              "it does not start, never serving on another (default: tpu, then cuda, then cpu)",
                              _choice(["tpu", "cuda", "cpu"]))
    preview_every: int = flag(1, "stream a latent preview every N denoising steps (0: off)", _non_negative_int)
    preview_seconds: float = flag(0.25, "and at most one preview per this many seconds, counted from the image's "
                                  "start: a faster image shows none (0: no time limit)", _non_negative_float)
    max_batch: int = flag(0, "most images per pipeline call: images of one shape (model, mode, bucket, steps, "
                          "guidance) that wait while the device is busy share the next call, at a warm static "
                          "batch size 1, 2 or 4 up to this; a lone image never waits. Each size is warmed like "
                          "a bucket. auto (0): each model's largest that fits its chip (catalog); 1: no "
                          "batching", _batch_size)
    queue_poll_seconds: float = flag(0.01, "how often Gradio's queue looks for a free worker (Gradio's default "
                                     "0.001 wakes the server 1000 times a second, taking the GIL from the device "
                                     "thread)", _positive_float)
    max_queue: int = flag(AdmissionLimits.max_waiting, "requests that may wait in the queue; more are told the "
                                                       "app is busy", _positive_int)
    max_images: int = flag(RequestLimits.max_images, "most images one request may ask for", _positive_int)
    max_prompt_chars: int = flag(RequestLimits.max_prompt_chars, "longest prompt accepted", _positive_int)
    max_per_session: int = flag(AdmissionLimits.max_per_session, "requests one browser session / API client may "
                                "have waiting or running (0: no limit)", _non_negative_int)
    max_per_ip: int = flag(AdmissionLimits.max_per_ip, "requests one client address may have waiting or running "
                           "(0: no limit)", _non_negative_int)
    request_timeout: float = flag(300.0, "seconds a request may run from its first denoising step before it is "
                                  "stopped (0: no limit)", _non_negative_float)
    log_prompts: bool = flag(False, "include prompts in the per-request log lines", None)
    no_warmup: bool = flag(False, "do not warm the buckets at start-up", None)
    warm: str = flag("start", "what start-up warms before /ready says ready: the start model's buckets in the start "
                     "mode, or every offered model in every mode (Compare modes included), one model at a time, "
                     "into the compile cache (then the start model stays loaded)", _choice(["start", "all"]))
    no_mcp: bool = flag(False, "do not serve Gradio's MCP server (on by default: streamable HTTP at /gradio_api/mcp/, "
                        "the tools generate_images, compare_execution_modes and list_models under the same limits "
                        "as the page)", None)
    share: bool = flag(False, "create a public gradio.live link (contacts Gradio's share servers)", None)
    chips: str | None = flag(None, "put every chip of this host to work: 'all' (each TPU chip) or a number N; one "
                             "engine per chip behind nginx on --host/--port when every offered model fits one chip, "
                             "else one tensor-parallel group over them (docs/scaling.md#every-chip-of-one-host); "
                             "off TPU, N engines on loopback", chip_count)
    check: bool = flag(False, "check this host and exit, loading no weights: device, chips and HBM, torch / "
                       "torch-tpu / libtpu versions, each offered model's placement and whether its weights are "
                       "complete, disk free, a pinning probe per chip, the processes and ports the command (with "
                       "--chips) would start; exit 1 naming every problem", None)
    tensor_parallel: bool = flag(False, "one rank of a tensor-parallel group started by torchrun "
                                 "(use scripts/serve_tp.sh N); rank 0 serves the UI", None)
    tp_timeout: float = flag(60.0, "seconds a tensor-parallel rank may lag beyond the expected step time before "
                             "rank 0 reports the group failed", _positive_float)

    @property
    def resolved_cache_dir(self) -> Path:
        return self.cache_dir or _default_cache_dir()

    @property
    def start_mode(self) -> ExecutionMode:
        return ExecutionMode(self.mode)


def _flags() -> list[tuple[str, str, Any, Callable[[str], Any] | None, str]]:
    """(field name, --flag, default, parser, help) for every AppConfig field."""
    return [(f.name, "--" + f.name.replace("_", "-"), f.default, f.metadata["parse"], f.metadata["help"])
            for f in fields(AppConfig)]


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def env_names(field_name: str) -> tuple[str, ...]:
    """Every environment variable of a flag, in the order they are read."""
    return (env_name(field_name), *next(f.metadata["also_env"] for f in fields(AppConfig) if f.name == field_name))


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # noqa: D401 - argparse hook
        self.exit(2, f"{self.prog}: error: {message}\n")


def help_text(width: int = 100) -> str:
    """``python app.py --help`` at a fixed width (docs/flags.md is this text)."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)  # argparse reads the terminal width from here
    try:
        return _parser().format_help()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="app.py", description="TPU diffusion demo (Gradio). Every flag has an "
                            "environment twin, shown in brackets; the command line wins.")
    for name, option, default, parse, description in _flags():
        if parse is None:
            parser.add_argument(option, action="store_true", help=f"{description} [{', '.join(env_names(name))}]")
        else:
            shown = "" if default is None else f"; default {default}"
            choices = getattr(parse, "choices", None)  # enumerated flags list their values
            listed = f"; {'from' if parse is _model_list else 'one of'}: {', '.join(choices)}" if choices else ""
            parser.add_argument(option, type=_named(parse, option), default=None,
                                metavar=option.lstrip("-").replace("-", "_").upper(),
                                help=f"{description} [{', '.join(env_names(name))}{listed}{shown}]")
    return parser


def _named(parse: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    def wrapper(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, TypeError) as error:
            raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None

    wrapper.__name__ = flag
    return wrapper


#: what a switch's environment twin may say
SWITCH_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _switch(raw: str) -> bool:
    try:
        return SWITCH_WORDS[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"a switch is one of {', '.join(SWITCH_WORDS)}") from None


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> AppConfig:
    """Parse flags, falling back to ``TPU_DEMO_*`` variables, then defaults; exit 2 on bad values."""
    environ = os.environ if environ is None else environ
    args = vars(_parser().parse_args(argv))
    values: dict[str, Any] = {}
    for name, option, default, parse, _ in _flags():
        env = next((candidate for candidate in env_names(name) if environ.get(candidate, "") != ""), env_name(name))
        if args[name] is not None and args[name] is not False:
            values[name] = args[name]
        elif environ.get(env, "") != "":
            raw = environ[env]
            try:
                values[name] = (parse or _switch)(raw)
            except (ValueError, TypeError) as error:
                sys.stderr.write(f"app.py: error: {env} ({option}) {raw!r}: {error}\n")
                raise SystemExit(2) from None
    return AppConfig(**values)
