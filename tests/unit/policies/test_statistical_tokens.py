"""ThemisIO statistical tokens ([THEMIS]): spec grammar, eq. (1) against explicit matrices,
the paper's worked values, opportunity fairness down the tree, and the worker draw."""

from __future__ import annotations

import itertools
import pickle
import random
from collections import Counter
from fractions import Fraction

import pytest
from support import views
from support.views import allocation, job

from burstctl.policies import JobView, UnknownPolicyError, default_registry
from burstctl.policies.statistical_tokens import (
    JOB_LEVELS,
    Segments,
    SpecError,
    StatisticalTokens,
    parse_spec,
    policy_class,
)

REGISTRY = default_registry()


def wants(demand: float) -> dict[str, float]:
    """A job's demand and its cap b_i (at least 1), as ``job`` keywords."""
    return {"cap": max(demand, 1.0), "demand": demand}


view = views.view  # B = 1 unless a case says otherwise


def tokens(spec: str) -> StatisticalTokens:
    policy = REGISTRY.create(spec)
    assert isinstance(policy, StatisticalTokens)
    return policy


def approx(values: dict[str, Fraction | float]) -> object:
    return pytest.approx({k: float(v) for k, v in values.items()}, rel=1e-12, abs=1e-15)


# [THEMIS] Figure 3(b): user 1 runs J1, J2; user 2 runs J3–J6.
FIG3 = [job(f"J{i}", user="U1" if i <= 2 else "U2", index=i) for i in range(1, 7)]
FIG3_SHARES = dict(zip([f"J{i}" for i in range(1, 7)], [0.25, 0.25] + [0.125] * 4, strict=True))

# [THEMIS] Figure 11: G1{U1{J1:1}}, G2{U2{J2:2, J3:3, J4:2}, U3{J5:3, J6:2}, U4{J7:1, J8:2}}.
FIG11_TREE = [
    ("G1", "U1", 1),
    ("G2", "U2", 2),
    ("G2", "U2", 3),
    ("G2", "U2", 2),
    ("G2", "U3", 3),
    ("G2", "U3", 2),
    ("G2", "U4", 1),
    ("G2", "U4", 2),
]
FIG11_SHARES = {
    f"J{i}": Fraction(1, d) for i, d in enumerate([2, 21, 14, 21, 10, 15, 18, 9], start=1)
}


def fig11(**demand: float) -> list[JobView]:
    return [
        job(f"J{i}", **wants(demand.get(f"J{i}", 1.0)), user=u, group=g, nodes=n, index=i)
        for i, (g, u, n) in enumerate(FIG11_TREE, start=1)
    ]


# ---------------------------------------------------------------------------
# The spec grammar and the registry


def all_valid_specs() -> list[str]:
    specs = []
    for depth in range(3):
        for prefix in itertools.permutations(["user", "group"], depth):
            specs += [">".join([*prefix, leaf]) for leaf in sorted(JOB_LEVELS)]
    return specs


def test_grammar_admits_fifteen_specs() -> None:
    specs = all_valid_specs()
    assert len(specs) == 15
    assert {"user>size", "group>user>size", "user>group>priority"} <= set(specs)
    for spec in specs:
        assert policy_class(spec).name == spec


def test_spec_spelling_is_normalised() -> None:
    assert parse_spec(" Group > USER>size ") == ("group", "user", "size")
    assert policy_class(" Group > USER>size ") is policy_class("group>user>size")
    assert REGISTRY.get("user > size").name == "user>size"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "user>node",
            r"level 2 'node' is not a sharing entity \(job, user, group, size, priority\)",
        ),
        ("group>user>group>job", r"level 3 'group' repeats level 1"),
        ("user>job>size", r"level 3 'size' comes after 'job' \(level 2\), which already splits"),
        ("size>user", r"level 2 'user' comes after 'size' \(level 1\)"),
        ("group>user", r"level 2 'user' does not pick a job; .* e\.g\. 'group>user>job'"),
        ("user", r"level 1 'user' does not pick a job"),
        ("user>>job", r"level 2 is empty"),
        ("user>", r"level 2 is empty"),
    ],
)
def test_invalid_specs_name_the_level(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=rf"^bad sharing spec {spec!r}: {message}"):
        parse_spec(spec)
    # the registry turns it into its KeyError, which the CLI and the controller report
    with pytest.raises(UnknownPolicyError, match=message):
        REGISTRY.get(spec)
    with pytest.raises(KeyError):
        REGISTRY.create(spec, {})


