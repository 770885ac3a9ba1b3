"""The input-pipeline table (trainscale.analysis.input_report) from run
records: each decoded point beside its synthetic run, the decode-only rate
and input-bound. No training here: the CPU study that makes them runs dry
in tests/workflow/test_dry_run.py, a decoded-input run of each ecosystem in
tests/harness/test_imagenet.py and tests/torch/test_imagenet.py."""

import math
import os

from trainscale.analysis.input_report import input_pipeline_table, write_input_pipeline
from trainscale.core.records import SCHEMA_VERSION


def record(framework, dataset, rate, pipeline=None, workers=2, gpus=2):
    fields = {
        "framework": framework, "model": "small_cnn", "batch_size": 16, "image_size": 96,
        "nodes": 1, "gpus_per_node": gpus, "dataset": dataset, "status": "ok",
        "settings": {"loader_workers": workers}, "images_per_sec": {"mean": rate},
    }  # fmt: skip
    if pipeline is not None:
        fields.update(input_pipeline_images_per_sec=pipeline, input_bound=pipeline < 1.1 * rate)
    return fields


RECORDS = [
    record("horovod", "synthetic", 400.0),
    record("horovod", "imagenet-jpeg", 300.0, pipeline=310.0),
    record("horovod", "imagenet-tfrecord", 350.0, pipeline=900.0),
    record("torch-ddp", "synthetic", 500.0),
    record("torch-ddp", "imagenet-jpeg", 250.0, pipeline=260.0),
    record("torch-ddp", "imagenet-jpeg", 150.0, pipeline=600.0, gpus=1),  # no synthetic twin
    {**record("torch-ddp", "imagenet-jpeg", 0.0), "status": "failed"},
]


def test_each_decoded_point_sits_beside_its_synthetic_run():
    table = input_pipeline_table(RECORDS)
    got = {
        (row.framework, row.dataset, row.gpus_per_node): (
            row.images_per_sec, row.synthetic_images_per_sec, row.of_synthetic,
            row.input_pipeline_images_per_sec, bool(row.input_bound),
        )
        for row in table.itertuples()
    }  # fmt: skip
    assert set(got) == {
        ("horovod", "imagenet-jpeg", 2),
        ("horovod", "imagenet-tfrecord", 2),
        ("torch-ddp", "imagenet-jpeg", 1),
        ("torch-ddp", "imagenet-jpeg", 2),
    }  # no synthetic rows, no failed run
    assert got[("horovod", "imagenet-jpeg", 2)] == (300.0, 400.0, 0.75, 310.0, True)
    assert got[("horovod", "imagenet-tfrecord", 2)] == (350.0, 400.0, 0.875, 900.0, False)
    assert got[("torch-ddp", "imagenet-jpeg", 2)] == (250.0, 500.0, 0.5, 260.0, True)
    one = got[("torch-ddp", "imagenet-jpeg", 1)]
    assert math.isnan(one[1]) and math.isnan(one[2])  # nothing to compare with


def test_the_table_and_figure_are_written(tmp_path):
    import json

    paths = []
    for index, fields in enumerate(RECORDS):
        path = tmp_path / f"{index}.json"
        path.write_text(json.dumps({**fields, "schema": SCHEMA_VERSION}))
        paths.append(str(path))
    figures = [str(tmp_path / "input_pipeline.png"), str(tmp_path / "input_pipeline.pdf")]
    write_input_pipeline(paths, str(tmp_path), figures)
    markdown = (tmp_path / "input_pipeline.md").read_text()
    assert "decode only (images/sec)" in markdown and "input-bound" in markdown
    assert all(os.path.getsize(path) > 0 for path in figures)
