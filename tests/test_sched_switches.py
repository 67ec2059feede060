"""Policy names with switches (`sched.configured`): what `suanli sim --policy` and the server's `policy` take."""

from __future__ import annotations

from itertools import combinations

import pytest

from suanli.sched import KNOBS, POLICIES, SchedulerConfig, config_name, configured


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_set_of_switches_round_trips_through_its_name(policy: str) -> None:
    for n in range(len(KNOBS) + 1):
        for on in combinations(KNOBS, n):
            config = configured("+".join([policy.upper(), *reversed(on)]))  # any case, any order
            assert config.policy == policy
            assert config_name(config) == "+".join([policy, *on])  # one name: KNOBS order
            assert configured(config_name(config)) == config


def test_each_switch_sets_its_field_and_nothing_else() -> None:
    plain = SchedulerConfig()
    for knob in KNOBS:
        changed = {
            f for f in plain.__dataclass_fields__ if getattr(configured(f"default+{knob}"), f) != getattr(plain, f)
        }
        assert changed == ({"locality_wait_s"} if knob == "locality" else {knob})
    assert configured("default+locality").locality_wait_s == plain.starvation_s  # waits up to the starvation bound


@pytest.mark.parametrize("bad", ["default+", "default+nope", "default+locality_wait_s", "default+policy"])
def test_an_unknown_switch_is_refused_naming_the_known_ones(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown switch") as e:
        configured(bad)
    assert all(k in str(e.value) for k in KNOBS)
