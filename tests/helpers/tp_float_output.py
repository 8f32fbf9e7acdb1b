"""Run under torchrun: each rank loads the tensor-parallel pipelines and saves its float output.

Usage: torchrun --nproc_per_node=2 tests/helpers/tp_float_output.py MODELS_DIR OUT_DIR MODEL [MODEL ...]
Writes OUT_DIR/<model>.rank<R>.npy (the pipeline's float image, output_type="np") and, on rank 0,
OUT_DIR/<model>.sharded.txt (the components whose weights are DTensor shards).
"""

import os
import sys

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import tpu_demo  # noqa: E402,F401 - offline defaults
from tpu_demo.core.catalog import get_spec  # noqa: E402
from tpu_demo.device import detect_device  # noqa: E402
from tpu_demo.distributed.group import init_tensor_parallel, load_tensor_parallel_pipeline  # noqa: E402

FLOAT_CALL = dict(prompt="a red circle on a white background", height=64, width=64, num_inference_steps=2,
                  output_type="np")


def main() -> None:
    torch.set_num_threads(1)
    models_dir, out_dir, model_ids = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    world = init_tensor_parallel(detect_device("cpu"), timeout_seconds=120)
    for model_id in model_ids:
        spec = get_spec(model_id)
        pipeline = load_tensor_parallel_pipeline(spec, world, models_dir)
        with torch.inference_mode():
            image = pipeline(**FLOAT_CALL, **spec.pipeline_kwargs(spec.default_guidance),
                             generator=torch.Generator("cpu").manual_seed(7)).images[0]
        np.save(out_dir / f"{model_id}.rank{world.rank}.npy", np.asarray(image, dtype=np.float32))
        if world.is_leader:  # which components really hold sharded (DTensor) weights
            sharded = [name for name, component in pipeline.components.items()
                       if isinstance(component, torch.nn.Module)
                       and any(isinstance(p, DTensor) for p in component.parameters())]
            (out_dir / f"{model_id}.sharded.txt").write_text(" ".join(sharded))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
