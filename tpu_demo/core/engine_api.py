"""What the web layer may ask of the engine, as protocols the Engine satisfies.

The web layer names these, never an engine module (not even for type hints): launch/ hands it the
Engine (and the ``--warm all`` run), and the web layer can only reach what is listed here.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, Mapping, Protocol

from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.events import BucketStatus, EngineStatus, ShapeKey
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.recent import RecentRuns
from tpu_demo.core.request import GenerationRequest


class DeviceView(Protocol):
    """The device the engine runs on, as the page shows it."""

    kind: str
    count: int
    name: str

    @property
    def badge(self) -> str: ...


class EngineAPI(Protocol):
    """The engine's public calls the page, the API and the health routes make."""

    device: DeviceView
    specs: Mapping[str, ModelSpec]
    #: warm runs of recent requests and comparisons: the speed chart
    recent: RecentRuns

    @property
    def max_batch(self) -> int: ...

    def batch_sizes_for(self, model_id: str) -> tuple[int, ...]: ...

    def spec(self, model_id: str) -> ModelSpec: ...

    def status(self) -> EngineStatus: ...

    def placement_description(self, model_id: str) -> str: ...

    def mode_description(self, mode: ExecutionMode) -> str: ...

    def style_refusal(self, model_id: str) -> str | None: ...

    def configured_shapes(self, model_id: str, mode: ExecutionMode) -> list[ShapeKey]: ...

    def buckets_for(self, model_id: str, mode: ExecutionMode) -> list[BucketStatus]: ...

    def warmup_in_background(self, model_id: str, mode: ExecutionMode, buckets: Any = None,
                             may_evict: bool = True) -> threading.Thread: ...

    def generate(self, request: GenerationRequest, stop: threading.Event | None = None) -> Iterator[Any]: ...

    def compare_modes(self, request: GenerationRequest, stop: threading.Event | None = None) -> Iterator[Any]: ...

    def about(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class WarmAllProgress(Protocol):
    """A ``--warm all`` run as readiness reads it."""

    finished: threading.Event
    current: str | None
    current_mode: ExecutionMode | None

    def progress(self) -> str: ...

    def failures(self) -> list[str]: ...
