"""How the suite splits over pytest-xdist workers (`tests/conftest.py`): a module whole on one worker, and every
module that starts a Ray or a Slurm cluster with the others of its engine, so each cluster starts once."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ENGINE_MODULES, xdist_group_of

HERE = Path(__file__).parent


def test_a_modules_tests_stay_together_and_modules_part():
    a = xdist_group_of("tests/test_sandbox.py::test_one")
    assert a == xdist_group_of("tests/test_sandbox.py::test_two[sqlite]") == "tests/test_sandbox.py"
    assert a != xdist_group_of("tests/test_client.py::test_one")


def test_every_module_that_starts_an_engine_cluster_runs_with_the_others_of_its_engine():
    for engine in ENGINE_MODULES:
        users = {p.name for p in HERE.glob("test_*.py") if f"{engine}_cluster" in p.read_text()}
        assert users, engine
        assert users <= set(ENGINE_MODULES[engine]), (engine, users - set(ENGINE_MODULES[engine]))
        assert {xdist_group_of(f"tests/{name}::test_x") for name in users} == {engine}
