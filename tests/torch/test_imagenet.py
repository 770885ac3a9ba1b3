"""ImageNet's JPEG tree through a torch DataLoader
(trainscale.frameworks.torch.torch_imagenet): torchvision's random-resized
crop, the same batches whichever worker decodes them, a bad file named, the
TFRecord layout refused, and one decoded-input run."""

from collections import Counter

import numpy as np
import pytest
import torch
from runs import assert_trains_on_decoded_imagenet, temp_folder_of_length, trainscale

from trainscale.catalogue.settings import RunSettings, SettingsError, validate
from trainscale.core.data_error import DataError
from trainscale.core.imagenet import Pipeline, generate_imagenet, jpeg_files
from trainscale.frameworks.torch.torch_imagenet import (
    RATIO,
    SCALE,
    batches_of,
    jpeg_loader,
    random_resized_box,
)


@pytest.fixture()
def imagenet(tmp_path):
    return generate_imagenet(str(tmp_path / "imagenet"), classes=4, per_class=8, shards=2)


def first_batches(files, count=1, **kwargs):
    options = dict(shard_index=0, num_shards=1, batch_size=4, seed=1, image_size=24,
                   augment=True, workers=0)  # fmt: skip
    pipeline = Pipeline(**{**options, **kwargs})
    iterator = iter(batches_of(jpeg_loader(files, pipeline, pin_memory=False)))
    return [next(iterator) for _ in range(count)]


def test_a_random_resized_crop_keeps_torchvisions_area_and_ratio():
    rng = np.random.default_rng(0)
    for width, height in [(500, 375), (64, 48), (40, 96)]:
        for _ in range(200):
            left, top, right, bottom = random_resized_box(width, height, rng)
            assert 0 <= left < right <= width and 0 <= top < bottom <= height
            w, h = right - left, bottom - top
            if (w, h) != (width, height):  # not the whole image
                assert SCALE[0] * 0.9 <= w * h / (width * height) <= SCALE[1]
                assert RATIO[0] * 0.9 <= w / h <= RATIO[1] * 1.1  # rounding at small sides


def test_workers_decode_the_same_batches_and_shards_split_the_files(imagenet):
    files = jpeg_files(imagenet, "train")
    alone = first_batches(files, count=3)
    beside = first_batches(files, count=3, workers=2)
    for (images, labels), (other_images, other_labels) in zip(alone, beside):
        assert images.dtype == torch.uint8 and tuple(images.shape) == (4, 24, 24, 3)
        assert np.array_equal(images.numpy(), other_images.numpy())
        assert labels.tolist() == other_labels.tolist()
    seen = Counter()
    for shard in range(2):
        ((_, labels),) = first_batches(files, batch_size=16, shard_index=shard, num_shards=2)
        seen.update(labels.tolist())
    assert seen == Counter({label: 8 for label in range(4)})


def test_a_file_pillow_cannot_read_is_named_from_a_worker(imagenet):
    files = jpeg_files(imagenet, "train")
    with open(files.paths[2], "wb") as handle:
        handle.write(b"not a jpeg")
    with pytest.raises(DataError) as caught:
        first_batches(files, batch_size=32, workers=2)
    why = "cannot identify image file"  # Pillow's words, less the file it names
    assert str(caught.value) == f"{files.paths[2]}: not a readable JPEG ({why})"


def test_torch_refuses_tfrecord_shards_and_accuracy_mode_on_imagenet(imagenet):
    base = dict(framework="torch-ddp", model="small_cnn", image_size=32, device="cpu",
                data_dir=imagenet)  # fmt: skip
    with pytest.raises(SettingsError, match="TFRecord shards are TensorFlow's"):
        validate(RunSettings(**base, dataset="imagenet-tfrecord"))
    with pytest.raises(SettingsError, match="accuracy mode reads its test split whole"):
        validate(RunSettings(**base, dataset="imagenet-jpeg", mode="accuracy"))
    validate(RunSettings(**base, dataset="imagenet-jpeg"))


@pytest.mark.slow
def test_ddp_trains_on_the_jpeg_tree_and_records_the_pipelines_rate(tmp_path):
    assert_trains_on_decoded_imagenet(tmp_path, "torch-ddp", "imagenet-jpeg")


def test_a_temp_folder_too_long_for_the_workers_sockets_is_refused_at_once(tmp_path, imagenet):
    # One byte past what a worker's socket allows (the decoded run above
    # trains with a temp folder of the longest that fits): the run fails in
    # one line before its first step, where it waited for its watchdog.
    from trainscale.core.imagenet import SOCKET_PATH_LIMIT, WORKER_SOCKET_SUFFIX

    room = SOCKET_PATH_LIMIT - WORKER_SOCKET_SUFFIX
    output = tmp_path / "run.json"
    with temp_folder_of_length(room + 1, "refused-") as temp:
        result = trainscale(
            "run",
            *("--framework", "torch-single", "--device", "cpu", "--model", "small_cnn"),
            *("--image-size", "32", "--batch-size", "4", "--loader-workers", "1"),
            *("--dataset", "imagenet-jpeg", "--data-dir", imagenet, "--timeout", "120"),
            *("--output", str(output)),
            env={"TMPDIR": str(temp)},
        )
    # Refused as a bad input file is (trainscale.core.data_error): its line, no record.
    assert result.returncode == 1, result.stderr[-2000:]
    why = f"DataError: the temp folder {temp} is {room + 1} bytes long"
    assert why in result.stderr, result.stderr[-2000:]
    assert not output.exists()
