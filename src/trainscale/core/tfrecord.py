"""TFRecord files as TensorFlow writes them, in plain Python: the framing with
its CRCs, and the `tf.train.Example` protobuf that ImageNet's shards hold.

A TFRecord file is a run of records, each

    uint64 length | uint32 masked CRC-32C of length | data | uint32 masked CRC-32C of data

little-endian, where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8.
Written here so that a shard can be generated, and checked naming its file,
without TensorFlow; TensorFlow's own reader (tf.data.TFRecordDataset) reads
them for training. The pure-Python CRC is slow (a few MB/s): it is for small
generated shards and for finding which shard is bad once TensorFlow has said
one is (it names none).
"""

from __future__ import annotations

import struct

from trainscale.core.data_error import DataError


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_records(path: str, records) -> None:
    """Write `records` (bytes each) as one TFRecord file."""
    with open(path, "wb") as handle:
        for data in records:
            length = struct.pack("<Q", len(data))
            handle.write(length + struct.pack("<I", masked_crc(length)))
            handle.write(data + struct.pack("<I", masked_crc(data)))


def read_records(path: str):
    """Each record's data, its framing and both CRCs checked: a bad one is
    refused in one line naming the file and the record's offset."""
    with open(path, "rb") as handle:
        blob = handle.read()
    offset = 0
    while offset < len(blob):
        header = blob[offset : offset + 12]
        if len(header) < 12:
            raise DataError(f"{path}: truncated TFRecord header at byte {offset}")
        (length,), (length_crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
        if masked_crc(header[:8]) != length_crc:
            raise DataError(f"{path}: bad length CRC in the TFRecord at byte {offset}")
        end = offset + 12 + length
        if end + 4 > len(blob):
            raise DataError(f"{path}: truncated TFRecord at byte {offset}")
        data = blob[offset + 12 : end]
        if masked_crc(data) != struct.unpack("<I", blob[end : end + 4])[0]:
            raise DataError(f"{path}: bad data CRC in the TFRecord at byte {offset}")
        yield data
        offset = end + 4


# --------------------------------------------------------------------------
# tf.train.Example: Features { map<string, Feature> feature = 1 }, a Feature
# one of bytes_list (1), float_list (2) or int64_list (3), each `repeated
# value = 1`. Only what ImageNet's shards use: bytes and int64.
# --------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64s as two's complement, as protobuf does
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value) -> bytes:
    values = value if isinstance(value, list) else [value]
    if all(isinstance(v, bytes) for v in values):
        return _field(1, b"".join(_field(1, v) for v in values))
    if all(isinstance(v, int) for v in values):
        return _field(3, _field(1, b"".join(_varint(v) for v in values)))  # packed
    raise TypeError(f"a feature holds bytes or ints, not {values!r}")


def example(features: dict) -> bytes:
    """A serialized tf.train.Example of {name: bytes | int | list of either}."""
    entries = (
        _field(1, _field(1, name.encode()) + _field(2, _feature(value)))
        for name, value in sorted(features.items())
    )
    return _field(1, b"".join(entries))
