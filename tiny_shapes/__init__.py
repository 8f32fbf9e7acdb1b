"""The embedded default model's world: synthetic scenes, architecture, judge and training.

The app never imports this package: it loads the trained weights from ``assets/models/tiny-shapes``
through diffusers like any other model. Training (``scripts/train_tiny_model.py``), evaluation
and the tests use it.
"""
