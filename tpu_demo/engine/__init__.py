"""The engine: one device thread, a warm compiled graph per bucket, requests as event streams.

Knows nothing of Gradio. Import the modules themselves (``tpu_demo.engine.engine``); this file stays
empty so that ``compile_cache`` can be imported before torch.
"""
