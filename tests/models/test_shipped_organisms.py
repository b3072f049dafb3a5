"""The shipped organisms (trl_nca/resources/organisms): every machine evaluates the same weights, a damaged file is
refused, and a cached organism whose weights differ from the shipped ones is rebuilt from them, never used."""

import dataclasses
import json
import shutil

import pytest


def test_every_shipped_organism_matches_its_manifest_and_its_spec():
    from trl_nca.models import shipped
    from trl_nca.models.organism import DIALECTS, shipped_spec

    entries = shipped.read_manifest()["organisms"]
    assert sum(e["file"].startswith("organism-rules-") for e in entries.values()) >= 8
    for name, entry in entries.items():
        dialect, seed = name.split("-")[1], int(name.split("-s")[-1])
        assert dialect in DIALECTS and entry["file"] == f"{name}.safetensors"
        spec = shipped_spec(dialect, seed)
        assert entry["key"] == spec.key() and entry["spec"] == dataclasses.asdict(spec) | {
            "rule_counts": list(spec.rule_counts),
            "fact_counts": list(spec.fact_counts),
        }
        assert shipped.file_sha256(shipped.RESOURCE_DIR / entry["file"]) == entry["sha256"]
        assert shipped.weights_digest(shipped.load_reference(entry)) == entry["weights_digest"]


def test_the_alias_resolves_to_the_shipped_weights_without_pretraining(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from trl_nca.models import organism, shipped

    monkeypatch.setenv("TRL_NCA_CACHE", str(tmp_path))
    monkeypatch.setattr(organism, "pretrain", lambda *a, **k: pytest.fail("a shipped organism is never pretrained"))
    path = organism.organism_model_path(organism.shipped_spec("rules", 1))
    entry = shipped.entry_for_key(organism.shipped_spec("rules", 1).key())
    assert shipped.weights_digest(load_file(f"{path}/model.safetensors")) == entry["weights_digest"]
    assert json.loads((tmp_path / path.split("/")[-1] / "organism.json").read_text())["shipped"] == entry["file"]
    from trl_nca.models.names import resolve_model_name_or_path

    assert resolve_model_name_or_path("organism") == organism.organism_model_path(organism.shipped_spec("rules", 0))


def test_a_cached_organism_with_other_weights_is_rebuilt_from_the_shipped_ones(tmp_path, monkeypatch, caplog):
    import torch
    from safetensors.torch import load_file, save_file

    from trl_nca.models import organism, shipped

    monkeypatch.setenv("TRL_NCA_CACHE", str(tmp_path))
    spec = organism.shipped_spec("rules", 2)
    path = organism.organism_model_path(spec)
    weights = load_file(f"{path}/model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3  # e.g. an organism pretrained on this machine before organisms shipped
    save_file(weights, f"{path}/model.safetensors", metadata={"format": "pt"})
    assert organism.organism_model_path(spec) == path
    assert "differs from the shipped organism-rules-s2.safetensors; rebuilding it" in caplog.text
    entry = shipped.entry_for_key(spec.key())
    assert shipped.weights_digest(load_file(f"{path}/model.safetensors")) == entry["weights_digest"]
    assert torch.equal(load_file(f"{path}/model.safetensors")[name], shipped.load_reference(entry)[name])


def test_a_damaged_shipped_file_is_refused_naming_it(tmp_path, monkeypatch):
    from trl_nca.models import organism, shipped

    copy = tmp_path / "organisms"
    shutil.copytree(shipped.RESOURCE_DIR, copy)
    target = copy / "organism-rules-s3.safetensors"
    data = bytearray(target.read_bytes())
    data[-10] ^= 0xFF
    target.write_bytes(bytes(data))
    monkeypatch.setattr(shipped, "RESOURCE_DIR", copy)
    monkeypatch.setenv("TRL_NCA_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"organism-rules-s3.safetensors does not match its sha256 in manifest.json"):
        organism.organism_model_path(organism.shipped_spec("rules", 3))
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="organism manifest .* is not valid JSON"):
        organism.organism_model_path(organism.shipped_spec("rules", 3))


def test_an_organism_seed_that_does_not_ship_still_pretrains(tmp_path, monkeypatch):
    from trl_nca.models import organism, shipped

    monkeypatch.setenv("TRL_NCA_CACHE", str(tmp_path))
    tiny = organism.OrganismSpec(steps=2, hidden_size=32, num_layers=1, num_heads=2, batch_size=2, seed=0)
    assert shipped.entry_for_key(tiny.key()) is None
    path = organism.organism_model_path(tiny)
    assert json.loads((tmp_path / path.split("/")[-1] / "organism.json").read_text())["spec"]["steps"] == 2


def test_build_shipped_writes_a_file_and_manifest_entry_that_load_back(tmp_path, monkeypatch):
    from trl_nca.models import organism, shipped

    tiny = organism.OrganismSpec(steps=2, hidden_size=32, num_layers=1, num_heads=2, batch_size=2)
    monkeypatch.setattr(organism, "spec_for_alias", lambda alias: tiny)
    entry = organism.build_shipped(organism.shipped_spec("rules", 5), out_dir=tmp_path)
    assert entry["file"] == "organism-rules-s5.safetensors" and entry["dtype"] == "float16"
    assert shipped.read_manifest(tmp_path)["organisms"]["organism-rules-s5"] == json.loads(json.dumps(entry))
    assert shipped.weights_digest(shipped.load_reference(entry, tmp_path)) == entry["weights_digest"]
    with pytest.raises(ValueError, match="Only the default spec of each dialect ships"):
        organism.build_shipped(dataclasses.replace(tiny, steps=3, seed=1), out_dir=tmp_path)


def test_a_shipped_organism_is_a_model_name_every_command_takes():
    """`organism-rules-s2` (its weights file's name) names the organism a comparison with `organism_seeds: [2]` trains
    from: the students' model cards name their base so, in a command that runs (issue 57)."""
    from trl_nca.models.names import resolve_model_name_or_path
    from trl_nca.models.organism import organism_model_path, shipped_name, shipped_spec, spec_for_alias, spec_for_name

    spec = shipped_spec("rules", 2)
    assert shipped_name(spec) == "organism-rules-s2" and spec_for_name("Organism-Rules-S2") == spec
    assert resolve_model_name_or_path("organism-rules-s2") == organism_model_path(spec)
    assert shipped_name(shipped_spec("facts", 1)) == "organism-facts-s1"
    assert shipped_name(spec_for_alias("organism-quick")) is None and spec_for_name("organism-rules-x") is None
