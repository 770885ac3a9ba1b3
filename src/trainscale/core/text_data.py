"""Text data sets for the text models: WikiText's raw release format, a
byte-level tokenizer, and the examples a GPT trains on. NumPy only.

- The release format is WikiText's raw one (Merity et al. 2016): a folder
  `wikitext-103-raw/` (or `wikitext-2-raw/`) holding `wiki.train.raw`,
  `wiki.valid.raw` and `wiki.test.raw`, UTF-8 text with ` = Title = `
  headings, or the zip archive that holds that folder.
- `python-docs` is Python's own language reference as `help()` shows it (the
  topics of the standard library's `pydoc_data`, shipped with every CPython):
  real English prose, nothing to download. write_python_docs writes it out
  in WikiText's raw format, one topic an article, so that the real reader
  reads it (as `digits` is written out in MNIST's format).
- The tokenizer is byte-level: a token is a byte of the UTF-8 text, 256 in
  all, so nothing is trained or downloaded and every text can be read.
- An example is `seq_len + 1` consecutive tokens: the inputs and, one token
  on, the targets. The token stream is cut into such windows end to end
  (consecutive windows share one token), so a split of N tokens holds
  (N - 1) // seq_len examples, and they are arrays of shape (examples,
  seq_len) as an image data set's are (examples, side, side, channels):
  the same sharding, batching and evaluation read both.
- Accuracy mode scores a text model on the validation split (its target
  is a validation perplexity); the test split stays unseen.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

from trainscale.core.data_error import DataError

BYTE_VOCABULARY = 256


@dataclass(frozen=True)
class WikiTextRelease:
    folder: str  # the folder inside the archive, and on disk
    archive: str  # "" where there is none (a written data set)
    # trainscale's split -> the file holding it: accuracy mode's held-out
    # split is WikiText's validation split.
    members = {"train": "wiki.train.raw", "test": "wiki.valid.raw"}

    def find(self, data_dir: str, dataset: str) -> str:
        """The release's folder, or its zip archive, in `data_dir` (or `data_dir` itself)."""
        first = self.members["train"]
        for folder in (data_dir, os.path.join(data_dir, self.folder)):
            if os.path.isfile(os.path.join(folder, first)):
                return folder
        archive = os.path.join(data_dir, self.archive) if self.archive else ""
        if archive and os.path.isfile(archive):
            return archive
        where = f"{self.folder}/{first}" + (f" or {self.archive}" if self.archive else "")
        raise DataError(
            f"--data-dir {data_dir!r} holds no {dataset} ({where}); put it there "
            "or use --dataset synthetic"
        )

    def _bytes(self, path: str, member: str) -> tuple[bytes, str]:
        if os.path.isdir(path):
            where = os.path.join(path, member)
            try:
                with open(where, "rb") as handle:
                    return handle.read(), where
            except FileNotFoundError:
                raise DataError(f"{path}: no {member}") from None
        where = f"{path}:{self.folder}/{member}"
        try:
            with zipfile.ZipFile(path) as archive:
                return archive.read(f"{self.folder}/{member}"), where
        except KeyError:
            raise DataError(f"{path}: no {self.folder}/{member} in the archive") from None
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise DataError(f"{path}: truncated or unreadable zip archive ({err})") from None

    def read(self, path: str, split: str, num_classes: int) -> np.ndarray:
        """The split's tokens: its UTF-8 bytes, refused if they are not UTF-8."""
        raw, where = self._bytes(path, self.members[split])
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{where}: not UTF-8 text (byte {err.start})") from None
        if len(raw) < 2:
            raise DataError(f"{where}: {len(raw)} bytes, too short to train on")
        return tokenize(raw)

    def write(self, data_dir: str, splits: dict, archive: bool = False) -> str:
        """Write {WikiText's split name (train, valid, test): text} in this
        release's format (tests, written data sets)."""
        files = {f"{self.folder}/wiki.{split}.raw": text for split, text in splits.items()}
        os.makedirs(data_dir, exist_ok=True)
        if archive:
            path = os.path.join(data_dir, self.archive)
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as handle:
                for name, text in files.items():
                    handle.writestr(name, text.encode("utf-8"))
            return path
        for name, text in files.items():
            os.makedirs(os.path.join(data_dir, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(data_dir, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        return os.path.join(data_dir, self.folder)


def tokenize(raw: bytes) -> np.ndarray:
    """Byte-level tokens: each byte of the UTF-8 text is one, 0..255."""
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int32)


def token_windows(tokens: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The examples of a token stream: (inputs, targets), each (examples, seq_len)."""
    count = (len(tokens) - 1) // seq_len
    if count < 1:
        raise DataError(f"{len(tokens)} tokens hold no sequence of {seq_len} + 1")
    starts = np.arange(count)[:, None] * seq_len + np.arange(seq_len)[None, :]
    return tokens[starts], tokens[starts + 1]


def python_docs_articles() -> list[tuple[str, str]]:
    """(topic, text) of Python's language reference, as `help(topic)` shows it."""
    from pydoc_data.topics import topics

    return sorted(topics.items())


# Python's reference, written out as a release of its own (no archive).
PYTHON_DOCS = WikiTextRelease("python-docs", "")


def write_python_docs(data_dir: str, valid_every: int = 10) -> str:
    """Python's reference topics as a WikiText-format release in `data_dir`
    /python-docs: every `valid_every`-th topic (in name order) is the
    validation split, the one after it the test split, the rest train."""
    articles = python_docs_articles()
    split_of = {valid_every - 1: "valid", 0: "test"}
    splits: dict = {"train": "", "valid": "", "test": ""}
    for index, (title, text) in enumerate(articles):
        split = split_of.get(index % valid_every, "train") if index else "train"
        splits[split] += f" = {title} = \n\n{text.strip()}\n\n"
    return PYTHON_DOCS.write(data_dir, splits)
