"""Settings precedence: flags over SUANLI_* environment over the config file over defaults."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from suanli.control.errors import Invalid
from suanli.control.settings import load


def test_flags_beat_environment_beat_file_beat_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "suanli.yaml"
    cfg.write_text("port: 9001\ntrial_credit: '25.50'\nadmission-hold-minutes: 30\nhost: 0.0.0.0\n")
    env = {"SUANLI_PORT": "9002", "SUANLI_TRIAL_CREDIT": "5", "SUANLI_HOME": str(tmp_path / "h")}
    s = load({"port": 9003, "host": None}, environ=env, config_file=cfg)
    assert s.port == 9003  # flag
    assert s.trial_credit == Decimal("5")  # environment over file
    assert s.admission_hold_minutes == 30  # file (dashes accepted)
    assert s.host == "0.0.0.0"  # a flag left as None falls through to the file
    assert s.home == tmp_path / "h"
    assert s.db_url == f"sqlite+pysqlite:///{tmp_path / 'h' / 'suanli.db'}"  # embedded default in the data dir
    assert load({}, environ={"SUANLI_HOME": str(tmp_path)}).port == 8000  # default


def test_config_file_from_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("currency: USD\n")
    assert load({}, environ={"SUANLI_CONFIG": str(cfg), "SUANLI_HOME": str(tmp_path)}).currency == "USD"


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ({"flags": {"port": 70000}}, "port"),
        ({"env": {"SUANLI_TRIAL_CREDIT": "lots"}}, "trial_credit"),
        ({"file": "no_such_setting: 1\n"}, "no_such_setting"),
        ({"file": "- a list\n"}, "mapping"),
        ({"file": "port: [unclosed\n"}, "config file"),
    ],
)
def test_bad_settings_name_the_setting(tmp_path: Path, source: dict, needle: str) -> None:  # type: ignore[type-arg]
    cfg = None
    if "file" in source:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(source["file"])
    with pytest.raises(Invalid, match=needle):
        load(source.get("flags", {}), environ={"SUANLI_HOME": str(tmp_path), **source.get("env", {})}, config_file=cfg)
