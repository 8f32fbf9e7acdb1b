"""Tensor parallelism over chips: one process per chip (torchrun), models sharded over a DeviceMesh.

Each rank reads only its slice of each sharded weight (the transformer, and a text encoder with a
tensor-parallel plan); every other component is whole on the rank's own device. Model collectives use the
device's backend ("tpu_dist", gloo or nccl); lockstep messages and the stop flag use a gloo control
group on every device.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from tpu_demo.core.catalog import ModelSpec
from tpu_demo.device import DeviceInfo, device_mesh, distributed_backend
from tpu_demo.models.loading import ModelUnavailable, hub_weights_present, model_dtype, resolve_source, unavailable_message

log = logging.getLogger("tpu_demo.tensor_parallel")

#: Followers wait this long for rank 0's next call: an idle demo is not a failure.
_FOLLOWER_IDLE_TIMEOUT = timedelta(days=365)


@dataclass(frozen=True)
class TensorParallelWorld:
    """This process's place in the tensor-parallel group."""

    rank: int
    world_size: int
    local_rank: int
    device: DeviceInfo
    mesh: DeviceMesh
    #: gloo group for lockstep messages and the stop flag
    control_group: Any
    timeout_seconds: float

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def local_device(self) -> str:
        """This rank's own device: "tpu" (torch-tpu gives each process its chip), "cuda:<local rank>" or "cpu"."""
        return f"cuda:{self.local_rank}" if self.device.kind == "cuda" else self.device.kind


def init_tensor_parallel(device: DeviceInfo, timeout_seconds: float) -> TensorParallelWorld:
    """Join the torchrun group (env:// rendezvous) and build the mesh over every rank.

    ``timeout_seconds`` bounds every collective of the compute group and rank 0's side of the
    control group, so a rank that stops answering becomes an error on rank 0, not a hang.
    """
    timeout = timedelta(seconds=timeout_seconds)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.kind == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=distributed_backend(device), timeout=timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = device_mesh(device, list(range(world_size)))
    # Each rank sets its own wait limit on the control group: rank 0 gives up on a silent
    # follower after the timeout; followers wait for the next request as long as it takes.
    control_group = dist.new_group(backend="gloo", timeout=timeout if rank == 0 else _FOLLOWER_IDLE_TIMEOUT)
    log.info("rank %d/%d joined the %s group on %s", rank, world_size, distributed_backend(device), device.kind)
    device = replace(device, tensor_parallel_ranks=world_size)  # the header says "x N, tensor parallel"
    return TensorParallelWorld(rank, world_size, local_rank, device, mesh, control_group, timeout_seconds)


def _source_on_every_rank(spec: ModelSpec, world: TensorParallelWorld, models_dir: Path) -> str:
    """Resolve the model's source; rank 0 builds a tiny model first so ranks never write the same files."""
    source = resolve_source(spec, models_dir) if world.is_leader else None
    dist.barrier(group=world.control_group)
    if source is None:
        source = resolve_source(spec, models_dir)
    if not os.path.isdir(source) and not hub_weights_present(spec):
        raise ModelUnavailable(unavailable_message(spec))
    return source


def _has_transformers_tp_plan(source: str, subfolder: str) -> bool:
    """True when transformers knows how to shard this text encoder (its config carries a TP plan)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, subfolder=subfolder, local_files_only=True)
    text_config = getattr(config, "text_config", None)
    return bool(getattr(config, "base_model_tp_plan", None) or getattr(text_config, "base_model_tp_plan", None))


def load_tensor_parallel_pipeline(spec: ModelSpec, world: TensorParallelWorld, models_dir: Path) -> Any:
    """Load ``spec`` sharded over ``world`` (collective: every rank must call it, in the same order)."""
    import diffusers
    import transformers
    from diffusers import DiffusionPipeline, TensorParallelConfig
    from transformers import DistributedConfig

    source = _source_on_every_rank(spec, world, models_dir)
    dtype = model_dtype(spec, world.device)
    common = dict(dtype=dtype, use_safetensors=True, local_files_only=True)
    index = DiffusionPipeline.load_config(source, local_files_only=True)
    sharded: dict[str, Any] = {}

    # diffusers refuses a "cpu" mesh; the CPU path (tests, no chips) goes through the shim.
    allow_cpu = contextlib.nullcontext()
    if world.device.kind == "cpu":
        from tpu_demo.distributed.cpu_tp_shim import cpu_tensor_parallel_allowed

        allow_cpu = cpu_tensor_parallel_allowed()
    transformer_class = getattr(diffusers, index["transformer"][1])
    with allow_cpu:
        sharded["transformer"] = transformer_class.from_pretrained(
            source, subfolder="transformer", parallel_config=TensorParallelConfig(mesh=world.mesh), **common)

    for name, entry in index.items():
        if not name.startswith("text_encoder") or not isinstance(entry, list) or entry[0] != "transformers":
            continue
        if _has_transformers_tp_plan(source, name):
            # transformers 5.x builds its mesh from the DistributedConfig over the same ranks;
            # device_mesh is passed as the source document does.
            encoder_class = getattr(transformers, entry[1])
            sharded[name] = encoder_class.from_pretrained(
                source, subfolder=name, distributed_config=DistributedConfig(tp_plan="auto"),
                device_mesh=world.mesh, **common)

    pipeline = getattr(diffusers, spec.pipeline_class).from_pretrained(source, **common, **sharded)
    for name, component in pipeline.components.items():
        if isinstance(component, torch.nn.Module) and name not in sharded:
            component.to(world.local_device)  # VAE and unsharded encoders: whole on this rank's chip
    pipeline.set_progress_bar_config(disable=True)
    log.info("rank %d loaded %s: sharded %s over %d ranks", world.rank, spec.id, ", ".join(sharded), world.world_size)
    return pipeline
