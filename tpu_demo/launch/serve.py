"""Wire the app together: config -> device -> engine -> Blocks -> launch."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import gradio as gr
import torch
from starlette.middleware import Middleware

from tpu_demo.web import gradio_internals
from tpu_demo.web.admission import AdmissionLimits
from tpu_demo.web.guard import Guard, event_table
from tpu_demo.web.api import TOOLS
from tpu_demo.core.catalog import Placement
from tpu_demo.engine.compile_cache import use_compile_cache
from tpu_demo.launch.config import AppConfig
from tpu_demo.launch.offer import offered_models, start_model
from tpu_demo.device import DeviceInfo, detect_device
from tpu_demo.engine.engine import Engine, EngineConfig
from tpu_demo.engine.warm_all import WarmAll
from tpu_demo.web.health import health_routes
from tpu_demo.core.readiness import ReadinessCheck
from tpu_demo.distributed.lockstep import Lockstep
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import RequestLimits
from tpu_demo.launch.shutdown import stop_on_sigterm
from tpu_demo.web.runs import Runs, SupervisionSettings
from tpu_demo.web.handlers import PageHandlers, UiSettings
from tpu_demo.web.history import SessionHistory
from tpu_demo.web.page import GUARDED_APIS, build_page, launch_kwargs

log = logging.getLogger("tpu_demo")

#: uploads are only PNGs dropped to restore settings
MAX_UPLOAD = "20mb"


@dataclass
class App:
    config: AppConfig
    engine: Engine
    ui: PageHandlers
    demo: gr.Blocks
    readiness: ReadinessCheck
    #: each browser session's earlier results (files freed when its tab closes)
    history: SessionHistory | None = None
    #: ``--warm all``: every offered model's warmup, in order (None: only the start model's)
    warm_all: WarmAll | None = None


def build_engine(config: AppConfig, device: DeviceInfo, lockstep: Lockstep | None = None) -> Engine:
    """The engine for ``config``; in a tensor-parallel run every rank builds the same one."""
    use_compile_cache(config.resolved_cache_dir)  # before the first compile (app.py also sets it before torch)
    models = offered_models(config)
    if not models or (config.model and config.model not in models):
        raise SystemExit(f"app.py: error: --model/--models: {config.model or 'none of the offered models'} "
                         "cannot be served tensor-parallel")
    first = start_model(config, models)
    return Engine(EngineConfig(
        models_dir=config.resolved_cache_dir / "models",
        cpu_compile_backend=config.compile_backend,
        offered_models=models,
        bucket_overrides={first: config.buckets} if config.buckets else {},
        placement_override=Placement(config.placement) if config.placement else None,
        memory_budget_gb=config.memory_budget,
        preview_every=config.preview_every,
        preview_seconds=config.preview_seconds,
        max_batch=config.max_batch,
    ), device, lockstep)


def generate_concurrency(max_batch: int) -> int:
    """Generate handlers that may run at once. The device thread alone serialises device work, so
    more handlers than calls: while one batch runs, the next one's requests are validated and
    waiting, and finished ones are encoded and streamed (admission still bounds the waiting)."""
    return max(4, 2 * max_batch)


def build_app(config: AppConfig, lockstep: Lockstep | None = None) -> App:
    """Everything but the network listener; warmup of the start model starts in the background."""
    if config.threads:
        torch.set_num_threads(config.threads)
    device = lockstep.world.device if lockstep is not None else detect_device(config.device)
    engine = build_engine(config, device, lockstep)
    models = tuple(engine.specs)
    first = start_model(config, models)
    settings = UiSettings(start_model=first, start_mode=config.start_mode, limits=RequestLimits(
        max_prompt_chars=config.max_prompt_chars, max_images=config.max_images, offered_models=models,
        offered_modes=tuple(ExecutionMode)), generate_concurrency=generate_concurrency(engine.max_batch))
    runs = Runs(AdmissionLimits(max_waiting=config.max_queue, max_per_session=config.max_per_session,
                                max_per_ip=config.max_per_ip),
                SupervisionSettings(request_timeout=config.request_timeout or None, log_prompts=config.log_prompts))
    ui = PageHandlers(engine, settings, runs)
    history = SessionHistory()
    demo = build_page(ui, history)
    # the queue's bound is the guard's (web/guard.py): Gradio's own max_size would refuse Stop too.
    # api_open=False closes POST /run/<api> and /api/<api> of queued events, which would call the handler
    # beside the queue: the page's generations are reached through the queue only.
    gradio_internals.limit_queue_analytics()
    demo.queue(max_size=None, default_concurrency_limit=1, api_open=False)
    gradio_internals.check_gradio_internals(demo)  # stops here, naming it, if an upgrade removed one
    gradio_internals.set_queue_polling(demo, config.queue_poll_seconds)
    warm_all = None
    if not config.no_warmup and config.warm == "all":
        # every model in every mode the page offers (Compare modes runs all three), the start model and mode last
        warm_all = WarmAll(engine, models, first, config.start_mode, settings.limits.offered_modes)
        warm_all.start()
    elif not config.no_warmup:
        engine.warmup_in_background(first, config.start_mode)
    log.info("serving %s on %s; models: %s", first, device.badge, ", ".join(models))
    readiness = ReadinessCheck(engine, first, config.start_mode, warmup=not config.no_warmup,
                               draining=lambda: runs.shutting_down, warm_all=warm_all)
    return App(config, engine, ui, demo, readiness, history, warm_all)


def launch(app: App, **kwargs) -> None:
    """Start the HTTP server; blocks unless ``prevent_thread_lock=True`` is passed."""
    app.demo.launch(server_name=app.config.host, server_port=app.config.port or None, share=app.config.share,
                    show_error=False, max_file_size=MAX_UPLOAD, app_kwargs=hardening_app_kwargs(app),
                    mcp_server=not app.config.no_mcp, **launch_kwargs(), **kwargs)


def hardening_app_kwargs(app: App) -> dict:
    """The health and readiness routes and the one guard in front of every other route, handed to
    Gradio's FastAPI app."""
    table: list = []

    def events() -> tuple:  # the page's handlers, read once from its public config
        if not table:
            table.append(event_table(app.demo))
        return table[0]

    return {
        "routes": health_routes(app.engine, app.ui.runs.waiting, app.ui.runs.active, app.readiness,
                                lambda: app.warm_all.summary() if app.warm_all is not None else None),
        "middleware": [Middleware(Guard, runs=app.ui.runs, guarded=GUARDED_APIS, events=events, tools=TOOLS,
                                  input_schema=lambda tool: gradio_internals.mcp_input_schema(app.demo, tool))],
    }


def serve(config: AppConfig) -> None:
    """Serve one process until SIGTERM or Ctrl-C."""
    app = build_app(config)
    with stop_on_sigterm(app.ui.runs, app.engine):
        launch(app)
