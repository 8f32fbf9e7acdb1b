"""The TPU branches, run for real under a recording stand-in of torch-tpu (tests/tpu_standin.py).

One test per case of the source document (diffusers' Google TPU page; docs/tpu-guide.md) asserts the exact calls
a TPU run makes, on real tiny pipelines that produce real images on the CPU: eager with CPU
offload (FLUX.1-schnell), optimized eager, compiled whole (SD3.5 Medium), compiled under offload
(repeated blocks), tensor parallelism (FLUX.2-dev) and the compile-cache environment. The
product code is unchanged by the stand-in; only torch-tpu's surface is replaced.
"""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from conftest import engine_images, free_port, request_fields
from tpu_standin import TpuStandIn

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def tpu(monkeypatch):
    """This host as a 4-chip TPU v6e host, every torch-tpu call recorded."""
    return TpuStandIn(chips=4, name="TPU v6e", hbm_bytes=32 * 10**9).install(monkeypatch)


@pytest.fixture
def tpu_engine(tpu, models_dir):
    from tpu_demo.device import detect_device
    from tpu_demo.engine.engine import Engine, EngineConfig

    engines = []

    def make(**overrides):
        device = detect_device()
        assert device.kind == "tpu"
        engine = Engine(EngineConfig(models_dir=models_dir, **overrides), device)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def eager_modes(tpu):
    """(enter|exit, mode name) in order."""
    return [(call.what.split(".")[1], call.args[0].name) for call in tpu.calls if call.what.startswith("set_eager_mode")]


def compiles(tpu):
    return [(call.args[0], call.kwargs) for call in tpu.named("torch.compile")]


# ---- detection ----------------------------------------------------------------------------

def test_detection_picks_the_tpu_when_torch_tpu_reports_chips(tpu):
    from tpu_demo.device import compile_backend_name, describe_mode, detect_device, distributed_backend
    from tpu_demo.core.modes import ExecutionMode

    device = detect_device()
    assert (device.kind, device.count, device.name, device.memory_bytes_per_device) == ("tpu", 4, "TPU v6e", 32 * 10**9)
    # one process computes on one chip: never "x 4" for it (docs/scaling.md#every-chip-of-one-host)
    assert device.badge == "TPU v6e \u00b7 chip 1 of 4"
    # the chips were counted by torch-tpu's scanner before its runtime was loaded
    assert tpu.names().index("hardware.get_tpu_device_count") < tpu.names().index("torch_tpu._loader.load")
    assert compile_backend_name(device, "inductor") == "tpu"
    assert distributed_backend(device) == "tpu_dist"
    assert describe_mode(ExecutionMode.EAGER, device, "inductor") == "strict eager (EagerMode.DEFER_NEVER on tpu)"
    assert describe_mode(ExecutionMode.COMPILED, device, "inductor") == "compiled (tpu on tpu)"


def test_detection_falls_back_to_cpu_when_the_runtime_refuses(monkeypatch):
    from tpu_demo.device import DeviceUnavailable, detect_device

    tpu = TpuStandIn(chips=4, ready=False).install(monkeypatch)
    assert detect_device().kind == "cpu"
    assert "torch_tpu._loader.load" in tpu.names()  # it tried
    assert detect_device("cpu").kind == "cpu"
    # asked for the TPU by name (--device tpu), it refuses to serve on anything else and says why
    with pytest.raises(DeviceUnavailable, match=r"^--device tpu: no TPU started \(4 TPU chip\(s\) visible but "
                                                r"torch-tpu did not start: "):
        detect_device("tpu")


# ---- seed: eager mode, FLUX.1-schnell with enable_model_cpu_offload() ---------------------

def test_seed_eager_offload_selects_defer_never_and_offloads_without_a_device(tpu, tpu_engine):
    from tpu_demo.core.catalog import Placement

    engine = tpu_engine(placement_override=Placement.OFFLOAD)
    images = engine_images(engine, model="tiny-flux", mode="eager", resolution="96x64")
    assert images[0].image.size == (96, 64)
    # as the seed: pipe.enable_model_cpu_offload() with no device: diffusers finds "tpu" itself (its own
    # maybe_free_model_hooks re-applies it after each call with the device it found)
    first = tpu.named("enable_model_cpu_offload")[0]
    assert (first.args, first.kwargs) == ((), {})
    assert eager_modes(tpu) == [("enter", "DEFER_NEVER"), ("exit", "DEFER_NEVER")]
    assert compiles(tpu) == []
    assert "torch.accelerator.synchronize" in tpu.names()


