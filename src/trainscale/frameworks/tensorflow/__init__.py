"""The TensorFlow ecosystem: its backend and frameworks (tf-single, Horovod
and its elastic form, Mirrored, MultiWorker, CentralStorage, the parameter
servers), its Keras models and GPT, and its tf.data pipeline."""
