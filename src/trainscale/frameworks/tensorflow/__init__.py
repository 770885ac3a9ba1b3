"""The TensorFlow backend and its four frameworks (tf-single, Horovod,
MirroredStrategy, MultiWorkerMirroredStrategy)."""
