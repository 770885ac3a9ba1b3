import os
import sys

sys.stderr = open(snakemake.log[0], "w")

from trainscale.core.text_data import write_python_docs

# The outputs are DATA_DIR/python-docs/wiki.*.raw: the data folder is two up.
write_python_docs(os.path.dirname(os.path.dirname(snakemake.output[0])))
