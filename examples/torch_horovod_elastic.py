"""VGG-16 on CIFAR-100, a custom training loop, every GPU of every node: Horovod
elastic (PyTorch), going on without a lost host.

torch_horovod.py changed as Horovod's elastic guide teaches: the model, the
optimizer and the step live in a hvd.elastic.TorchState, committed every
--commit-every steps, and the training loop is a function wrapped in
hvd.elastic.run. When a rank fails, the others restore the last commit, the
driver re-forms the world without the failed host, and training goes on.
horovodrun starts it with a minimum and maximum of processes and a script
that lists the hosts (host:slots, one per line):

    horovodrun -np 4 --min-np 1 --max-np 4 --host-discovery-script ./discover_hosts.sh \
        python torch_horovod_elastic.py --data-dir DIR
    horovodrun -np 8 --min-np 4 --max-np 8 --host-discovery-script ./discover_hosts.sh \
        python torch_horovod_elastic.py --data-dir DIR   # it prints node1:4 and node2:4

The learning rate is the base's (Horovod's guide scales it by hvd.size()):
trainscale compares frameworks at equal hyper-parameters.

concepts: process group, rank and size, device pinning, data sharding,
gradient all-reduce, cross-replica reduction, replicated step, elastic restart
"""

import argparse
import itertools
import os
import pickle
import tarfile
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

NUM_CLASSES = 100
# Per-channel mean and standard deviation of the CIFAR-100 training images.
MEAN = torch.tensor((0.5071, 0.4865, 0.4409)).view(3, 1, 1)
STD = torch.tensor((0.2673, 0.2564, 0.2762)).view(3, 1, 1)
VGG16_BLOCKS = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))  # (width, convolutions)


def parse_args():
    parser = argparse.ArgumentParser(description="VGG-16 on CIFAR-100, custom training loop")
    parser.add_argument("--data-dir", help="folder holding cifar-100-python.tar.gz")
    parser.add_argument("--synthetic", action="store_true", help="random batches, no data set")
    parser.add_argument("--batch-size", type=int, default=64, help="images per GPU per step")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--commit-every", type=int, default=50, help="steps between commits")
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


def batches(args, device):
    """(images, labels) on the device, one pair per step, for ever."""
    if args.synthetic:
        images, labels = synthetic_batch(hvd.rank(), args.batch_size, args.seed)
        while True:
            yield images.to(device), labels.to(device)
    dataset = CIFAR100(args.data_dir)
    sampler = DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed, drop_last=True
    )
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    for epoch in itertools.count():
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for images, labels in loader:
            yield images.to(device), labels.to(device)


def make_optimizer(args, model):
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    # Keras's epsilon (torch's default is 1e-8), as tf_single.py trains.
    return torch.optim.Adam(model.parameters(), lr=args.learning_rate, eps=1e-7)


def main():
    args = parse_args()
    hvd.init()
    device = (
        torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    model = vgg16().to(device)
    optimizer = make_optimizer(args, model)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # The state a reset restores and a new rank receives (it broadcasts it from rank 0).
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=1)

    @hvd.elastic.run
    def train(state):
        data = batches(args, device)  # sharded over the world as it is now
        first_step, start = state.step, None
        for step in range(first_step, args.steps + 1):
            images, labels = next(data)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mean_loss = hvd.allreduce(loss.detach())
            if hvd.rank() == 0:
                print(f"step {step}/{args.steps}: loss {mean_loss.item():.6f}", flush=True)
            if step % args.commit_every == 0:
                state.step = step + 1
                state.commit()
            if step == first_step:
                start = time.perf_counter()  # the first step allocates and warms up: not timed
        if args.steps > first_step:
            seconds = time.perf_counter() - start
            images_per_sec = (args.steps - first_step) * args.batch_size / seconds
            total = hvd.allreduce(torch.tensor(images_per_sec), op=hvd.Sum)
            if hvd.rank() == 0:
                print(f"images/sec: {total.item():.1f}")

    train(state)


if __name__ == "__main__":
    main()
