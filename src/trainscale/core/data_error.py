"""The one error every data set reader raises (trainscale.core.datasets,
trainscale.core.text_data): a bad input, refused in one line naming its file."""


class DataError(ValueError):
    """The data set is missing, truncated or not in the expected format."""
