"""Wire the app together: config -> device -> engine -> Blocks -> launch."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import gradio as gr
import torch

from .catalog import REAL_MODEL_IDS, TINY_MODEL_IDS, CATALOG, Placement
from .compile_cache import use_compile_cache
from .config import AppConfig, parse_config
from .device import detect_device
from .engine import Engine, EngineConfig
from .loading import hub_weights_present
from .modes import ExecutionMode
from .request import RequestLimits
from .ui import DemoUI, UiSettings, launch_kwargs

log = logging.getLogger("tpu_demo")


@dataclass
class App:
    config: AppConfig
    engine: Engine
    ui: DemoUI
    demo: gr.Blocks


def offered_models(config: AppConfig) -> tuple[str, ...]:
    """The operator's list, else the tiny models plus the real ones whose weights are present."""
    if config.models:
        return config.models
    return TINY_MODEL_IDS + tuple(m for m in REAL_MODEL_IDS if hub_weights_present(CATALOG[m]))


def build_app(config: AppConfig) -> App:
    """Everything but the network listener; warmup of the start model starts in the background."""
    use_compile_cache(config.resolved_cache_dir)  # before the first compile (app.py also sets it before torch)
    if config.threads:
        torch.set_num_threads(config.threads)
    device = detect_device(config.device)
    models = offered_models(config)
    start_model = config.model or models[0]
    if start_model not in models:
        models = (start_model,) + models
    engine = Engine(EngineConfig(
        models_dir=config.resolved_cache_dir / "models",
        cpu_compile_backend=config.compile_backend,
        offered_models=models,
        bucket_overrides={start_model: config.buckets} if config.buckets else {},
        placement_override=Placement(config.placement) if config.placement else None,
        memory_budget_gb=config.memory_budget,
        preview_every=config.preview_every,
    ), device)
    settings = UiSettings(start_model=start_model, start_mode=config.start_mode, limits=RequestLimits(
        max_prompt_chars=config.max_prompt_chars, max_images=config.max_images, offered_models=models,
        offered_modes=tuple(ExecutionMode)))
    ui = DemoUI(engine, settings)
    demo = ui.build()
    demo.queue(max_size=config.max_queue, default_concurrency_limit=1)
    if not config.no_warmup:
        engine.warmup_in_background(start_model, config.start_mode)
    log.info("serving %s on %s; models: %s", start_model, device.badge, ", ".join(models))
    return App(config, engine, ui, demo)


def launch(app: App, **kwargs) -> None:
    """Start the HTTP server; blocks unless ``prevent_thread_lock=True`` is passed."""
    app.demo.launch(server_name=app.config.host, server_port=app.config.port or None, share=app.config.share,
                    show_error=False, **launch_kwargs(), **kwargs)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up probes
    config = parse_config(argv)
    launch(build_app(config))
