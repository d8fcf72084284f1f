"""ferry.torch.import_snapshot: a PyTorch memory snapshot (file or dict) to a
ferry trace, its figures those the generator recorded; hostile files refused."""
import json
import os
import pathlib
import pickle

import pytest

import ferry
import ferry.torch as ft

SNAPSHOTS = pathlib.Path(__file__).resolve().parent.parent / "snapshots"


def test_a_file_imports_to_the_generators_figures(tmp_path):
    out = tmp_path / "training.jsonl"
    source = ft.import_snapshot(SNAPSHOTS / "training.pickle", out)
    expect = json.loads((SNAPSHOTS / "training.expect.json").read_text())
    for key, value in expect.items():
        assert source[key] == value, key
    assert source["format"] == "torch-snapshot"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(1 for line in lines if line["op"] == "alloc") == expect["allocs"]


def test_a_dict_imports_as_the_file_does(tmp_path):
    with open(SNAPSHOTS / "two-devices.pickle", "rb") as f:
        snap = pickle.load(f)  # our own generated file: trusted here
    from_dict = ft.import_snapshot(snap, tmp_path / "a.jsonl", device=0)
    from_file = ft.import_snapshot(str(SNAPSHOTS / "two-devices.pickle"), tmp_path / "b.jsonl", device=0)
    assert from_dict == from_file
    assert from_dict["device"] == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_hostile_and_malformed_files_raise_and_run_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("hostile-reduce-top", "hostile-reduce-frame", "bad-unknown-action"):
        with pytest.raises(ferry.InvalidArgumentError) as e:
            ft.import_snapshot(SNAPSHOTS / (name + ".pickle"), tmp_path / "x.jsonl")
        assert "STACK_GLOBAL" in str(e.value) or "unknown action" in str(e.value)
    assert not os.path.exists(tmp_path / "ferry-hostile-ran")
