"""ImageNet's two real layouts (trainscale.core.imagenet) and the TFRecord
framing (trainscale.core.tfrecord) in plain Python: generated, listed, and a
bad file refused in one line naming it. The decoding pipelines are
tests/harness/test_imagenet.py (tf.data) and tests/torch/test_imagenet.py
(a DataLoader)."""

import os
import struct
from pathlib import Path

import pytest

from trainscale.core.data_error import DataError
from trainscale.core.datasets import DATASETS
from trainscale.core.imagenet import WNIDS, generate_imagenet, jpeg_files, tfrecord_files
from trainscale.core.tfrecord import crc32c, masked_crc, read_records, write_records


@pytest.fixture()
def imagenet(tmp_path):
    return generate_imagenet(str(tmp_path / "imagenet"), classes=4, per_class=8, shards=2)


def test_crc32c_is_castagnolis():
    # The check value of CRC-32C (RFC 3720, appendix B.4), and TensorFlow's masking.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert masked_crc(b"") == 0xA282EAD8


def test_the_jpeg_tree_is_listed_with_each_wnid_its_sorted_place(imagenet):
    train, test = jpeg_files(imagenet, "train"), jpeg_files(imagenet, "test")
    assert (len(train), len(test)) == (32, 8) and train.layout == "jpeg"
    assert train.labels.tolist() == [label for label in range(4) for _ in range(8)]
    for path, label in zip(train.paths, train.labels):
        assert os.path.basename(os.path.dirname(path)) == WNIDS[label]
        with open(path, "rb") as handle:
            data = handle.read()
        assert data[:3] == b"\xff\xd8\xff" and data[-2:] == b"\xff\xd9"  # SOI ... EOI
    assert DATASETS["imagenet-jpeg"].load(imagenet, "test").paths == test.paths


def test_the_shards_hold_every_image_once(imagenet):
    shards = tfrecord_files(imagenet, "train")
    assert [os.path.basename(p) for p in shards.paths] == [
        "train-00000-of-00002",
        "train-00001-of-00002",
    ]
    records = [r for shard in shards.paths for r in read_records(shard)]
    assert len(records) == 32
    jpegs = set()
    for path in jpeg_files(imagenet, "train").paths:
        with open(path, "rb") as handle:
            jpegs.add(handle.read())
    # Each image's bytes are in one record (tests/harness/test_imagenet.py
    # parses them with TensorFlow, and their labels).
    assert all(sum(jpeg in r for r in records) == 1 for jpeg in jpegs)


def test_an_image_outside_a_class_folder_is_refused_naming_it(imagenet):
    stray = os.path.join(imagenet, "train", "stray.JPEG")
    with open(stray, "wb") as handle:
        handle.write(b"\xff\xd8\xff\xd9")
    with pytest.raises(DataError, match=rf"^{stray}: an image outside a class folder"):
        jpeg_files(imagenet, "train")


def test_a_flat_validation_folder_is_labelled_by_its_solution_file(imagenet):
    val = os.path.join(imagenet, "val")
    rows = ["ImageId,PredictionString"]
    for wnid in WNIDS[:4]:
        for name in sorted(os.listdir(os.path.join(val, wnid))):
            os.rename(os.path.join(val, wnid, name), os.path.join(val, name))
            rows.append(f"{os.path.splitext(name)[0]},{wnid} 1 2 3 4")
        os.rmdir(os.path.join(val, wnid))
    solution = os.path.join(imagenet, "LOC_val_solution.csv")
    with open(solution, "w") as handle:
        handle.write("\n".join(rows[:-1]) + "\n")  # the last image's row left out
    last = os.path.join(val, rows[-1].split(",")[0] + ".JPEG")
    with pytest.raises(DataError, match=rf"^{last}: no label in {solution}$"):
        jpeg_files(imagenet, "test")
    with open(solution, "a") as handle:
        handle.write(rows[-1] + "\n")
    test = jpeg_files(imagenet, "test")
    assert test.labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_missing_shard_is_refused_naming_it(imagenet):
    os.remove(os.path.join(imagenet, "validation-00001-of-00002"))
    missing = os.path.join(imagenet, "validation-00001-of-00002")
    with pytest.raises(DataError, match=rf"^{missing}: shard missing \(1 of 2 there\)$"):
        tfrecord_files(imagenet, "test")
    with pytest.raises(DataError, match="holds no train-NNNNN-of-NNNNN"):
        tfrecord_files(os.path.join(imagenet, "train"), "train")


@pytest.mark.parametrize("where", ["length", "data", "end"])
def test_a_bad_crc_or_a_cut_record_is_refused_naming_the_shard(tmp_path, where):
    path = str(tmp_path / "train-00000-of-00001")
    write_records(path, [b"first record", b"second"])
    blob = bytearray(Path(path).read_bytes())
    first = 12 + len(b"first record") + 4
    if where == "length":
        blob[first] ^= 1  # the second record's length
    elif where == "data":
        blob[first + 12] ^= 1  # its first data byte
    else:
        blob = blob[:-3]
    Path(path).write_bytes(bytes(blob))
    message = {"length": "bad length CRC", "data": "bad data CRC", "end": "truncated TFRecord"}
    with pytest.raises(DataError, match=rf"^{path}: {message[where]} .*at byte {first}$"):
        list(read_records(path))


def test_a_record_is_framed_as_tensorflow_frames_it(tmp_path):
    # length, its masked CRC, the data, the data's masked CRC; little-endian.
    path = str(tmp_path / "one")
    write_records(path, [b"abc"])
    blob = Path(path).read_bytes()
    assert struct.unpack("<Q", blob[:8]) == (3,)
    assert struct.unpack("<I", blob[8:12]) == (masked_crc(blob[:8]),)
    assert blob[12:15] == b"abc" and struct.unpack("<I", blob[15:]) == (masked_crc(b"abc"),)
    assert list(read_records(path)) == [b"abc"]
