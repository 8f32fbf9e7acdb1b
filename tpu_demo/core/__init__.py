"""Plain data every layer shares: buckets, modes, the model catalog, requests, events, PNG settings.

No torch, no Gradio: the web layer and the engine both speak these types.
"""