def test_registered_names_and_their_specs() -> None:
    expected = {
        "job-fair": "job",
        "user-fair": "user>job",
        "group-fair": "group>job",
        "size-fair": "size",
        "priority-fair": "priority",
        "user-size-fair": "user>size",
        "group-size-fair": "group>size",
        "group-user-fair": "group>user>job",
        "group-user-size-fair": "group>user>size",
    }
    assert set(expected) <= set(REGISTRY.names())
    for name, spec in expected.items():
        cls = REGISTRY.get(name)
        assert cls is REGISTRY.get(spec) is policy_class(spec)
        assert cls.name == spec  # what the controller reports
    assert REGISTRY.get("size") is REGISTRY.get("size-fair")  # a single level is a spec
    assert "user>size" not in REGISTRY.names()  # specs resolve without being listed


def test_create_accepts_a_spec_and_rejects_parameters() -> None:
    policy = REGISTRY.create("group>user>size", {})
    assert policy.name == "group>user>size"
    assert repr(policy) == "StatisticalTokens('group>user>size')"
    with pytest.raises(ValueError, match="bad parameters for policy 'user>size': bogus"):
        REGISTRY.create("user>size", {"bogus": 1})


def test_policies_pickle_by_spec() -> None:
    policy = REGISTRY.create("group-user-size-fair")
    copy = pickle.loads(pickle.dumps(policy))
    assert type(copy) is type(policy)
    assert allocation(copy, view(*fig11())) == allocation(policy, view(*fig11()))


def test_unknown_name_still_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError, match=r"unknown policy 'nope'; known: .*job-fair"):
        REGISTRY.get("nope")


# ---------------------------------------------------------------------------
# Eq. (1): the tree computation equals the explicit chain product of the T^i


def _weight(level: str, j: JobView) -> float:
    return {"size": float(j.nodes), "priority": j.priority}.get(level, 1.0)


def transition_matrices(levels: tuple[str, ...], jobs: list[JobView]) -> list[list[list[float]]]:
    """T^0 … T^{N−1} as [THEMIS] §3 defines them: row = a token queue (an entity of
    level i, the root for i = 0), column = an entity of level i + 1 (its path from the
    root), entry = the column's share of its parent's scope; plain lists."""

    def path(j: JobView, depth: int) -> tuple[str, ...]:
        keys = [j.job_id if lv in JOB_LEVELS else getattr(j, lv) for lv in levels[:depth]]
        return tuple(keys)

    def entities(depth: int) -> list[tuple[str, ...]]:
        return list(dict.fromkeys(path(j, depth) for j in jobs))

    weight = {path(j, len(levels)): _weight(levels[-1], j) for j in jobs}
    matrices = []
    for i in range(len(levels)):
        rows, cols = entities(i), entities(i + 1)
        col_weight = [weight.get(c, 1.0) if i == len(levels) - 1 else 1.0 for c in cols]
        matrix = []
        for row in rows:
            scope = sum(w for c, w in zip(cols, col_weight, strict=True) if c[:-1] == row)
            matrix.append(
                [w / scope if c[:-1] == row else 0.0 for c, w in zip(cols, col_weight, strict=True)]
            )
        matrices.append(matrix)
    return matrices


def chain_product(matrices: list[list[list[float]]]) -> list[float]:
    """∏_{i=0}^{N−1} T^i, eq. (1); T^0 has one row, so the product is a row vector."""
    vector = matrices[0][0]
    for matrix in matrices[1:]:
        vector = [
            sum(vector[r] * matrix[r][c] for r in range(len(matrix))) for c in range(len(matrix[0]))
        ]
    return vector


def random_jobs(rng: random.Random) -> list[JobView]:
    jobs = []
    for i in range(rng.randint(1, 14)):
        jobs.append(
            job(
                f"j{i}",
                user=f"u{rng.randint(0, 4)}",  # a user may run jobs in both groups
                group=f"g{rng.randint(0, 2)}",
                nodes=rng.choice([1, 2, 3, 8, 64]),
                priority=rng.choice([0.5, 1.0, 2.0, 7.0]),
                **wants(rng.choice([0.0, 0.0, 1.0, 5.0])),  # a third idle
                index=rng.randint(0, 3),  # ties broken by id
            )
        )
    return jobs


