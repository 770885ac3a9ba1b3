"""VGG-16 on CIFAR-100, PyTorch Lightning 1.9's Trainer, every GPU of every node: Horovod.

torch_lightning_single.py changed as Lightning 1.9's docs teach its Horovod
strategy (seed 003's Pytorch_lightning_* scripts; Lightning 2.0 removed it:
pip install pytorch-lightning==1.9.5): the Trainer told strategy="horovod";
Lightning then initialises Horovod, broadcasts rank 0's weights, wraps the
optimizer in Horovod's DistributedOptimizer and gives each process its share
of the data. One process per GPU, started by horovodrun:

    horovodrun -np 4 python torch_lightning_horovod.py --data-dir DIR
    horovodrun -np 8 -H node1:4,node2:4 python torch_lightning_horovod.py --data-dir DIR

The learning rate is the base's: Lightning's Horovod strategy multiplies it
by the number of processes (Horovod's guide), so it is divided by them here;
trainscale compares frameworks at equal hyper-parameters.

concepts: none
"""

import argparse
import itertools
import os
import pickle
import tarfile
import time

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

NUM_CLASSES = 100
# Per-channel mean and standard deviation of the CIFAR-100 training images.
MEAN = torch.tensor((0.5071, 0.4865, 0.4409)).view(3, 1, 1)
STD = torch.tensor((0.2673, 0.2564, 0.2762)).view(3, 1, 1)
VGG16_BLOCKS = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))  # (width, convolutions)


def parse_args():
    parser = argparse.ArgumentParser(description="VGG-16 on CIFAR-100, Lightning's Trainer")
    parser.add_argument("--data-dir", help="folder holding cifar-100-python.tar.gz")
    parser.add_argument("--synthetic", action="store_true", help="random batches, no data set")
    parser.add_argument("--batch-size", type=int, default=64, help="images per GPU per step")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def load_cifar100(data_dir):
    """Training images (N x 32 x 32 x 3, uint8) and fine labels of CIFAR-100's python version."""
    archive = os.path.join(data_dir, "cifar-100-python.tar.gz")
    if os.path.exists(archive):
        with tarfile.open(archive) as tar:
            train = pickle.load(tar.extractfile("cifar-100-python/train"), encoding="bytes")
    else:  # the archive, extracted
        with open(os.path.join(data_dir, "cifar-100-python", "train"), "rb") as handle:
            train = pickle.load(handle, encoding="bytes")
    images = train[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return images, np.array(train[b"fine_labels"], dtype=np.int64)


class CIFAR100(Dataset):
    """Pad-and-crop and a horizontal flip, then normalise: the usual CIFAR recipe."""

    def __init__(self, data_dir):
        self.images, self.labels = load_cifar100(data_dir)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = torch.from_numpy(self.images[index]).permute(2, 0, 1).float() / 255.0
        image = F.pad(image, (4, 4, 4, 4))
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = image[:, top : top + 32, left : left + 32]
        if torch.rand(()) < 0.5:
            image = image.flip(2)
        return (image - MEAN) / STD, self.labels[index]


def synthetic_batch(replica, batch_size, seed):
    """Replica `replica`'s random batch, the same every step (Horovod's synthetic benchmark)."""
    rng = np.random.default_rng([seed, replica])
    images = rng.standard_normal((batch_size, 32, 32, 3), dtype=np.float32)
    labels = rng.integers(0, NUM_CLASSES, size=batch_size)
    # Drawn as tf_single.py draws them (NHWC), so both ecosystems see the same numbers.
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels)


def vgg16():
    """Keras's VGG-16: 3x3 convolutions in five blocks, then 4096, 4096 and the classes."""
    layers, channels = [], 3
    for width, convolutions in VGG16_BLOCKS:
        for _ in range(convolutions):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
            channels = width
        layers.append(nn.MaxPool2d(2))
    layers += [nn.Flatten(), nn.Linear(512, 4096), nn.ReLU(inplace=True)]
    layers += [nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, NUM_CLASSES)]
    model = nn.Sequential(*layers)
    for layer in model.modules():  # Keras's initialisation: Glorot-uniform, zero biases
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    return model


def make_loader(args, rank):
    """The batches: a DataLoader of the data set, or the same synthetic batch each step."""
    if args.synthetic:
        return itertools.repeat(synthetic_batch(rank, args.batch_size, args.seed), args.steps)
    dataset = CIFAR100(args.data_dir)
    return DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)


def make_optimizer(args, model):
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    # Keras's epsilon (torch's default is 1e-8), as tf_single.py trains.
    return torch.optim.Adam(model.parameters(), lr=args.learning_rate, eps=1e-7)


class Classifier(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.model = vgg16()

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return F.cross_entropy(self.model(images), labels)

    def configure_optimizers(self):
        return make_optimizer(self.args, self.model)


class StepLogger(pl.Callback):
    """Each step's loss (the mean over every process's batch) and images/sec
    from the end of the first step, which allocates and warms up."""

    def __init__(self, steps, batch_size):
        self.steps, self.batch_size = steps, batch_size

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = trainer.strategy.reduce(outputs["loss"].detach(), reduce_op="mean")
        if trainer.is_global_zero:
            print(f"step {batch_idx + 1}/{self.steps}: loss {loss.item():.6f}", flush=True)
        if batch_idx == 0:
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        images = (self.steps - 1) * self.batch_size * trainer.world_size
        if self.steps > 1 and trainer.is_global_zero:
            print(f"images/sec: {images / (time.perf_counter() - self.start):.1f}")


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    trainer = pl.Trainer(
        max_steps=args.steps,
        strategy="horovod",
        callbacks=[StepLogger(args.steps, args.batch_size)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    args.learning_rate /= trainer.world_size  # Lightning multiplies it back
    trainer.fit(Classifier(args), make_loader(args, trainer.global_rank))


if __name__ == "__main__":
    main()
