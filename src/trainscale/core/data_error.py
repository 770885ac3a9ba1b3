"""The one error every data set reader raises (trainscale.core.datasets,
trainscale.core.text_data): a bad input, refused in one line naming its file."""

import numpy as np


class DataError(ValueError):
    """The data set is missing, truncated or not in the expected format."""


def check_labels(labels: np.ndarray, num_classes: int, where: str) -> None:
    """Refuse labels outside 0..num_classes-1, naming `where` they came from."""
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(
            f"{where}: labels must lie in 0..{num_classes - 1}, found "
            f"{int(labels.min())}..{int(labels.max())}"
        )