@pytest.mark.parametrize("spec", all_valid_specs())
def test_tree_shares_equal_the_matrix_product(spec: str) -> None:
    policy = tokens(spec)
    for seed in range(40):
        rng = random.Random(seed)
        jobs = random_jobs(rng)
        v = view(*jobs)
        active = v.active_jobs()
        shares = policy.shares(v)
        assert set(shares) == {j.job_id for j in active}, seed  # idle jobs drop out
        if not active:
            continue
        matrices = transition_matrices(policy.levels, active)
        for matrix in matrices:  # the paper's two properties of every T^i
            assert all(sum(row) == pytest.approx(1.0) for row in matrix)
            assert all(sum(row[c] > 0 for row in matrix) == 1 for c in range(len(matrix[0])))
        # the last matrix's columns are the active jobs in their order
        product = dict(zip((j.job_id for j in active), chain_product(matrices), strict=True))
        assert shares == pytest.approx(product, rel=1e-12), seed
        # nobody capped (every demand ≥ B): rates are B × share
        capacity = 3.0
        uncapped = view(*(job_with_demand(j, capacity) for j in jobs), capacity=capacity)
        rates = allocation(policy, uncapped)
        assert rates == pytest.approx({k: capacity * s for k, s in shares.items()}, rel=1e-12)


def job_with_demand(j: JobView, at_least: float) -> JobView:
    if not j.active:
        return j
    return j._replace(**wants(at_least))


def idle(j: JobView) -> JobView:
    return j._replace(**wants(0.0))


# ---------------------------------------------------------------------------
# The paper's worked values


def test_figure_3b_user_then_job_fair() -> None:
    for name in ("user-fair", "user>job"):
        assert tokens(name).shares(view(*FIG3)) == approx(FIG3_SHARES)
        assert allocation(tokens(name), view(*FIG3)) == approx(FIG3_SHARES)  # B = 1, demand 1


def test_figure_11_group_then_user_then_size_fair() -> None:
    for name in ("group-user-size-fair", "group>user>size"):
        shares = tokens(name).shares(view(*fig11()))
        assert list(shares) == [f"J{i}" for i in range(1, 9)]  # the figure's order
        assert shares == approx(FIG11_SHARES)
        saturated = fig11(**dict.fromkeys(FIG11_SHARES, 20.7))  # every job could use all B
        rates = allocation(tokens(name), view(*saturated, capacity=20.7))
        assert rates == approx({k: 20.7 * s for k, s in FIG11_SHARES.items()})


@pytest.mark.parametrize(
    ("name", "jobs", "expected"),
    [
        # [THEMIS] §5.3.1, Figure 8: a 4-node and a 1-node job; user A's two jobs vs user B's one
        ("size-fair", [job("a", nodes=4), job("b", nodes=1)], {"a": 0.8, "b": 0.2}),
        ("job-fair", [job("a", nodes=4), job("b", nodes=1)], {"a": 0.5, "b": 0.5}),
        (
            "user-fair",
            [job("a1", user="A", nodes=2), job("a2", user="A", nodes=2), job("b", user="B")],
            {"a1": 0.25, "a2": 0.25, "b": 0.5},
        ),
        (
            "priority-fair",
            [job("a", priority=2.0), job("b", priority=1.0)],
            {"a": 2 / 3, "b": 1 / 3},
        ),
        (
            "group-fair",
            [job("a", group="G"), job("b", group="G"), job("c", group="H")],
            {"a": 0.25, "b": 0.25, "c": 0.5},
        ),
    ],
)
def test_primitive_policies(name: str, jobs: list[JobView], expected: dict[str, float]) -> None:
    assert allocation(tokens(name), view(*jobs)) == approx(dict(expected))


def test_figure_9_user_then_size_fair() -> None:
    # user 1: jobs of 1 and 2 nodes; user 2: 4 and 6 nodes; 20 GB/s → 3.33/6.67, 4/6
    jobs = [
        job("J1", **wants(20.0), user="U1", nodes=1),
        job("J2", **wants(20.0), user="U1", nodes=2),
        job("J3", **wants(20.0), user="U2", nodes=4),
        job("J4", **wants(20.0), user="U2", nodes=6),
    ]
    rates = allocation(tokens("user-size-fair"), view(*jobs, capacity=20.0))
    assert rates == approx({"J1": 10 / 3, "J2": 20 / 3, "J3": 4.0, "J4": 6.0})


# ---------------------------------------------------------------------------
# Opportunity fairness


def test_idle_job_share_goes_to_its_users_other_jobs() -> None:
    # J3 idle: U2 keeps 1/6, split 2:2 between J2 and J4; nobody else changes
    shares = tokens("group>user>size").shares(view(*fig11(J3=0.0)))
    expected = dict(FIG11_SHARES, J2=Fraction(1, 12), J4=Fraction(1, 12))
    del expected["J3"]
    assert shares == approx(expected)


