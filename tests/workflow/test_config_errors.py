"""Bad study configurations: one clear line naming the key, before anything runs."""

import copy
import os

import pytest
import yaml
from conftest import CACHED_STUDIES, REPO, snakemake, train_jobs

from trainscale.study.jobs import environment_prefix, network_environment
from trainscale.study.schema import check_schema, config_schema, validate_config
from trainscale.study.study import ConfigError, check_config, run_settings

SCHEMA = config_schema(os.path.join(REPO, "workflow", "schemas", "config.schema.yaml"))


def base():
    return {
        "study": "tiny",
        "reference": None,
        "grid": {
            "framework": ["horovod", "tf-single"],
            "nodes": [1, 2],
            "gpus_per_node": [1, 2],
            "model": ["small_cnn"],
            "batch_size": [16],
        },
        "constraints": {
            "max_total_gpus": 4,
            "exclude": [
                {"framework": "tf-single", "nodes": {"min": 2}},
                {"framework": "tf-single", "gpus_per_node": {"min": 2}},
            ],
        },
        "benchmark": {"dataset": "synthetic", "image_size": 32, "device": "cpu"},
        "cluster": {"partition": "gpu", "account": "proj-1"},
    }


def check(config):
    check_schema(config, SCHEMA)
    return check_config(config, root=REPO)


def test_only_a_cache_may_name_a_framework_trainscale_does_not_run():
    # Seed 004 cached Ray Train before trainscale ran it: a cache's records are
    # read, never produced, so its grid may name any framework (safe names only).
    config = base()
    config["grid"]["framework"] = ["horovod", "caffe2"]
    cached = config_schema(os.path.join(REPO, "workflow", "schemas", "config.schema.yaml"), True)
    validate_config(copy.deepcopy(config), cached)
    assert {p.framework for p in check_config(config, root=REPO, cached=True)} == {
        "horovod",
        "caffe2",
    }
    config["grid"]["framework"] = ["horovod", "caffe2; rm -rf /"]
    with pytest.raises(ConfigError, match="grid.framework"):
        check_schema(config, cached)


def test_the_base_config_is_valid():
    assert len(check(base())) == 5  # horovod on n1g1, n1g2, n2g1, n2g2 + tf-single


def test_every_knob_is_an_axis_of_the_grid_and_of_a_constraint():
    # Once the schema's clause lacked the torch knobs, and refused an
    # exclusion the grid applies; now both come from one declaration.
    config = base()
    config["grid"]["framework"] = ["torch-ddp", "horovod"]
    config["grid"]["ddp_compression"] = ["none", "fp16"]
    config["constraints"]["exclude"] = [{"ddp_compression": "fp16", "nodes": 2}]
    stems = {p.stem() for p in check(config)}
    assert "torch-ddp/small_cnn/b16/ddp_compression=fp16/n1g2r1" in stems
    assert "torch-ddp/small_cnn/b16/ddp_compression=none/n2g2r1" in stems
    assert not any("ddp_compression=fp16/n2" in stem for stem in stems)


def test_a_study_that_leaves_settings_out_measures_their_defaults():
    from trainscale.catalogue.settings import RunSettings
    from trainscale.study.study import run_settings

    config = validate_config(base(), SCHEMA)
    point = check_config(config, root=REPO)[0]
    default = RunSettings(framework=point.framework, model="small_cnn", batch_size=16,
                          image_size=32, dataset="synthetic", device="cpu")  # fmt: skip
    assert run_settings(config, point) == default


def test_a_study_written_with_the_former_block_names_reads_as_now():
    config = base()
    config["benchmark"].update(iterations=3, steps_per_iteration=4)
    checked = validate_config(config, SCHEMA)
    assert (checked["benchmark"]["blocks"], checked["benchmark"]["steps_per_block"]) == (3, 4)
    assert "iterations" not in checked["benchmark"]


def edit(path, value):
    def apply(config):
        *parents, last = path
        node = config
        for key in parents:
            node = node[key]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
        return config

    return apply


DELETE = object()

