"""The torch backend and its frameworks: DDP, FSDP2, DeepSpeed, Horovod over
PyTorch, Ray Train."""