# ---- optimized eager: DEFER_AND_FUSE around the call, left after errors and Stop -----------

def test_optimized_eager_enters_and_leaves_defer_and_fuse_also_after_an_error_and_a_stop(tpu, tpu_engine):
    from tpu_demo.core.errors import EngineError
    from tpu_demo.core.events import StepProgress
    from tpu_demo.core.request import validate_request

    engine = tpu_engine()
    engine_images(engine, model="tiny-flux", mode="eager-fused")
    assert eager_modes(tpu) == [("enter", "DEFER_AND_FUSE"), ("exit", "DEFER_AND_FUSE")]

    tpu.clear()
    pipeline = engine.load("tiny-flux")

    def fail(module, args, output):
        raise RuntimeError("device lost")

    hook = pipeline.transformer.register_forward_hook(fail)
    with pytest.raises(EngineError):
        engine_images(engine, model="tiny-flux", mode="eager-fused")
    hook.remove()
    assert eager_modes(tpu) == [("enter", "DEFER_AND_FUSE"), ("exit", "DEFER_AND_FUSE")]

    tpu.clear()
    stop = threading.Event()
    events = []
    for event in engine.generate(validate_request(request_fields(mode="eager-fused", num_inference_steps=4)), stop):
        events.append(event)
        if isinstance(event, StepProgress):
            stop.set()
    assert type(events[-1]).__name__ == "Stopped"
    assert eager_modes(tpu) == [("enter", "DEFER_AND_FUSE"), ("exit", "DEFER_AND_FUSE")]


# ---- seed: compiled mode, SD3.5 Medium whole on one chip ----------------------------------

def test_seed_compiled_whole_moves_to_tpu_and_compiles_the_full_transformer_once(tpu, tpu_engine):
    from tpu_demo.core.catalog import Placement

    engine = tpu_engine(placement_override=Placement.WHOLE)
    first = engine_images(engine, model="tiny-sd3", mode="compiled", guidance_scale=4.5, resolution="64x64")
    assert [c.args for c in tpu.named("pipeline.to")] == [("tpu",)]
    assert compiles(tpu) == [("SD3Transformer2DModel", {"backend": "tpu", "fullgraph": True, "dynamic": False})]
    graphs = len(tpu.named("backend.tpu.graph"))
    assert graphs >= 1
    assert eager_modes(tpu) == []  # compiled mode selects no eager mode
    second = engine_images(engine, model="tiny-sd3", mode="compiled", guidance_scale=4.5, resolution="64x64", seed=8)
    assert len(tpu.named("backend.tpu.graph")) == graphs  # same shape: no recompile
    assert len(compiles(tpu)) == 1
    assert first[0].image.size == second[0].image.size == (64, 64)


# ---- compiled under offload: compile_repeated_blocks ---------------------------------------

def test_compiled_offload_compiles_the_repeated_blocks_with_the_tpu_backend(tpu, tpu_engine):
    from tpu_demo.core.catalog import Placement

    engine = tpu_engine(placement_override=Placement.OFFLOAD)
    images = engine_images(engine, model="tiny-flux", mode="compiled")
    assert images[0].image.size == (64, 64)
    recorded = compiles(tpu)
    blocks = {"FluxTransformerBlock", "FluxSingleTransformerBlock"}
    assert recorded and {target for target, _ in recorded} == blocks
    assert all(kwargs == {"backend": "tpu", "fullgraph": True, "dynamic": False} for _, kwargs in recorded)
    pipeline = engine.load("tiny-flux")
    expected = sum(type(m).__name__ in blocks for m in pipeline.transformer.modules())
    assert len(recorded) == expected  # each block, and not the transformer itself
    first = tpu.named("enable_model_cpu_offload")[0]
    assert (first.args, first.kwargs) == ((), {})


# ---- seed: tensor parallelism, FLUX.2-dev ---------------------------------------------------

