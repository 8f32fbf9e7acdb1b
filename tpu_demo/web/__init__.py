"""The Gradio layer: the Blocks page and its handlers, admission, supervision, health, logs.

Knows nothing of torch: it talks to the engine through ``tpu_demo.core`` types only.
"""
