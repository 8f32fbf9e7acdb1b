"""Run under torchrun: a reduced-depth real architecture, tensor parallel, at the real buckets.

Usage: torchrun --nproc_per_node=2 tests/helpers/tp_real_resolution.py MODELS_DIR OUT_FILE MODEL_ID
Each rank loads the model sharded (TensorParallelConfig / DistributedConfig over a gloo mesh),
compiles the transformer as the engine does for this placement (full compile, aot_eager), and
calls the pipeline at each real bucket twice. Rank 0 writes a JSON report: image sizes, graphs
compiled per call (0 on the repeats), the latents' shape at each step, seconds per call.
"""

import json
import os
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", ".."), os.path.dirname(__file__)]

from pathlib import Path  # noqa: E402
from types import MappingProxyType  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpu_demo  # noqa: E402,F401 - offline defaults
from reduced_models import REAL_BUCKETS, build_reduced_pipeline, reduced_id, reduced_spec  # noqa: E402
from tpu_demo.core import catalog  # noqa: E402
from tpu_demo.core.catalog import Placement  # noqa: E402
from tpu_demo.device import detect_device  # noqa: E402
from tpu_demo.distributed.group import init_tensor_parallel, load_tensor_parallel_pipeline  # noqa: E402
from tpu_demo.engine.compile_counter import CompileCounter  # noqa: E402
from tpu_demo.models import tiny_models  # noqa: E402
from tpu_demo.models.placement import compile_for_placement  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    models_dir, out_file, model_id = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    spec = reduced_spec(model_id)
    narrow = os.environ.get("TPU_DEMO_REAL_VAE") != "1"
    tiny_models.BUILDERS[reduced_id(model_id)] = lambda: build_reduced_pipeline(model_id, narrow_vae=narrow)
    catalog.CATALOG = MappingProxyType({**catalog.CATALOG, spec.id: spec})
    world = init_tensor_parallel(detect_device("cpu"), timeout_seconds=1800)
    pipeline = load_tensor_parallel_pipeline(spec, world, models_dir)
    counter = CompileCounter("aot_eager")
    compile_for_placement(pipeline, Placement.TENSOR_PARALLEL, counter, spec)
    torch._dynamo.config.recompile_limit = 16
    report = []
    for bucket in REAL_BUCKETS:
        for repeat in range(2):
            latents = []
            before, started = counter.count, time.perf_counter()

            def on_step(pipe, step, timestep, kwargs):
                latents.append(list(kwargs["latents"].shape))
                return kwargs

            with torch.inference_mode():
                image = pipeline(prompt="a lighthouse on a cliff at sunset", height=bucket.height, width=bucket.width,
                                 num_inference_steps=2, generator=torch.Generator("cpu").manual_seed(repeat),
                                 callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=["latents"],
                                 **spec.pipeline_kwargs(spec.default_guidance)).images[0]
            report.append({"bucket": str(bucket), "repeat": repeat, "size": list(image.size),
                           "compiles": counter.count - before, "latents": latents,
                           "seconds": round(time.perf_counter() - started, 1)})
    if world.is_leader:
        out_file.write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
