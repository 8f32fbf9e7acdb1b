"""A recording stand-in for the torch-tpu surface the app uses. Tests only; never the product.

Nobody here has a TPU, so the TPU branches of ``tpu_demo.device`` (and what they make the rest
of the app do) would otherwise never run before a first TPU VM. The stand-in makes this host
look like a TPU host to exactly the calls the app makes, records every one of them, and
carries the work out on the CPU so real pipelines still produce real images:

- chip detection: torch-tpu's own PCI scanner (``torch_tpu._internal.utils.hardware``) reports
  ``chips`` chips of ``name`` with ``hbm_bytes`` each; ``torch_tpu._loader.load`` is recorded, with
  the libtpu variables that pin a process to chips as they are at that moment (libtpu reads them
  when the runtime starts), and makes ``torch.accelerator`` report a "tpu" accelerator
  (``ready=False`` keeps it refused) with the chips ``TPU_VISIBLE_CHIPS`` leaves visible;
- eager modes: ``torch.tpu.EagerMode`` is torch-tpu's real enum; ``torch.tpu.set_eager_mode``
  records entering and leaving and calls the real context manager in between;
- compiled mode: ``torch.compile`` records (target, backend, fullgraph, dynamic); the dynamo
  backend named "tpu" records each graph and runs it with ``aot_eager`` (torch-tpu's real
  backend refuses CPU tensors);
- tensor parallel: ``init_process_group(backend="tpu_dist")`` is recorded and joins with gloo;
  ``DeviceMesh("tpu", ranks)`` is recorded and built on "cpu"; every ``from_pretrained`` records
  the ``parallel_config`` / ``distributed_config`` / ``device_mesh`` it received;
- placement: ``pipeline.to("tpu")``, ``module.to("tpu")`` and ``enable_model_cpu_offload(...)``
  are recorded; the chip is host memory, so they move nothing.

Names are checked against the installed torch-tpu: if it renamed ``EagerMode`` or the hardware
functions, installing the stand-in fails.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch


@dataclass
class Call:
    """One recorded call: ``what`` names it the way the product spells it."""

    what: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


class TpuStandIn:
    """Install with ``install(monkeypatch)``; read ``calls`` / ``named(what)`` afterwards."""

    def __init__(self, chips: int = 4, name: str = "TPU v6e", hbm_bytes: int = 32 * 10**9, ready: bool = True):
        self.chips, self.name, self.hbm_bytes, self.ready = chips, name, hbm_bytes, ready
        self.calls: list[Call] = []
        self.loaded = False
        self.meshes: list[Any] = []

    # ---- reading the record ---------------------------------------------------------------
    def record(self, what: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append(Call(what, args, kwargs))

    def named(self, what: str) -> list[Call]:
        return [call for call in self.calls if call.what == what]

    def names(self) -> list[str]:
        return [call.what for call in self.calls]

    def clear(self) -> None:
        self.calls.clear()

    def visible_chips(self) -> int:
        """What libtpu would show this process: the chips ``TPU_VISIBLE_CHIPS`` lists, else all."""
        listed = [c for c in os.environ.get("TPU_VISIBLE_CHIPS", "").split(",") if c.strip()]
        return len(listed) if listed else self.chips

    # ---- installing -----------------------------------------------------------------------
    def install(self, monkeypatch) -> "TpuStandIn":
        self._install_hardware(monkeypatch)
        self._install_eager_mode(monkeypatch)
        self._install_compile(monkeypatch)
        self._install_distributed(monkeypatch)
        self._install_placement(monkeypatch)
        return self

    def _install_hardware(self, monkeypatch) -> None:
        import torch_tpu._loader
        from torch_tpu._internal.utils import hardware

        for function, value in (("get_tpu_device_count", self.chips), ("get_tpu_device_name", self.name),
                                ("get_hbm_bytes_per_device", self.hbm_bytes)):
            assert callable(getattr(hardware, function)), f"torch-tpu no longer has hardware.{function}"
            monkeypatch.setattr(hardware, function, self._recorder(f"hardware.{function}", lambda v=value: v))

        def load() -> None:
            from tpu_demo.device import LIBTPU_PIN_VARIABLES

            self.record("torch_tpu._loader.load", libtpu_env={name: os.environ[name] for name in LIBTPU_PIN_VARIABLES
                                                              if name in os.environ})
            self.loaded = self.ready

        assert callable(torch_tpu._loader.load)
        monkeypatch.setattr(torch_tpu._loader, "load", load)
        accelerator = SimpleNamespace(type="tpu")
        real_count = torch.accelerator.device_count
        real_current = torch.accelerator.current_accelerator

        def current_accelerator(*args, **kwargs):
            # The app's detection sees the "tpu" accelerator; torch's own internals (dynamo asks
            # for the autocast device type) keep seeing the host that really runs the work.
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if self.loaded and caller.startswith("tpu_demo."):
                return accelerator
            return real_current(*args, **kwargs)

        monkeypatch.setattr(torch.accelerator, "current_accelerator", current_accelerator)
        monkeypatch.setattr(torch.accelerator, "device_count",
                            lambda: self.visible_chips() if self.loaded else real_count())
        monkeypatch.setattr(torch.accelerator, "synchronize", self._recorder("torch.accelerator.synchronize"))
        monkeypatch.setattr(torch.accelerator, "empty_cache", self._recorder("torch.accelerator.empty_cache"))

    def _install_eager_mode(self, monkeypatch) -> None:
        from torch_tpu._internal.execution_mode import EagerMode, set_eager_mode

        real_set_eager_mode = set_eager_mode

        @contextlib.contextmanager
        def recording_set_eager_mode(mode):
            self.record("set_eager_mode.enter", mode)
            try:
                with real_set_eager_mode(mode):  # the real one: proves the argument is one it accepts
                    yield
            finally:
                self.record("set_eager_mode.exit", mode)

        monkeypatch.setattr(torch, "tpu", SimpleNamespace(EagerMode=EagerMode, set_eager_mode=recording_set_eager_mode),
                            raising=False)

    def _install_compile(self, monkeypatch) -> None:
        from torch._dynamo.backends import registry

        real_compile = torch.compile

        def recording_compile(model=None, **kwargs):
            target = getattr(model, "__self__", model)  # nn.Module.compile passes its bound _call_impl
            backend = kwargs.get("backend")
            backend_name = backend if isinstance(backend, str) else getattr(backend, "backend", backend)
            self.record("torch.compile", type(target).__name__, backend=backend_name,
                        fullgraph=kwargs.get("fullgraph"), dynamic=kwargs.get("dynamic"))
            return real_compile(model, **kwargs)

        aot_eager = registry.lookup_backend("aot_eager")

        def tpu_backend(graph_module, example_inputs, **kwargs):
            self.record("backend.tpu.graph")
            return aot_eager(graph_module, example_inputs, **kwargs)

        monkeypatch.setattr(torch, "compile", recording_compile)
        registry._lazy_import()
        monkeypatch.setitem(registry._COMPILER_FNS, "tpu", tpu_backend)
        monkeypatch.setitem(registry._BACKENDS, "tpu", None)

    def _install_distributed(self, monkeypatch) -> None:
        import torch.distributed as dist
        import torch.distributed.device_mesh as device_mesh_module
        from diffusers.hooks import tensor_parallel as tp_hooks
        from diffusers.models.modeling_utils import ModelMixin
        from transformers import PreTrainedModel

        real_init = dist.init_process_group
        real_mesh = device_mesh_module.DeviceMesh

        def init_process_group(backend=None, **kwargs):
            self.record("init_process_group", backend=backend)
            return real_init(backend="gloo" if backend == "tpu_dist" else backend, **kwargs)

        standin = self

        class device_mesh(real_mesh):  # a subclass: annotations and isinstance checks keep working
            def __init__(self, device_type, mesh, *args, **kwargs):
                standin.record("DeviceMesh", device_type, list(mesh))
                super().__init__("cpu" if device_type == "tpu" else device_type, mesh, *args, **kwargs)
                standin.meshes.append(self)

        monkeypatch.setattr(dist, "init_process_group", init_process_group)
        monkeypatch.setattr(device_mesh_module, "DeviceMesh", device_mesh)
        # the stand-in's "tpu" mesh is a CPU mesh: let diffusers shard on it
        monkeypatch.setattr(tp_hooks, "_SUPPORTED_TP_DEVICES", tuple(tp_hooks._SUPPORTED_TP_DEVICES) + ("cpu",))
        for base, label in ((ModelMixin, "diffusers"), (PreTrainedModel, "transformers")):
            real = base.from_pretrained.__func__

            def from_pretrained(cls, *args, _real=real, _label=label, **kwargs):
                recorded = {k: kwargs[k] for k in ("parallel_config", "distributed_config", "device_mesh", "subfolder")
                            if k in kwargs}
                self.record(f"{_label}.from_pretrained", cls.__name__, **recorded)
                return _real(cls, *args, **kwargs)

            monkeypatch.setattr(base, "from_pretrained", classmethod(from_pretrained))

    def _install_placement(self, monkeypatch) -> None:
        from diffusers import DiffusionPipeline

        real_pipeline_to = DiffusionPipeline.to
        real_module_to = torch.nn.Module.to
        real_offload = DiffusionPipeline.enable_model_cpu_offload

        def on_host(value):
            return "cpu" if value == "tpu" else value

        def pipeline_to(pipeline, *args, **kwargs):
            if "tpu" in args or kwargs.get("device") == "tpu":
                self.record("pipeline.to", *args, **kwargs)
            return real_pipeline_to(pipeline, *(on_host(a) for a in args),
                                    **{k: on_host(v) for k, v in kwargs.items()})

        def module_to(module, *args, **kwargs):
            if "tpu" in args or kwargs.get("device") == "tpu":
                self.record("module.to", type(module).__name__, "tpu")
            return real_module_to(module, *(on_host(a) for a in args), **{k: on_host(v) for k, v in kwargs.items()})

        def enable_model_cpu_offload(pipeline, *args, **kwargs):
            self.record("enable_model_cpu_offload", *args, **kwargs)
            # diffusers finds the "tpu" accelerator through torch.accelerator on a TPU host; here the chip is the host
            return real_offload(pipeline, device=on_host(kwargs.pop("device", None) or "cpu"))

        monkeypatch.setattr(DiffusionPipeline, "to", pipeline_to)
        monkeypatch.setattr(torch.nn.Module, "to", module_to)
        monkeypatch.setattr(DiffusionPipeline, "enable_model_cpu_offload", enable_model_cpu_offload)

    def _recorder(self, what: str, result=lambda *a, **k: None):
        @functools.wraps(result)
        def recorded(*args, **kwargs):
            self.record(what, *args, **kwargs)
            return result(*args, **kwargs)

        return recorded
