"""`dllm config schema` for editors: it declares its dialect (JSON Schema 2020-12, which
pydantic writes: `$defs`, `prefixItems`). Without `$schema` a validator or editor that assumes
draft-07 ignored `prefixItems` and accepted `optimizer.betas: [a, b]`, which validate refuses."""

from __future__ import annotations

import json

import pytest

from turbo_dllm.config.bounded_yaml import parse_yaml
from turbo_dllm.config.recipe_catalog import list_recipes


def test_the_schema_declares_the_dialect_it_is_written_in(cli):
    schema = json.loads(cli("config", "schema").out)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "prefixItems" in json.dumps(schema)  # a 2020-12 keyword: the declaration is needed


def test_every_recipe_validates_against_the_schema_and_bad_betas_do_not(cli):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(cli("config", "schema").out)
    validator_class = jsonschema.validators.validator_for(schema, default=None)
    assert validator_class is jsonschema.Draft202012Validator
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    for recipe in list_recipes():
        errors = [e.message for e in validator.iter_errors(parse_yaml(recipe.text, recipe.name))]
        assert errors == [], recipe.name
    assert not validator.is_valid({"optimizer": {"betas": ["a", "b"]}})


def test_the_prepare_schema_declares_its_dialect_and_takes_the_starter_s_prepare_yaml(
    cli, tmp_path
):
    """`dllm data schema` (for editors, like `config schema`): the same dialect declared, and
    the prepare.yaml that `dllm init` writes is valid under it, as an editor would check."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(cli("data", "schema").out)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    validator_class = jsonschema.validators.validator_for(schema, default=None)
    assert validator_class is jsonschema.Draft202012Validator
    validator_class.check_schema(schema)
    assert cli("init", str(tmp_path / "starter")).code == 0
    prepare = tmp_path / "starter" / "prepare.yaml"
    document = parse_yaml(prepare.read_text(), str(prepare))
    assert [e.message for e in validator_class(schema).iter_errors(document)] == []
    assert not validator_class(schema).is_valid({**document, "packing": {"seq_len": "long"}})
