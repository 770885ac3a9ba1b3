"""The PyTorch ecosystem behind the loop's seam (trainscale.harness.backend), and torch-single.

One training step for every torch framework (TorchBackend.step), as the
TensorFlow frameworks share theirs: the batch, the forward pass, the loss,
then the framework's update. TorchBackend itself is torch-single (one
process, plain autograd); a distributed framework is a subclass in a module
of its own that overrides only the hooks it needs:
- connect() and device_index(): how processes find each other and which
  device a rank takes (trainscale.frameworks.torch.torch_distributed holds torch.distributed's
  rendezvous, rank variables, gather and close for DDP, FSDP2 and DeepSpeed);
- build(module): the model to call and its optimizer, built together, so a
  framework may wrap the module (DDP), shard it before the optimizer sees its
  parameters (FSDP2), or hand both to an engine of its own (DeepSpeed);
- update(objective): backward and the optimizer step (an engine runs its own);
- trainable_weights(): whole weights, gathered where they are sharded;
- precision_by_autocast: False where the framework casts itself (FSDP2's
  MixedPrecisionPolicy, DeepSpeed's bf16/fp16 config).

Loss convention, as in trainscale.frameworks.tensorflow.strategies: every replica computes
sum(per-example loss) / GLOBAL batch, and gradients are SUMMED over replicas,
giving the gradient of the mean loss over the global batch, exactly what
torch-single computes on the whole batch. Horovod sums (op=hvd.Sum). DDP,
FSDP2 and DeepSpeed AVERAGE over ranks, so each of their ranks
back-propagates its share times the world size (gradient_scale): the same
gradient (tests/torch/test_equivalence.py).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch
import torch.nn.functional as F

from trainscale.catalogue.elastic_kinds import world_size_error
from trainscale.core.accuracy import evaluation_batches, scored_classes
from trainscale.core.cpus import cpu_share
from trainscale.core.datasets import DATASETS
from trainscale.core.imagenet import ImageFiles, decode_only_rate, pipeline
from trainscale.core.supervision import CPU_ALLOCATOR_OOM
from trainscale.frameworks.torch.step_profile import note_tensor_memory, step_profiler
from trainscale.frameworks.torch.torch_imagenet import batches_of, batches_on, jpeg_loader
from trainscale.frameworks.torch.torch_models import (
    build_torch_model,
    torch_forward_flops_per_image,
)
from trainscale.harness.backend import Backend, DeviceError, batches_trained, horovod_versions
from trainscale.harness.data import numpy_batches, synthetic_example_batch
from trainscale.harness.flops import TRAINING_OVER_FORWARD, text_training_flops_per_example

_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


class TorchBackend(Backend):
    """torch-single; a distributed framework overrides the hooks below."""

    # ---- hooks of the distributed frameworks --------------------------------

    def connect(self) -> int:
        """Join the other processes (filling self.topology); return how many share this node."""
        return 1

    def device_index(self, visible: int) -> int:
        return 0

    def build(self, module):
        """(the model to call, its optimizer) for `module`, already on its device."""
        return module, self.make_optimizer(module.parameters())

    def update(self, objective) -> None:
        """Backward for `objective` (this replica's loss x gradient_scale), and the step."""
        self.optimizer.zero_grad()  # torch >= 2.0: set_to_none; Horovod takes no argument
        if self.scaler is None:
            objective.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(objective).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def close(self) -> None:
        """The training batches closed: a loader's workers end with them."""
        batches = getattr(self, "batches", None)
        if batches is not None:
            batches.close()

    def check_world_size(self, ranks: int) -> None:
        """Refuse a world that is not the run's (an elastic one may have shrunk)."""
        error = world_size_error(self.settings, ranks, self.elastic)
        if error:
            raise DeviceError(error)

    # Each rank's loss is multiplied by this before backward (see the docstring).
    gradient_scale = 1.0
    # Whether torch.autocast applies --precision (else the framework casts).
    precision_by_autocast = True
    # Whether the framework scales an fp16 loss itself (else a GradScaler does).
    scales_fp16_loss = False
    # The dtype the batches are cast to, where the framework's model holds
    # bf16/fp16 parameters itself (DeepSpeed); None: as prepared.
    input_dtype = None

    def ran_out_of_memory(self, err: BaseException) -> bool:
        # torch's CPU allocator raises a plain RuntimeError. Left a crash, an
        # elastic agent restarted the ranks into the same failure, up to its
        # restarts (4 attempts, over a minute here), before the launcher read
        # the line; said as OOM, the launcher ends the run at the first.
        return super().ran_out_of_memory(err) or (
            isinstance(err, RuntimeError) and CPU_ALLOCATOR_OOM in str(err)
        )

    # ---- the shared step ----------------------------------------------------

    def prepare(self) -> None:
        s = self.settings
        self.out_of_memory_errors = (torch.cuda.OutOfMemoryError, MemoryError)
        self._take_device(processes_on_node=self.connect())
        self.check_world_size(self.topology.num_processes)
        torch.manual_seed(s.seed)  # the same initial weights in every process
        self.memory_format = torch.channels_last if s.channels_last else torch.contiguous_format
        module = build_torch_model(
            s.model, s.image_size, s.num_classes, s.input_channels, seq_len=s.seq_len
        )
        module.checkpoint_activations = s.activation_checkpointing  # a GPT reads it
        module = module.to(self.device)
        self.module = module.to(memory_format=self.memory_format)
        self.parameter_count = sum(p.numel() for p in module.parameters() if p.requires_grad)
        model, self.optimizer = self.build(self.module)
        self.model = torch.compile(model) if s.compile else model
        self.autocast = _AUTOCAST.get(s.precision) if self.precision_by_autocast else None
        # float16 gradients underflow without loss scaling; bfloat16 needs none.
        fp16 = s.precision == "fp16" and not self.scales_fp16_loss
        self.scaler = torch.amp.GradScaler(self.device.type) if fp16 else None
        train, test = self.read_splits()
        self.batches = self._batches(train)
        if test:
            self.test_batches = self._test_batches(*test)

    def _take_device(self, processes_on_node: int) -> None:
        if self.settings.device == "cpu":
            # Each process gets its share of the cores, as for TensorFlow.
            torch.set_num_threads(cpu_share(processes_on_node))
            self.device = torch.device("cpu")
            self.topology.devices = ["cpu"]
            return
        visible = torch.cuda.device_count()
        index = self.device_index(visible)
        if index >= visible:
            raise DeviceError(
                f"{self.settings.framework} process {self.topology.process_index} needs GPU "
                f"{index} but "
                f"sees {visible} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})"
            )
        torch.cuda.set_device(index)
        self.device = torch.device("cuda", index)
        self.topology.devices = [f"cuda:{index} ({torch.cuda.get_device_name(index)})"]

    def make_optimizer(self, parameters):
        s = self.settings
        if s.optimizer == "adam":
            # Keras's Adam defaults: epsilon 1e-7 (torch's is 1e-8).
            return torch.optim.Adam(parameters, lr=s.learning_rate, eps=1e-7)
        return torch.optim.SGD(parameters, lr=s.learning_rate)

    def data_shard(self) -> tuple[int, int]:
        """(the data shard this process reads, of how many shards): a
        data-parallel rank reads its own; a model-parallel framework's ranks
        share theirs (a pipeline's, a tensor-parallel group's)."""
        return self.topology.process_index, self.topology.num_processes

    def _batches(self, train):
        """Model-ready (images, labels) on the device, one pair per step, for ever."""
        s = self.settings
        shard, shards = self.data_shard()
        # A shard's batch is the batches of the replicas that read it.
        replicas = self.topology.num_processes // shards
        if train is None:  # synthetic: each replica's own batch, as in TensorFlow
            first = shard * replicas
            parts = [
                synthetic_example_batch(s, r, s.batch_size) for r in range(first, first + replicas)
            ]
            images, labels = (np.concatenate(part) for part in zip(*parts))
            # Laid out for the model once, on the host; copied to the device
            # every step, as TensorFlow's iterator copies its synthetic batch.
            images = self.prepare_images(torch.from_numpy(images))
            labels = torch.from_numpy(labels).long()
            if self.device.type == "cuda":  # page-locked: the copy can be asynchronous
                images, labels = images.pin_memory(), labels.pin_memory()
            # Both copies asynchronous: a blocking one (the labels' was) waits
            # for the last step's kernels, and the host stops queueing ahead
            # (the GPU check: 0.84-0.93 of a plain loop on ResNet-50, batch 64).
            while True:
                yield (
                    images.to(self.device, non_blocking=True),
                    labels.to(self.device, non_blocking=True),
                )
        if isinstance(train, ImageFiles):  # JPEGs, decoded by the loader's workers
            self.pipeline = pipeline(s, shard, shards, s.batch_size * replicas)
            loader = jpeg_loader(train, self.pipeline, pin_memory=self.device.type == "cuda")
            yield from batches_on(loader, self.device, self.prepare_images)
            return
        for image_batch, label_batch in numpy_batches(
            *train,
            shard_index=shard,
            num_shards=shards,
            batch_size=s.batch_size * replicas,
            seed=s.seed,
            augment=s.augmentation != "none",
        ):
            # uint8 at its native size crosses to the device; normalising and resizing
            # happen there, as in TensorFlow's step.
            images, labels = torch.from_numpy(image_batch), torch.from_numpy(label_batch)
            if self.device.type == "cuda":  # from pageable memory a copy blocks
                images, labels = images.pin_memory(), labels.pin_memory()
            on_device = images.to(self.device, non_blocking=True)
            yield self.prepare_images(on_device), labels.to(self.device, non_blocking=True)

    def decode_only_rate(self) -> float | None:
        if not hasattr(self, "pipeline"):
            return None
        loader = jpeg_loader(self.train_files, self.pipeline, pin_memory=self.device.type == "cuda")
        with contextlib.closing(batches_of(loader)) as decoded:
            return decode_only_rate(decoded, max(2, self.settings.steps_per_block))

    def _test_batches(self, images: np.ndarray, labels: np.ndarray) -> list:
        """This process's test shard in equal batches (uint8 images, labels,
        weights): its data shard's (data_shard), in batches of the replicas
        that read it, as in training: a split model's ranks run the same ones."""
        shard, shards = self.data_shard()
        replicas = self.topology.num_processes // shards
        batch = self.settings.batch_size * replicas
        return [
            (torch.from_numpy(x), torch.from_numpy(y).long(), torch.from_numpy(w))
            for x, y, w in evaluation_batches(images, labels, shard, shards, batch)
        ]

    def set_learning_rate(self, rate: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def evaluate(self) -> np.ndarray:
        self.model.eval()  # dropout off, batch norm's running statistics
        classes = scored_classes(self.settings)
        totals = torch.zeros(3 + 2 * classes, dtype=torch.float64, device=self.device)
        with torch.no_grad():
            for images, labels, weights in self.test_batches:
                images = self.prepare_images(images.to(self.device))
                labels, weights = labels.to(self.device), weights.to(self.device)
                logits = self.test_logits(images, labels)
                if logits is None:
                    continue
                # An example's loss and accuracy: over its tokens, for a text model.
                batch = len(labels)
                losses = (
                    F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none")
                    .view(batch, -1)
                    .mean(dim=1)
                )
                correct = (logits.argmax(dim=-1) == labels).float().view(batch, -1).mean(dim=1)
                totals[:3] += torch.stack([losses @ weights, correct @ weights, weights.sum()])
                if classes:  # each class's correct, then its examples
                    counted = torch.stack([correct * weights, weights]).double()
                    totals[3:].view(2, classes).index_add_(1, labels, counted)
        self.model.train()
        return totals.cpu().numpy()

    def test_logits(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """The model's logits (in float) for one test batch, without gradients;
        None on a rank that computes none (a pipeline's stages before the last)."""
        with torch.autocast(self.device.type, self.autocast, enabled=self.autocast is not None):
            return self.model(inputs).float()

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor:
        """As data.prepare_images: uint8 -> normalised float, NHWC -> NCHW,
        resized; a text model's token ids go in as they are."""
        if self.settings.is_text:
            return images.long()
        if images.dtype == torch.uint8:
            dataset = DATASETS[self.settings.dataset]
            mean = torch.tensor(dataset.mean, device=images.device)
            std = torch.tensor(dataset.std, device=images.device)
            images = (images.float() / 255.0 - mean) / std
        images = images.permute(0, 3, 1, 2)
        size = self.settings.image_size
        if images.shape[-1] != size or images.shape[-2] != size:
            # TensorFlow's bilinear resize samples at half-pixel centres, as
            # align_corners=False does.
            images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
        if self.input_dtype is not None:
            images = images.to(self.input_dtype)
        return images.contiguous(memory_format=self.memory_format)

    def skip_trained_batches(self, timed_steps: int) -> None:
        """Advance the batches past what warm-up and `timed_steps` trained on."""
        for _ in range(batches_trained(self.settings, timed_steps)):
            next(self.batches)

    def step(self):
        images, labels = next(self.batches)
        if self.autocast is None:
            logits = self.model(images)
        else:
            with torch.autocast(self.device.type, self.autocast):
                logits = self.model(images)
        loss = self.loss(logits, labels)
        self.update(loss if self.gradient_scale == 1 else loss * self.gradient_scale)
        return loss.detach()

    def loss(self, logits, labels):
        """These examples' summed loss over the global batch of the world as
        it is (an elastic one may have shrunk) and each example's targets: the
        shares of every replica (or microbatch) add up to the mean loss."""
        # float(): the logits of a model in half precision (no-op in fp32).
        # A text model's (batch, tokens, vocabulary) flatten to one
        # prediction per token; an image model's are one per image already.
        loss = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), reduction="sum")
        s = self.settings
        return loss / (s.batch_size * self.topology.num_replicas * s.targets_per_example)

    def read_loss(self, loss) -> float:
        return float(loss.item())  # waits for the device: the block's sync

    # ---- what the record needs ----------------------------------------------

    def trainable_weights(self) -> list[np.ndarray]:
        # A copy: on the CPU, .numpy() would share the parameter's memory and
        # the "initial" weights would move with training.
        return [
            p.detach().cpu().numpy().copy() for p in self.module.parameters() if p.requires_grad
        ]

    def trainable_parameters(self) -> int:
        return self.parameter_count  # counted before any framework sharded the module

    sees_tensor_memory = True

    @contextlib.contextmanager
    def observe_collectives(self):
        """One process sees no collectives: --tensor-memory's profile only."""
        with step_profiler(self.settings) as profiler:
            yield
        note_tensor_memory(self, profiler)

    def peak_memory(self) -> dict:
        if self.settings.device != "gpu":
            return super().peak_memory()
        peak = torch.cuda.max_memory_allocated(self.device)
        return {"bytes": int(peak), "source": "torch cuda allocator peak"}

    def memory_capacity(self) -> dict:
        if self.settings.device != "gpu":
            return super().memory_capacity()
        total = torch.cuda.get_device_properties(self.device).total_memory
        return {"bytes": int(total), "source": "torch cuda device total memory"}

    def gpu_name(self) -> str:
        return torch.cuda.get_device_name(self.device)

    def peak_precision(self) -> str:
        s = self.settings
        if s.precision != "fp32" or s.device != "gpu":
            return s.precision
        # torch's defaults: cuDNN's convolutions in TF32, matmuls in float32.
        return "tf32" if tf32_allowed(s.is_text) else "fp32"

    def training_flops_per_image(self) -> int:
        s = self.settings
        if s.is_text:
            return text_training_flops_per_example(s)
        return TRAINING_OVER_FORWARD * torch_forward_flops_per_image(
            s.model, s.image_size, s.num_classes, s.input_channels
        )

    def software_versions(self) -> dict:
        return {
            "torch": torch.__version__,
            "numpy": np.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            **horovod_versions("horovod.torch"),
        }


def tf32_allowed(text_model: bool) -> bool:
    """Whether torch runs this model's float32 FLOPs on tensor cores: a text
    model's are matmuls, an image model's convolutions (cuDNN)."""
    if text_model:
        return torch.backends.cuda.matmul.allow_tf32
    return torch.backends.cudnn.allow_tf32
