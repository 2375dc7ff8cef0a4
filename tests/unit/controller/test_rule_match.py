"""Which rule binds a job (controller/rules.py): patterns, every key together, rank order."""

from __future__ import annotations

from burstctl.controller.rules import Binder, Rule


def test_a_rule_matches_exact_names_and_patterns_all_keys_together() -> None:
    r = Rule("r", user="u[0-9]", group="phys", limit=1.0)
    assert r.matches("j1", "u1", "phys", "")
    assert not r.matches("j1", "u1", "bio", "")
    assert not r.matches("j1", "ux", "phys", "")
    assert Rule("a", app="blast*", limit=1.0).matches("j", "u", "g", "blastp")
    assert not Rule("a", app="*", limit=1.0).matches("j", "u", "g", "")  # no app: no match
    assert Rule("j", job="dd.*", limit=1.0).matches("dd.7", "u", "g", "")
    binder = Binder([Rule("b", rank=5, user="*", weight=2.0), Rule("a", user="u1", limit=1.0)])
    assert binder.rule_for("j", "u1", "g", "").name == "b"  # the lower rank binds first
