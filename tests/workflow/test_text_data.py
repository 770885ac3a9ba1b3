"""The text data sets' reader, on small files in WikiText's real raw format
(a folder, and the zip archive), and Python's reference written out in it."""

import zipfile

import numpy as np
import pytest

from trainscale.catalogue.settings import RunSettings, SettingsError, validate
from trainscale.core.datasets import DATASETS, DataError
from trainscale.core.text_data import python_docs_articles, token_windows, write_python_docs

TEXT = {"train": " = Zürich = \n\nA city on a lake.\n", "valid": "Held out.\n", "test": "Unseen.\n"}


@pytest.mark.parametrize("archive", [False, True], ids=["folder", "zip"])
def test_wikitext_reads_its_splits_as_utf8_bytes(tmp_path, archive):
    dataset = DATASETS["wikitext-2"]
    dataset.release.write(str(tmp_path), TEXT, archive=archive)
    if archive:
        assert (tmp_path / "wikitext-2-raw-v1.zip").exists()
        names = zipfile.ZipFile(tmp_path / "wikitext-2-raw-v1.zip").namelist()
        assert "wikitext-2-raw/wiki.train.raw" in names
    train = dataset.load(str(tmp_path))
    assert bytes(train.astype(np.uint8)) == TEXT["train"].encode("utf-8")  # ü is two tokens
    assert len(train) == len(TEXT["train"]) + 1
    # Accuracy mode's held-out split is WikiText's validation split.
    assert bytes(dataset.load(str(tmp_path), "test").astype(np.uint8)) == b"Held out.\n"


def test_a_bad_text_file_is_refused_in_one_line_naming_it(tmp_path):
    dataset = DATASETS["wikitext-103"]
    with pytest.raises(DataError, match="holds no wikitext-103 .wikitext-103-raw/wiki.train.raw"):
        dataset.load(str(tmp_path))
    folder = tmp_path / "wikitext-103-raw"
    folder.mkdir()
    (folder / "wiki.train.raw").write_bytes(b"caf\xe9 latin-1, not UTF-8")
    with pytest.raises(DataError, match=r"wiki.train.raw: not UTF-8 text \(byte 3\)"):
        dataset.load(str(tmp_path))
    (tmp_path / "wikitext-103-raw-v1.zip").write_bytes(b"PK\x03\x04 truncated")
    (folder / "wiki.train.raw").unlink()
    with pytest.raises(DataError, match="truncated or unreadable zip"):
        dataset.load(str(tmp_path))


def test_examples_are_windows_whose_targets_are_the_inputs_one_token_on():
    tokens = np.arange(10, dtype=np.int32)
    inputs, targets = token_windows(tokens, 4)
    assert inputs.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert targets.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    with pytest.raises(DataError, match="hold no sequence of 16"):
        token_windows(tokens, 16)


def test_python_docs_is_pythons_own_reference_in_wikitexts_format(tmp_path):
    folder = write_python_docs(str(tmp_path))
    articles = python_docs_articles()
    assert len(articles) > 50  # CPython 3.11 ships 79 topics
    train = DATASETS["python-docs"].load(str(tmp_path))
    valid = DATASETS["python-docs"].load(str(tmp_path), "test")
    text = bytes(train.astype(np.uint8)).decode("utf-8")
    assert text.startswith(f" = {articles[0][0]} = ")
    assert folder.endswith("python-docs") and len(valid) < len(train) // 5
    # No topic is in two splits.
    held_out = bytes(valid.astype(np.uint8)).decode("utf-8")
    titles = [line for line in held_out.splitlines() if line.startswith(" = ")]
    assert titles and not any(title in text for title in titles)


def test_a_text_model_takes_the_texts_byte_vocabulary_and_an_image_model_refuses_it():
    settings = RunSettings(framework="torch-single", model="gpt-tiny", dataset="python-docs")
    assert settings.vocab_size == 256 and settings.seq_len == 64
    with pytest.raises(SettingsError, match="--vocab-size 100 is below python-docs's 256"):
        validate(
            RunSettings(framework="torch-single", model="gpt-tiny", dataset="python-docs",
                        vocab_size=100), check_data=False)  # fmt: skip
    with pytest.raises(SettingsError, match="--model vgg16 reads images: --dataset wikitext-2"):
        validate(RunSettings(framework="horovod", model="vgg16", dataset="wikitext-2"),
                 check_data=False)  # fmt: skip
