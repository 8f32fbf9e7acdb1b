"""From a catalog entry to a pipeline on the device: loading, placement, the tiny offline models."""
