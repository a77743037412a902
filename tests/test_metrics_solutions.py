import math

import numpy as np
import pytest

from exploration_trl.metrics import (
    mean_solution_multiplicity,
    solution_multiplicity,
    unsolvable_overlap,
    unsolvable_problems,
)
from exploration_trl.metrics.solutions import math_answers_equivalent

CORRECT = [
    [0, 0, 0, 0],  # 0: never solved
    [0, 0, 1, 0],  # 1: solved only by sample 3
    [1, 0, 0, 0],  # 2: solved by sample 1
    [0, 0, 0, 1],  # 3: solved only by the last sample
]


def test_unsolvable_problems_by_index():
    assert unsolvable_problems(CORRECT) == {0}
    assert unsolvable_problems(CORRECT, k=4) == {0}
    assert unsolvable_problems(CORRECT, k=3) == {0, 3}  # first 3 samples: problem 3 not yet solved
    assert unsolvable_problems(CORRECT, k=2) == {0, 1, 3}
    assert unsolvable_problems(CORRECT, k=1) == {0, 1, 3}
    assert unsolvable_problems(np.array(CORRECT, dtype=bool), k=3) == {0, 3}


def test_unsolvable_problems_by_id_and_errors():
    by_id = {"p-a": [0, 0], "p-b": [0, 1], "p-c": [True, False], "p-d": []}
    assert unsolvable_problems(by_id) == {"p-a", "p-d"}  # no sample at all = unsolved
    assert unsolvable_problems({"x": [0, 1], "y": [1, 1]}, k=1) == {"x"}
    with pytest.raises(ValueError, match="fewer than k"):
        unsolvable_problems(CORRECT, k=5)
    with pytest.raises(ValueError):
        unsolvable_problems(CORRECT, k=0)


def test_unsolvable_overlap_hand_worked():
    a = {0, 1, 2, 5}
    b = {1, 2, 3}
    out = unsolvable_overlap(a, b)
    # A\B = {0, 5}, B\A = {3}, A∩B = {1, 2}, A∪B = {0, 1, 2, 3, 5} -> jaccard 2/5
    assert out == dict(only_a=2, only_b=1, both=2, n_a=4, n_b=3, jaccard=pytest.approx(0.4))
    ids = unsolvable_overlap(a, b, return_ids=True)
    assert ids["only_a_ids"] == [0, 5] and ids["only_b_ids"] == [3] and ids["both_ids"] == [1, 2]
    # chained with unsolvable_problems: base (all 4 samples) vs. first sample only
    out = unsolvable_overlap(unsolvable_problems(CORRECT), unsolvable_problems(CORRECT, k=1))
    assert (out["only_a"], out["only_b"], out["both"], out["jaccard"]) == (0, 2, 1, pytest.approx(1 / 3))
    assert math.isnan(unsolvable_overlap(set(), [])["jaccard"])
    assert unsolvable_overlap({"a"}, {"a"})["jaccard"] == 1.0


def test_solution_multiplicity_hand_worked():
    answers = [
        ["x = 2", " x = 2 ", "x=2", "7", None],  # correct: "x = 2", " x = 2 " (same after strip), "x=2"
        ["4", "4", "5"],  # correct: only the "5"
        ["1", "2"],  # nothing correct
        [None, "3"],  # a correct None answer is ignored
    ]
    correct = [
        [1, 1, 1, 0, 1],
        [0, 0, 1],
        [0, 0],
        [1, 0],
    ]
    # problem 0: {"x = 2", "x=2"} -> 2 ; 1: {"5"} -> 1 ; 2: 0 ; 3: 0
    assert solution_multiplicity(answers, correct) == [2, 1, 0, 0]
    # custom normalisation that drops all spaces merges "x = 2" and "x=2"
    nospace = lambda a: a.replace(" ", "")  # noqa: E731
    assert solution_multiplicity(answers, correct, normalize=nospace) == [1, 1, 0, 0]
    # identity normalisation keeps " x = 2 " apart
    assert solution_multiplicity(answers, correct, normalize=lambda a: a) == [3, 1, 0, 0]
    # mean over all problems: (2 + 1 + 0 + 0)/4 ; over solved ones: (2 + 1)/2
    assert mean_solution_multiplicity(answers, correct) == pytest.approx(0.75)
    assert mean_solution_multiplicity(answers, correct, solved_only=True) == pytest.approx(1.5)
    assert math.isnan(mean_solution_multiplicity([], []))
    # non-string answers are left untouched by the default normalisation
    assert solution_multiplicity([[1, 1.0, 2, 3]], [[1, 1, 1, 0]]) == [2]


def test_solution_multiplicity_up_to_math_verify_equivalence():
    """DS-GRPO counts distinct correct solutions: "1/2", "\\frac{1}{2}" and "0.5" are one answer, not three."""
    assert math_answers_equivalent("1/2", "\\frac{1}{2}") and math_answers_equivalent("0.5", "\\frac{1}{2}")
    assert math_answers_equivalent("3", "3.0") and math_answers_equivalent("\\sqrt{2}", "2^{1/2}")
    assert not math_answers_equivalent("1/2", "1/3") and not math_answers_equivalent("1/2", None)
    answers = [
        ["1/2", "\\frac{1}{2}", "0.5", "2/4", "1/3"],  # all correct: {1/2} and {1/3} -> 2
        ["\\sqrt{2}", "2^{1/2}", "1.41"],               # sqrt(2) twice and a wrong 1.41 -> 1
        ["x=1/2", "x=1/2"],                              # exact duplicates, merged before parsing -> 1
        ["\\unparsable{", "\\unparsable{", "7"],       # unparsable: equal only to itself -> 2
    ]
    correct = [[1, 1, 1, 1, 1], [1, 1, 0], [1, 1], [1, 1, 1]]
    # as strings: 5, 2, 1, 2
    assert solution_multiplicity(answers, correct) == [5, 2, 1, 2]
    assert solution_multiplicity(answers, correct, equivalent=math_answers_equivalent) == [2, 1, 1, 2]
    assert mean_solution_multiplicity(answers, correct, equivalent=math_answers_equivalent) == pytest.approx(1.5)


def test_solution_multiplicity_errors():
    with pytest.raises(ValueError):
        solution_multiplicity([["a"]], [[1], [0]])
    with pytest.raises(ValueError):
        solution_multiplicity([["a", "b"]], [[1]])