BAD = [
    # (what is wrong, edit, text the message must contain)
    (
        "unknown framework",
        edit(["grid", "framework"], ["horovod", "pytorch"]),
        "config key grid.framework[1]: 'pytorch' is not one of",
    ),
    (
        # Only a cached study may name one (test_only_a_cache_may_name_...).
        "a framework trainscale does not run, in a study it would train",
        edit(["grid", "framework"], ["horovod", "caffe2"]),
        "config key grid.framework[1]: 'caffe2' is not one of",
    ),
    (
        "no data set in benchmark or the grid",
        edit(["benchmark", "dataset"], DELETE),
        "config key benchmark: 'dataset' is a required property",
    ),
    ("unknown model", edit(["grid", "model"], ["alexnet"]), "config key grid.model[0]"),
    ("zero nodes", edit(["grid", "nodes"], [0, 1]), "config key grid.nodes[0]: 0 is less than"),
    ("negative gpus", edit(["grid", "gpus_per_node"], [-1]), "config key grid.gpus_per_node[0]"),
    ("zero batch", edit(["grid", "batch_size"], [0]), "config key grid.batch_size[0]"),
    ("batch as text", edit(["grid", "batch_size"], ["64"]), "config key grid.batch_size[0]"),
    ("empty frameworks", edit(["grid", "framework"], []), "config key grid.framework"),
    ("empty nodes", edit(["grid", "nodes"], []), "config key grid.nodes"),
    ("nodes not a list", edit(["grid", "nodes"], 2), "config key grid.nodes"),
    ("zero repeats", edit(["grid", "repeats"], 0), "config key grid.repeats"),
    ("missing grid axis", edit(["grid", "model"], DELETE), "'model' is a required property"),
    ("unknown grid key", edit(["grid", "colour"], ["red"]), "config key grid"),
    (
        "duplicate nodes",
        edit(["grid", "nodes"], [1, 2, 1]),
        "config key grid.nodes: duplicate values [1]",
    ),
    (
        "duplicate frameworks",
        edit(["grid", "framework"], ["horovod", "horovod"]),
        "config key grid.framework: duplicate values ['horovod']",
    ),
    (
        "cap excludes everything",
        edit(["constraints", "max_total_gpus"], 0),
        "config key constraints.max_total_gpus",
    ),
    (
        "exclusions leave nothing",
        edit(["constraints", "exclude"], [{"nodes": {"min": 1}}]),
        "config key constraints: the constraints leave no run",
    ),
    (
        "unknown clause axis",
        edit(["constraints", "exclude"], [{"colour": "red"}]),
        "config key constraints.exclude[0]",
    ),
    (
        "unknown precision axis value",
        edit(["grid", "precision"], ["fp8"]),
        "config key grid.precision[0]",
    ),
    ("xla axis as text", edit(["grid", "xla"], ["yes"]), "config key grid.xla[0]"),
    (
        "empty knob axis",
        edit(["grid", "horovod_compression"], []),
        "config key grid.horovod_compression",
    ),
    (
        "duplicate knob values",
        edit(["grid", "horovod_fusion_threshold_mb"], [64, 64]),
        "config key grid.horovod_fusion_threshold_mb: duplicate values [64]",
    ),
    (
        "negative image size",
        edit(["benchmark", "image_size"], -1),
        "config key benchmark.image_size",
    ),
    (
        "image below the model's minimum",
        edit(["benchmark", "image_size"], 8),
        "--image-size 8 is below small_cnn's minimum of 16",
    ),
    ("unknown device", edit(["benchmark", "device"], "tpu"), "config key benchmark.device"),
    (
        "unknown compression",
        edit(["benchmark", "horovod_compression"], "gzip"),
        "config key benchmark.horovod_compression",
    ),
    (
        "negative fusion buffer",
        edit(["benchmark", "horovod_fusion_threshold_mb"], -1),
        "config key benchmark.horovod_fusion_threshold_mb",
    ),
    ("unknown dataset", edit(["benchmark", "dataset"], "imagenet"), "config key benchmark.dataset"),
    ("zero iterations", edit(["benchmark", "blocks"], 0), "config key benchmark.blocks"),
    (
        "negative learning rate",
        edit(["benchmark", "learning_rate"], -0.1),
        "config key benchmark.learning_rate",
    ),
    (
        "study with ../",
        edit(["study"], "../etc"),
        "config key study: '../etc' has characters that are not safe",
    ),
    ("study with a slash", edit(["study"], "a/b"), "config key study"),
    ("study with a space", edit(["study"], "my study"), "config key study"),
    (
        "partition with a shell command",
        edit(["cluster", "partition"], "gpu; touch pwned"),
        "config key cluster.partition: 'gpu; touch pwned' has characters that are not safe",
    ),
    ("account with backticks", edit(["cluster", "account"], "`id`"), "config key cluster.account"),
    (
        "data dir with a dollar",
        edit(["benchmark", "data_dir"], "$HOME/data"),
        "config key benchmark.data_dir",
    ),
    (
        "reference study missing",
        edit(["reference"], "no-such-study"),
        "config key reference: study 'no-such-study' has no cached records",
    ),
    (
        "reference is itself",
        edit(["reference"], "tiny"),
        "config key reference: a study cannot be its own reference",
    ),
    (
        "tf-mirrored across nodes",
        edit(["grid", "framework"], ["tf-mirrored"]),
        "tf-mirrored runs on one node",
    ),
    (
        "unknown knob value in a constraint's axis",
        edit(["constraints", "exclude"], [{"ddp_compressio": "fp16"}]),
        "config key constraints.exclude[0]",
    ),
]