def test_idle_user_share_goes_to_the_groups_other_users() -> None:
    # U2 idle: G2's 1/2 goes to U3 and U4, 1/4 each; G1 keeps 1/2
    shares = tokens("group>user>size").shares(view(*fig11(J2=0.0, J3=0.0, J4=0.0)))
    q = Fraction(1, 4)
    assert shares == approx(
        {"J1": Fraction(1, 2), "J5": q * 3 / 5, "J6": q * 2 / 5, "J7": q / 3, "J8": q * 2 / 3}
    )


def test_idle_group_share_goes_to_the_other_groups() -> None:
    idle_g2 = {f"J{i}": 0.0 for i in range(2, 9)}
    assert tokens("group>user>size").shares(view(*fig11(**idle_g2))) == {"J1": 1.0}
    # G1 idle: G2 gets everything, its users 1/3 each
    shares = tokens("group>user>size").shares(view(*fig11(J1=0.0)))
    expected = {k: 2 * s for k, s in FIG11_SHARES.items() if k != "J1"}
    assert shares == approx(expected)


def test_hierarchical_not_leaf_renormalisation() -> None:
    # user>job with only J1, J2 (U1) and J3 (U2) active → 0.25/0.25/0.5, not 0.4/0.4/0.2: the
    # reading of [THEMIS] §3/§4.1 in docs/references.md (prune idle entities, not leaves)
    jobs = [j if j.job_id in {"J1", "J2", "J3"} else idle(j) for j in FIG3]
    assert tokens("user>job").shares(view(*jobs)) == approx({"J1": 0.25, "J2": 0.25, "J3": 0.5})


def test_capped_job_hands_back_inside_its_user_first() -> None:
    # J3 can use 0.01 of B = 1: J2 and J4 take U2's rest; the other users keep theirs
    rates = allocation(tokens("group>user>size"), view(*fig11(J3=0.01)))
    rest = (Fraction(1, 6) - Fraction(1, 100)) / 2
    assert rates == approx(dict(FIG11_SHARES, J2=rest, J3=Fraction(1, 100), J4=rest))
    assert sum(rates.values()) == pytest.approx(1.0)


def test_capped_user_hands_back_inside_its_group_first() -> None:
    # U2's jobs can use 0.01 each: U3 and U4 split G2's rest; G1 keeps 1/2
    rates = allocation(tokens("group>user>size"), view(*fig11(J2=0.01, J3=0.01, J4=0.01)))
    per_user = (Fraction(1, 2) - Fraction(3, 100)) / 2
    expected = {
        "J1": Fraction(1, 2),
        "J2": Fraction(1, 100),
        "J3": Fraction(1, 100),
        "J4": Fraction(1, 100),
        "J5": per_user * 3 / 5,
        "J6": per_user * 2 / 5,
        "J7": per_user / 3,
        "J8": per_user * 2 / 3,
    }
    assert rates == approx(expected)


def test_capped_group_hands_back_to_the_other_group() -> None:
    small = {f"J{i}": 0.01 for i in range(2, 9)}
    rates = allocation(tokens("group>user>size"), view(*fig11(**small)))
    assert rates == approx({"J1": 0.93, **small})
    # and the other way: J1 (all of G1) uses 0.1, G2's users get 0.3 each
    rates = allocation(tokens("group>user>size"), view(*fig11(J1=0.1)))
    g2 = {k: s * Fraction(9, 5) for k, s in FIG11_SHARES.items() if k != "J1"}
    assert rates == approx({"J1": 0.1, **g2})


def test_underload_gives_every_job_its_demand() -> None:
    jobs = fig11(**{f"J{i}": 0.05 for i in range(1, 9)})
    assert allocation(tokens("group>user>size"), view(*jobs)) == approx(
        {f"J{i}": 0.05 for i in range(1, 9)}
    )


def test_zero_priority_only_takes_what_the_others_leave() -> None:
    policy = tokens("priority")
    assert policy.shares(view(job("a"), job("z", priority=0.0))) == {"a": 1.0, "z": 0.0}
    assert allocation(policy, view(job("a"), job("z", priority=0.0))) == {"a": 1.0, "z": 0.0}
    rates = allocation(policy, view(job("a", **wants(0.3)), job("z", priority=0.0)))
    assert rates == approx({"a": 0.3, "z": 0.7})
    assert policy.shares(view(job("y", priority=0.0), job("z", priority=0.0))) == approx(
        {"y": 0.5, "z": 0.5}
    )


