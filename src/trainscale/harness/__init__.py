"""The one timed training loop, the seam its backends fill, the shards and
batches both ecosystems read, and FLOPs."""
