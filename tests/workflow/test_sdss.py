"""SDSS DR17's stellar classification table (trainscale.core.sdss), on small
files written with the release's columns: read, split, standardised, and
each kind of bad file refused in one line naming it. NumPy only."""

import csv

import numpy as np
import pytest

from trainscale.core.datasets import DATASETS, DataError, load_dataset
from trainscale.core.sdss import CLASSES, COLUMNS, FEATURES, FILE, read_table, write_sdss


def rewrite(path, change) -> None:
    """The file's rows (header first), changed in place by `change`."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    change(rows)
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)


def test_rows_become_standardised_1x1_inputs_of_8_features_split_one_in_five(tmp_path):
    write_sdss(str(tmp_path), 101)
    features, labels = read_table(str(tmp_path / FILE))
    # write_sdss's second row lacks its u magnitude (-9999): dropped, no other.
    assert len(features) == len(labels) == 100
    train, train_labels = load_dataset("sdss17", str(tmp_path), "train")
    test, test_labels = load_dataset("sdss17", str(tmp_path), "test")
    assert train.shape == (80, 1, 1, len(FEATURES)) and test.shape == (20, 1, 1, len(FEATURES))
    assert train.dtype == test.dtype == np.float32 and train_labels.dtype == np.int32
    # Standardised with the training split's statistics, so the training
    # split's mean is 0 and deviation 1, and the test split's is not exactly 0.
    flat = train.reshape(len(train), -1)
    assert np.allclose(flat.mean(axis=0), 0, atol=1e-5) and np.allclose(flat.std(axis=0), 1)
    assert not np.allclose(test.reshape(len(test), -1).mean(axis=0), 0, atol=1e-3)
    # Every row lands in exactly one split, with its own class.
    assert sorted(np.concatenate([train_labels, test_labels])) == sorted(labels)
    assert set(np.concatenate([train_labels, test_labels])) <= set(range(len(CLASSES)))
    assert DATASETS["sdss17"].class_names(str(tmp_path)) == ["GALAXY", "QSO", "STAR"]
    # The identifiers do not reach the features: changing them changes nothing.
    before = load_dataset("sdss17", str(tmp_path), "test")[0]

    def renumber(rows):
        for row in rows[1:]:
            for name in ("obj_ID", "run_ID", "plate", "MJD", "fiber_ID"):
                row[COLUMNS.index(name)] = "7"

    rewrite(tmp_path / FILE, renumber)
    assert np.array_equal(load_dataset("sdss17", str(tmp_path), "test")[0], before)


def test_the_redshift_is_read_from_its_column(tmp_path):
    """Stars have redshift near 0, quasars beyond 0.8 (write_sdss, as in the
    survey): the column read as `redshift` tells them apart."""
    write_sdss(str(tmp_path), 60)
    features, labels = read_table(str(tmp_path / FILE))
    redshift = features[:, FEATURES.index("redshift")]
    assert np.all(np.abs(redshift[labels == CLASSES.index("STAR")]) < 0.01)
    assert np.all(redshift[labels == CLASSES.index("QSO")] > 0.79)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda rows: [row.pop(COLUMNS.index("redshift")) for row in rows], "no column redshift"),
        (lambda rows: rows[3].__setitem__(COLUMNS.index("class"), "PLANET"), ":4: unknown class"),
        (lambda rows: rows[5].__setitem__(COLUMNS.index("g"), "bright"), ":6: a feature is"),
        (lambda rows: rows[7].__delitem__(slice(4, None)), ":8: a feature is missing"),
    ],
    ids=["missing column", "unknown class", "not a number", "short row"],
)
def test_a_bad_file_is_refused_in_one_line_naming_it(tmp_path, change, message):
    write_sdss(str(tmp_path), 20)
    rewrite(tmp_path / FILE, change)
    with pytest.raises(DataError) as refused:
        load_dataset("sdss17", str(tmp_path))
    text = str(refused.value)
    assert str(tmp_path / FILE) in text and message in text and "\n" not in text


def test_a_missing_file_names_the_option(tmp_path):
    with pytest.raises(DataError, match="--data-dir .* holds no star_classification.csv"):
        load_dataset("sdss17", str(tmp_path))