# ---------------------------------------------------------------------------
# The worker draw


def chi_square(counts: Counter[str], expected: dict[str, float], n: int) -> float:
    return sum((counts[k] - n * p) ** 2 / (n * p) for k, p in expected.items())


def test_draw_frequencies_match_figure_11_shares() -> None:
    # Pearson's χ² over the 8 jobs (7 degrees of freedom); 24.32 is the 0.999 quantile,
    # so a correct draw fails this at a random seed once in a thousand; the seed is fixed.
    policy = tokens("group>user>size")
    v = view(*fig11())
    segments = policy.segments(v, pending=set(v.jobs))
    n = 100_000
    rng = random.Random(20240611)
    counts = Counter(segments.draw(rng) for _ in range(n))
    expected = {k: float(s) for k, s in FIG11_SHARES.items()}
    assert set(counts) == set(expected)
    assert chi_square(counts, expected, n) < 24.32
    # the policy's draw is that segment draw
    a, b = random.Random(7), random.Random(7)
    assert [policy.draw(v, set(v.jobs), a) for _ in range(50)] == [
        segments.draw(b) for _ in range(50)
    ]


def test_draw_prunes_the_hierarchy_to_pending_jobs() -> None:
    # user>job, only J1, J2 (user 1) and J3 (user 2) have requests: 0.25/0.25/0.5
    policy = tokens("user>job")
    v = view(*FIG3)  # every job has demand: the draw looks at pending requests only
    segments = policy.segments(v, pending={"J3", "J1", "J2", "gone"})  # unknown ids ignored
    assert segments.job_ids == ("J1", "J2", "J3")
    assert segments.ends == pytest.approx((0.25, 0.5, 1.0))
    n = 30_000
    rng = random.Random(3)
    counts = Counter(policy.draw(v, {"J1", "J2", "J3"}, rng) for _ in range(n))
    # χ² with 2 degrees of freedom; 13.82 is the 0.999 quantile
    assert chi_square(counts, {"J1": 0.25, "J2": 0.25, "J3": 0.5}, n) < 13.82
    # leaf renormalisation (0.4/0.4/0.2) is rejected by the same test by far
    assert chi_square(counts, {"J1": 0.4, "J2": 0.4, "J3": 0.2}, n) > 1000


def test_draw_with_nothing_pending() -> None:
    assert tokens("job").draw(view(*FIG3), set(), random.Random(0)) is None
    assert tokens("job").draw(view(*FIG3), ["elsewhere"], random.Random(0)) is None


def test_segments_cover_zero_to_one() -> None:
    segments = Segments.of({"a": 0.5, "b": 0.5, "z": 0.0})
    assert segments.ends == (0.5, 1.0, 1.0)
    assert segments.pick(0.0) == "a"
    assert segments.pick(0.5) == "b"  # [0.5, 1.0) is b's
    assert segments.pick(0.9999999999999999) == "b"  # a zero-length segment is never hit
    thirds = Segments.of(dict.fromkeys("xyz", 1 / 3))
    assert thirds.ends[-1] == 1.0  # the last end is exactly 1 despite rounding


@pytest.mark.parametrize("level", ["job", "size", "priority"])
@pytest.mark.parametrize("seed", range(20))
def test_one_level_shortcut_equals_the_tree(level: str, seed: int) -> None:
    # allocate() skips the tree for one-level specs: same rates, same order.
    from burstctl.policies.statistical_tokens import _fill, _flat, _tree

    rng = random.Random(seed)
    jobs = [
        job(
            f"j{i}",
            100.0,
            rng.choice([0.0, 1.0, rng.uniform(0.0, 100.0), 100.0]),
            nodes=rng.choice([1, 2, 8]),
            priority=rng.choice([0.0, 1.0, 3.0, float("inf")]),  # zero or odd scavenge
            index=i,
        )
        for i in range(rng.randint(1, 12))
    ]
    capacity = rng.choice([0.0, 10.0, 100.0, 1e4])
    tree: dict[str, float] = {}
    _fill(_tree((level,), jobs), capacity, tree)
    flat = _flat(level, jobs, capacity)
    assert list(flat.items()) == list(tree.items())
    v = view(*jobs, capacity=capacity, node_bandwidth=100.0)
    assert allocation(default_registry().create(level), v) == {
        j: r for j, r in tree.items() if v.jobs[j].demand > 0.0
    }