@pytest.mark.parametrize(("what", "change", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_one_line_naming_the_key(what, change, expected):
    config = change(copy.deepcopy(base()))
    with pytest.raises(ConfigError) as info:
        check(config)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


SNAKEMAKE_CASES = [
    ("unknown framework", edit(["grid", "framework"], ["pytorch"]), "grid.framework[0]"),
    ("unsafe partition", edit(["cluster", "partition"], "gpu; touch pwned"), "cluster.partition"),
    ("study escaping results/", edit(["study"], "../outside"), "config key study"),
    ("cap excludes everything", edit(["constraints", "max_total_gpus"], 0), "max_total_gpus"),
]


# How Snakemake is started: a real run, a dry run, the SLURM profile's dry
# run. The refusal comes from the Snakefile's validation, the same for every
# bad key: every case in a real run, the first in the others too.
MODES = [["--cores", "1"], ["-n"], ["-n", "--profile", "profiles/slurm"]]
STARTS = [(case, MODES[0]) for case in SNAKEMAKE_CASES] + [
    (SNAKEMAKE_CASES[0], mode) for mode in MODES[1:]
]


@pytest.mark.parametrize(
    ("case", "mode"), STARTS, ids=[f"{c[0]} ({' '.join(m)})" for c, m in STARTS]
)
def test_snakemake_stops_before_anything_runs(repo_copy, case, mode):
    _, change, key = case
    config = change(copy.deepcopy(base()))
    path = os.path.join(repo_copy, "bad.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    result = snakemake(repo_copy, *mode, "--configfile", "bad.yaml", timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Invalid study configuration: config key" in output and key in output
    assert train_jobs(output) == 0
    assert not os.path.exists(os.path.join(repo_copy, "pwned"))
    assert sorted(os.listdir(os.path.join(repo_copy, "results"))) == sorted(CACHED_STUDIES)
    assert not os.path.exists(os.path.join(os.path.dirname(repo_copy), "outside"))


ETHERNET = {"environment": {"GLOO_SOCKET_IFNAME": "eth1", "OMPI_MCA_btl_tcp_if_include": "eth1"}}


def test_a_network_the_cluster_does_not_define_is_refused_naming_those_it_does():
    # A network is selected by its environment (the interface each library
    # uses); a name the cluster config does not define would select nothing.
    config = base()
    config["cluster"]["networks"] = {"eth": copy.deepcopy(ETHERNET)}
    config["grid"]["network"] = ["eth", "ib"]
    with pytest.raises(ConfigError, match=r"grid\.network: network 'ib' is not one "
                       r"cluster\.networks defines \(it defines: eth\)"):  # fmt: skip
        check(config)
    del config["grid"]["network"]
    config["benchmark"]["network"] = "ib"
    with pytest.raises(ConfigError, match=r"benchmark\.network: network 'ib'"):
        check(config)
    config["benchmark"]["network"] = "eth"
    assert check(config)
    # "default" is the default route's folder (probe.DEFAULT_NETWORK): not a name to take.
    named_default = copy.deepcopy(config)
    named_default["cluster"]["networks"]["default"] = copy.deepcopy(ETHERNET)
    with pytest.raises(ConfigError, match="cluster.networks: 'default' should not be valid"):
        check(named_default)
    config["cluster"]["networks"]["eth"]["environment"]["GLOO_SOCKET_IFNAME"] = "eth1; rm -rf /"
    with pytest.raises(ConfigError, match="cluster.networks.eth.environment.GLOO_SOCKET_IFNAME"):
        check(config)


def test_the_probes_link_in_predict_needs_the_probe():
    config = base()
    config["predict"] = {"link": "probe"}
    with pytest.raises(ConfigError, match=r"predict\.link: probe needs probe\.enabled: true"):
        check(config)
    config["probe"] = {"enabled": True}
    assert check(config)


def test_each_network_of_the_grid_runs_with_its_own_environment():
    config = base()
    config["cluster"]["networks"] = {
        "eth": ETHERNET,
        "ib": {"environment": {"NCCL_IB_HCA": "mlx5"}},
    }
    config["grid"]["network"] = ["eth", "ib"]
    points = check(config)
    networks = {
        p.knobs: network_environment(config, run_settings(config, p).network) for p in points
    }
    assert networks[(("network", "eth"),)] == ETHERNET["environment"]
    assert networks[(("network", "ib"),)] == {"NCCL_IB_HCA": "mlx5"}
    assert environment_prefix(ETHERNET["environment"]) == (
        "env GLOO_SOCKET_IFNAME=eth1 OMPI_MCA_btl_tcp_if_include=eth1 "
    )
    assert network_environment(config, "") == {} and environment_prefix({}) == ""
