"""The study config's JSON schema, made from the schema file and the settings'
declarations, and a config checked against it.

workflow/schemas/config.schema.yaml holds what only a study config has (its
sections, names safe in a path, the cluster); config_schema fills in what
the settings' declarations say (trainscale.core.setting), so the schema and the
settings cannot disagree. Errors are one line naming the key (ConfigError).
"""

from __future__ import annotations

import copy

from trainscale.catalogue.settings import SETTING, all_settings
from trainscale.core.setting import renamed
from trainscale.study.study import SAFE_NAME, ConfigError


def _key(path) -> str:
    key = ""
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or "(top level)"


def config_schema(path: str, cached: bool = False) -> dict:
    """The study config's JSON schema: the file at `path`, with what the
    settings' declarations say filled in (trainscale.core.setting): the framework
    and model names, every setting's `benchmark:` key (type, bounds, default,
    help), and every knob as an axis of the grid and of a constraint clause.

    `cached`: the config of a study folder of cached records (study_folder.
    is_cache), which may name frameworks trainscale does not run (seed 004's
    Ray Train): nothing of theirs is ever run, only their records read."""
    import yaml

    with open(path) as handle:
        schema = yaml.safe_load(handle)
    defs, properties = schema["$defs"], schema["properties"]
    defs["framework"] = SETTING["framework"].schema()
    if cached:
        defs["framework"] = {"type": "string", "pattern": SAFE_NAME.pattern}
    defs["model"] = SETTING["model"].schema()
    benchmark = properties["benchmark"]["properties"]
    for setting in all_settings():
        if setting.in_study:
            benchmark[setting.name] = {
                **setting.schema(),
                "default": setting.default,
                "description": setting.help,
            }
        if setting.axis:
            properties["grid"]["properties"][setting.name] = {
                "type": "array",
                "minItems": 1,
                "items": setting.schema(),
                "description": f"a knob axis: {setting.help}",
            }
            defs["clause"]["properties"][setting.name] = {"$ref": "#/$defs/condition"}
    return schema


def check_schema(config: dict, schema: dict) -> None:
    """Validate against the JSON schema; raise ConfigError with the most relevant error."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        message = error.message
        if error.validator == "pattern":
            message = f"{error.instance!r} has characters that are not safe in a path or a shell"
        raise ConfigError(f"config key {_key(error.absolute_path)}: {message}")


def validate_config(config: dict, schema: dict) -> dict:
    """check_schema, then the schema's defaults filled into `config` where a key
    is missing (as snakemake.utils.validate does, which reads schemas from
    files only); returns the config."""
    import jsonschema

    # A study written with a setting's former name (benchmark.iterations) reads as now.
    if isinstance(config.get("benchmark"), dict):
        config["benchmark"] = renamed(config["benchmark"], all_settings())
    check_schema(config, schema)
    properties = jsonschema.Draft202012Validator.VALIDATORS["properties"]

    def with_defaults(validator, subschemas, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in subschemas.items():
                if "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from properties(validator, subschemas, instance, schema)

    filling = jsonschema.validators.extend(
        jsonschema.Draft202012Validator, {"properties": with_defaults}
    )
    filling(schema).validate(config)
    return config
