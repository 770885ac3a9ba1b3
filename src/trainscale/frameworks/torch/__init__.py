"""The torch ecosystem: its backend and frameworks (DDP, torchrun elastic,
FSDP2, DeepSpeed, Horovod over PyTorch and its elastic form, Ray Train,
pipeline and tensor parallelism), its models and GPT."""
