import json
import os

import pytest

from trainscale.records import SCHEMA_VERSION, atomic_write_json, read_record


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "runs" / "r.json"
    atomic_write_json(str(path), {"schema": SCHEMA_VERSION, "value": 1})
    atomic_write_json(str(path), {"schema": SCHEMA_VERSION, "value": 2})
    assert read_record(str(path))["value"] == 2
    assert os.listdir(path.parent) == ["r.json"]


def test_failed_write_keeps_the_old_record(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(str(path), {"schema": SCHEMA_VERSION, "value": 1})
    with pytest.raises(TypeError):
        atomic_write_json(str(path), {"schema": SCHEMA_VERSION, "value": object()})
    assert json.loads(path.read_text())["value"] == 1
    assert os.listdir(tmp_path) == ["r.json"]


def test_unknown_schema_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": 99}))
    with pytest.raises(ValueError, match="unknown record schema 99"):
        read_record(str(path))


def test_atomic_writes_get_the_mode_of_any_new_file(tmp_path):
    # mkstemp's private 0600 would hide results from colleagues on a shared cluster.
    path = tmp_path / "r.json"
    old = os.umask(0o027)
    try:
        atomic_write_json(str(path), {"schema": SCHEMA_VERSION})
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)
