"""The Sloan Digital Sky Survey's DR17 stellar classification table (seed 004's
third data set): a safe reader of its CSV, and a writer of small files in its
format for the tests.

The table (`star_classification.csv`, 100,000 spectra) has one row per object
and these columns:

    obj_ID, alpha, delta, u, g, r, i, z, run_ID, rerun_ID, cam_col, field_ID,
    spec_obj_ID, class, redshift, plate, MJD, fiber_ID

`class` is GALAXY, QSO or STAR. The survey's identifiers (the `_ID` columns,
the camera column, plate, MJD and fibre) name where and when an object was
observed, not what it is: they are dropped. The features are what remains:
the sky position (alpha, delta), the five ugriz magnitudes and the redshift,
standardised with the training split's mean and deviation. One row of the
release has -9999 for magnitudes it lacks (SDSS's "no measurement"): such
rows are dropped, and no others.

A row of 8 features is a 1x1 "image" of 8 channels (native side 1), so the
pipelines, sharding and accuracy mode of both ecosystems carry it unchanged
and its model flattens it (the `mlp`). The release has no test split: every
fifth row of a fixed shuffle is the test split, the rest train.

A bad file is refused in one line naming it (DataError): a missing column, an
unknown class, a value that is not a number.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from trainscale.core.data_error import DataError

FILE = "star_classification.csv"
COLUMNS = (
    "obj_ID", "alpha", "delta", "u", "g", "r", "i", "z", "run_ID", "rerun_ID", "cam_col",
    "field_ID", "spec_obj_ID", "class", "redshift", "plate", "MJD", "fiber_ID",
)  # fmt: skip
FEATURES = ("alpha", "delta", "u", "g", "r", "i", "z", "redshift")
CLASSES = ("GALAXY", "QSO", "STAR")  # label = index
MAGNITUDES = ("u", "g", "r", "i", "z")
NO_MEASUREMENT = -9999.0
TEST_EVERY = 5


class SdssRelease:
    """The release as one CSV file; `find` and `read` as the other releases'."""

    def find(self, data_dir: str, dataset: str) -> str:
        """The folder holding star_classification.csv: `data_dir` or `data_dir`/<dataset>."""
        for folder in (data_dir, os.path.join(data_dir, dataset)):
            if os.path.isfile(os.path.join(folder, FILE)):
                return folder
        raise DataError(
            f"--data-dir {data_dir!r} holds no {FILE} (SDSS DR17's stellar classification "
            f"table), there or in {dataset}/; put it there or use --dataset synthetic"
        )

    def class_names(self, folder: str, num_classes: int) -> list[str]:
        return list(CLASSES)

    def read(self, folder: str, split: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
        """A split as (N, 1, 1, 8) float32 standardised features and (N,) int32 labels."""
        features, labels = read_table(os.path.join(folder, FILE))
        test = np.zeros(len(labels), bool)
        test[np.random.default_rng(0).permutation(len(labels))[::TEST_EVERY]] = True
        train = features[~test]
        mean, std = train.mean(axis=0), train.std(axis=0)
        std[std == 0] = 1.0  # a constant column stays 0, not NaN
        chosen = test if split == "test" else ~test
        standardised = ((features[chosen] - mean) / std).astype(np.float32)
        return standardised[:, None, None, :], labels[chosen]


def read_table(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Every measured row's features (float64, FEATURES' order) and class index."""
    try:
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            missing = [name for name in (*FEATURES, "class") if name not in header]
            if missing:
                raise DataError(
                    f"{path}: no column {', '.join(missing)}; SDSS DR17's table has "
                    f"{', '.join(COLUMNS)}"
                )
            where = [header.index(name) for name in FEATURES]
            label_at = header.index("class")
            rows, labels = [], []
            for line, row in enumerate(reader, start=2):
                rows.append(_numbers(row, where, path, line))
                labels.append(_class_index(row, label_at, path, line))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"{path}: {err}") from err
    if not rows:
        raise DataError(f"{path}: no rows")
    features, labels = np.array(rows), np.array(labels, np.int32)
    magnitudes = [FEATURES.index(name) for name in MAGNITUDES]
    measured = (features[:, magnitudes] != NO_MEASUREMENT).all(axis=1)
    return features[measured], labels[measured]


def _numbers(row: list[str], where: list[int], path: str, line: int) -> list[float]:
    try:
        return [float(row[index]) for index in where]
    except (ValueError, IndexError):
        raise DataError(f"{path}:{line}: a feature is missing or not a number") from None


def _class_index(row: list[str], at: int, path: str, line: int) -> int:
    name = row[at].strip() if at < len(row) else ""
    if name not in CLASSES:
        known = ", ".join(CLASSES)
        raise DataError(f"{path}:{line}: unknown class {name!r}; SDSS DR17's are {known}")
    return CLASSES.index(name)


def write_sdss(data_dir: str, num_rows: int, seed: int = 0) -> str:
    """A small star_classification.csv with the release's columns, its three
    classes told apart as the real ones are, mostly by redshift (stars near 0,
    galaxies to about 1, quasars beyond), and one row without a u magnitude."""
    rng = np.random.default_rng(seed)
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, FILE)
    redshift = {"GALAXY": (0.05, 0.8), "QSO": (0.8, 4.0), "STAR": (-0.001, 0.001)}
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for row in range(num_rows):
            kind = CLASSES[rng.integers(len(CLASSES))]
            magnitudes = rng.uniform(15, 25, size=5)
            if row == 1:
                magnitudes[0] = NO_MEASUREMENT
            values = {
                "obj_ID": 1237660000000000000 + row, "alpha": rng.uniform(0, 360),
                "delta": rng.uniform(-20, 80), **dict(zip(MAGNITUDES, magnitudes)),
                "run_ID": rng.integers(100, 8200), "rerun_ID": 301, "cam_col": rng.integers(1, 7),
                "field_ID": rng.integers(11, 990), "spec_obj_ID": 10**18 + row, "class": kind,
                "redshift": rng.uniform(*redshift[kind]), "plate": rng.integers(266, 12548),
                "MJD": rng.integers(51608, 58933), "fiber_ID": rng.integers(1, 1001),
            }  # fmt: skip
            writer.writerow([values[name] for name in COLUMNS])
    return data_dir
