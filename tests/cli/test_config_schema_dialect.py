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