def test_seed_tensor_parallel_uses_tpu_dist_a_tpu_mesh_and_passes_it_to_both_models(tpu, models_dir, monkeypatch):
    import torch.distributed as dist
    from diffusers import TensorParallelConfig
    from transformers import DistributedConfig

    from tpu_demo.core.catalog import get_spec
    from tpu_demo.device import detect_device
    from tpu_demo.distributed.group import init_tensor_parallel, load_tensor_parallel_pipeline

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    try:
        world = init_tensor_parallel(detect_device(), timeout_seconds=60)
        assert [c.kwargs for c in tpu.named("init_process_group")] == [{"backend": "tpu_dist"}]
        assert [c.args for c in tpu.named("DeviceMesh")] == [("tpu", [0])]
        mesh = tpu.meshes[0]
        assert world.mesh is mesh

        pipeline = load_tensor_parallel_pipeline(get_spec("tiny-flux2"), world, models_dir)
        transformer_loads = [c for c in tpu.named("diffusers.from_pretrained") if "parallel_config" in c.kwargs]
        assert [c.args[0] for c in transformer_loads] == ["Flux2Transformer2DModel"]
        config = transformer_loads[0].kwargs["parallel_config"]
        assert isinstance(config, TensorParallelConfig) and config.mesh is mesh
        encoder_loads = [c for c in tpu.named("transformers.from_pretrained") if "distributed_config" in c.kwargs]
        assert [c.args[0] for c in encoder_loads] == ["Mistral3ForConditionalGeneration"]
        assert isinstance(encoder_loads[0].kwargs["distributed_config"], DistributedConfig)
        assert encoder_loads[0].kwargs["distributed_config"].tp_plan == "auto"
        assert encoder_loads[0].kwargs["device_mesh"] is mesh
        # the VAE (no plan) goes whole onto the rank's chip, as the seed's pipe.vae.to("tpu")
        assert ("AutoencoderKLFlux2", "tpu") in [c.args for c in tpu.named("module.to")]
        with torch.inference_mode():
            image = pipeline(prompt="a red circle", height=64, width=64, num_inference_steps=1, guidance_scale=4.0,
                             max_sequence_length=77, generator=torch.Generator("cpu").manual_seed(0)).images[0]
        assert image.size == (64, 64)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ---- the compile-cache variables are set before torch-tpu initialises -----------------------

def test_compile_cache_variable_is_set_before_torch_and_torch_tpu_are_imported(tmp_path):
    """app.py, as an operator starts it: at the moment ``import torch`` begins (which autoloads
    torch-tpu and its backend reads the cache root once), the tier-3 root is already set."""
    probe = (
        "import os, sys, runpy\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] in ('torch', 'torch_tpu'):\n"
        "        print('AT-IMPORT', args[0], os.environ.get('TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT'), flush=True)\n"
        "        os._exit(0)\n"
        "sys.addaudithook(hook)\n"
        f"sys.argv = ['app.py', '--cache-dir', {str(tmp_path)!r}]\n"
        "runpy.run_path('app.py', run_name='__main__')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TORCHINDUCTOR_"))}
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    line = [l for l in out.stdout.splitlines() if l.startswith("AT-IMPORT")]
    assert line, out.stdout + out.stderr
    _, module, root = line[0].split(" ", 2)
    assert module == "torch"
    assert root == str((tmp_path / "compile" / "torch-tpu").resolve())


# ---- the resident placement on a TPU: denoiser on the chip, text encoders on the host -------

def test_resident_on_tpu_moves_only_the_denoising_pipeline_and_compiles_the_full_transformer(tpu, tpu_engine):
    from tpu_demo.core.catalog import Placement

    engine = tpu_engine(placement_override=Placement.RESIDENT)
    engine_images(engine, model="tiny-flux", mode="compiled")
    [moved] = tpu.named("pipeline.to")
    assert moved.args == ("tpu",)
    pipeline = engine.pool.get("tiny-flux").pipeline
    assert pipeline.text_encoder is None and pipeline.text_encoder_2 is None  # they stayed on the host
    assert compiles(tpu) == [("FluxTransformer2DModel", {"backend": "tpu", "fullgraph": True, "dynamic": False})]
    assert tpu.named("enable_model_cpu_offload") == []
