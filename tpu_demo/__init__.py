"""TPU diffusion demo: a Gradio app serving diffusers pipelines on TPU (torch-tpu), CUDA or CPU."""

from tpu_demo.offline import apply_offline_defaults

apply_offline_defaults()
