"""The one timed training loop, the seam its backends fill, data, models, FLOPs."""
