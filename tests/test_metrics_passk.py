import math
from fractions import Fraction

import numpy as np
import pytest

from exploration_trl.metrics import avg_at_n, default_ks, maj_at_n, parse_ks, pass_at_k, pass_at_k_curve


def _exact(n, c, k):
    if n - c < k:
        return 1.0
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


# ----------------------------------------------------------------------------- pass@k, hand-worked
def test_pass_at_k_hand_worked():
    # 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    # k = 1 is the plain accuracy c/n: 1 - C(7,1)/C(10,1) = 1 - 7/10 = 0.3
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)
    # 1 - C(6,3)/C(10,3) = 1 - 20/120 = 5/6
    assert pass_at_k(10, 4, 3) == pytest.approx(5 / 6, abs=1e-15)
    # k > c branch: 1 - C(8,4)/C(10,4) = 1 - 70/210 = 2/3
    assert pass_at_k(10, 2, 4) == pytest.approx(2 / 3, abs=1e-15)
    # n - c < k: every k-subset has a correct sample -> exactly 1.0
    assert pass_at_k(5, 4, 2) == 1.0
    assert pass_at_k(4, 4, 4) == 1.0
    # no correct sample -> exactly 0.0 (and not -0.0)
    val = pass_at_k(8, 0, 3)
    assert val == 0.0 and math.copysign(1.0, val) == 1.0


def test_pass_at_k_scalar_returns_python_float():
    assert type(pass_at_k(5, 2, 2)) is float
    assert type(pass_at_k(np.int64(5), np.int64(2), np.int64(2))) is float


def test_pass_at_k_exact_large_n_against_fractions():
    n = 10_000
    for c in [0, 1, 2, 7, 50, 333, 1000, 5000, 9990, 9999, 10_000]:
        for k in [1, 2, 3, 10, 64, 100, 1000, 5000, 10_000]:
            got = pass_at_k(n, c, k)
            want = _exact(n, c, k)
            assert got == pytest.approx(want, rel=1e-11, abs=1e-300), (c, k, got, want)


def test_pass_at_k_tiny_value_keeps_relative_precision():
    # NB: abs=0, pytest.approx's default absolute tolerance (1e-12) would hide precision loss here.
    # c=1, k=1: exactly 1/n; computing 1 - (1 - 1/n) in floating point loses ~4 of 16 digits
    for n in range(9000, 10_001):
        assert pass_at_k(n, 1, 1) == pytest.approx(1 / n, rel=4e-15, abs=0), n
    # 1 - C(9999, 2)/C(10000, 2) = 1 - 9998/10000 = 2e-4
    assert pass_at_k(10_000, 1, 2) == pytest.approx(2e-4, rel=1e-13, abs=0)


def test_pass_at_k_vectorised_matches_scalar():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 300, size=200)
    c = np.array([rng.integers(0, x + 1) for x in n])
    k = np.array([rng.integers(1, x + 1) for x in n])
    out = pass_at_k(n, c, k)
    assert isinstance(out, np.ndarray) and out.shape == (200,) and out.dtype == np.float64
    for i in range(200):
        assert out[i] == pytest.approx(_exact(int(n[i]), int(c[i]), int(k[i])), rel=1e-12, abs=1e-300)
    # 2-D arrays and a scalar k broadcast; shape kept
    out2 = pass_at_k(np.array([[5, 5], [10, 10]]), np.array([[2, 0], [3, 10]]), 2)
    # [[0.7, 0], [1 - C(7,2)/C(10,2) = 1 - 21/45, 1]]
    np.testing.assert_allclose(out2, [[0.7, 0.0], [1 - 21 / 45, 1.0]], rtol=1e-14)
    # list inputs behave like arrays
    np.testing.assert_allclose(pass_at_k([5, 5, 5], [0, 2, 5], [2, 2, 2]), [0.0, 0.7, 1.0])


@pytest.mark.parametrize(
    "n,c,k,msg",
    [
        (5, 2, 6, "k cannot exceed"),
        (5, 6, 2, "cannot exceed the number of samples"),
        (-1, 0, 1, "non-negative"),
        (5, -1, 1, "non-negative"),
        (5, 1, -2, "non-negative"),
        (5, 1, 0, "k must be >= 1"),
        (5.5, 1, 1, "integers"),
    ],
)
def test_pass_at_k_errors(n, c, k, msg):
    with pytest.raises(ValueError, match=msg):
        pass_at_k(n, c, k)


def test_pass_at_k_array_errors():
    with pytest.raises(ValueError, match="k cannot exceed"):
        pass_at_k(np.array([4, 8]), np.array([1, 1]), 5)
    with pytest.raises(ValueError, match="broadcastable"):
        pass_at_k(np.array([4, 8, 9]), np.array([1, 1]), 1)


# ----------------------------------------------------------------------------- curve
def test_default_ks():
    assert default_ks(1) == [1]
    assert default_ks(8) == [1, 2, 4, 8]
    assert default_ks(10) == [1, 2, 4, 8, 10]
    assert default_ks(16) == [1, 2, 4, 8, 16]


def test_pass_at_k_curve_hand_worked():
    # two problems, n = 4: c = 1 and c = 4
    # k=1: mean(1/4, 1)                    = 0.625
    # k=2: mean(1 - C(3,2)/C(4,2) = 1/2, 1) = 0.75
    # k=4: mean(1, 1)                      = 1.0
    curve = pass_at_k_curve(4, [1, 4])
    assert list(curve) == [1, 2, 4]
    assert curve[1] == pytest.approx(0.625)
    assert curve[2] == pytest.approx(0.75)
    assert curve[4] == pytest.approx(1.0)


def test_pass_at_k_curve_per_problem_n_and_custom_ks():
    # n = (6, 5): default ks go up to min(n) = 5 -> 1, 2, 4, 5
    curve = pass_at_k_curve([6, 5], [3, 0])
    assert list(curve) == [1, 2, 4, 5]
    # k=2: mean(1 - C(3,2)/C(6,2) = 1 - 3/15 = 0.8, 0) = 0.4
    assert curve[2] == pytest.approx(0.4)
    assert pass_at_k_curve([6, 5], [3, 0], ks=[3]) == {3: pytest.approx((1 - 1 / 20) / 2)}  # C(3,3)/C(6,3)=1/20
    with pytest.raises(ValueError):
        pass_at_k_curve([6, 5], [3, 0], ks=[6])


# ----------------------------------------------------------------------------- avg@n / maj@n
def test_avg_at_n():
    # (1 + 0 + 1 + 1 + 0 + 0) / 6 = 0.5
    assert avg_at_n([[1, 0, 1], [1, 0, 0]]) == pytest.approx(0.5)
    assert avg_at_n(np.array([[1, 1], [1, 0]])) == pytest.approx(0.75)
    # float scores are averaged as is: (0.5 + 1 + 0) / 3
    assert avg_at_n([[0.5, 1.0, 0.0]]) == pytest.approx(0.5)
    assert math.isnan(avg_at_n([]))


def test_maj_at_n_hand_worked():
    answers = [
        ["4", "4", "5", None],  # majority "4" (2 votes), one "4" correct -> solved
        ["1", "2", "2", "1"],  # tie 1 vs 2 -> first occurrence "1"; "1"s wrong -> unsolved
        [None, None, None],  # nothing extracted -> unsolved
        ["7", None, None, "8"],  # tie 7/8 -> "7", correct -> solved
    ]
    correct = [
        [1, 0, 0, 0],
        [0, 1, 1, 0],
        [0, 0, 0],
        [1, 0, 0, 0],
    ]
    # 2 solved of 4
    assert maj_at_n(answers, correct) == pytest.approx(0.5)
    # None never wins even when it is the most frequent "answer"
    assert maj_at_n([[None, None, "3"]], [[0, 0, 1]]) == 1.0
    # majority correct only via a later sample with the same answer
    assert maj_at_n([["9", "2", "9"]], [[0, 0, 1]]) == 1.0
    # minority correct answer does not count
    assert maj_at_n([["9", "2", "9"]], [[0, 1, 0]]) == 0.0
    # the majority need not come first: "9" (2 votes) beats the earlier "2" (1 vote)
    assert maj_at_n([["2", "9", "9"]], [[1, 0, 0]]) == 0.0
    assert maj_at_n([["2", "9", "9"]], [[0, 0, 1]]) == 1.0


def test_maj_at_n_with_an_equivalence():
    # Answers an `equivalent` calls equal pool their votes; the class's first member stands for it, ties go to the
    # class seen first, and the problem is solved when any member of the winning class is correct.
    same_case = lambda a, b: a.lower() == b.lower()  # noqa: E731
    assert maj_at_n([["x", "Y", "y", "X", "X"]], [[0, 0, 1, 0, 0]]) == 0.0  # strings: "X" (2) wins, wrong
    assert maj_at_n([["x", "Y", "y", "X", "X"]], [[0, 0, 1, 0, 0]], equivalent=same_case) == 0.0  # x-class 3 votes
    assert maj_at_n([["x", "Y", "y", "X", "X"]], [[1, 0, 0, 0, 0]], equivalent=same_case) == 1.0
    assert maj_at_n([["Y", "x", "y", "X", None]], [[1, 0, 0, 0, 0]], equivalent=same_case) == 1.0  # tie: "Y" first
    # math-verify's: \frac{1}{2}, 0.5 and 1/2 are one answer with 3 votes against 2 for 3.
    from exploration_trl.metrics.solutions import math_answers_equivalent

    answers, correct = [["\\frac{1}{2}", "3", "0.5", "3", "1/2"]], [[0, 0, 0, 0, 1]]
    assert maj_at_n(answers, correct) == 0.0
    assert maj_at_n(answers, correct, equivalent=math_answers_equivalent) == 1.0


def test_maj_at_n_errors():
    with pytest.raises(ValueError):
        maj_at_n([["1"]], [[1], [0]])
    with pytest.raises(ValueError):
        maj_at_n([["1", "2"]], [[1]])


# ----------------------------------------------------------------------------- parse_ks: the one k-list parser
@pytest.mark.parametrize("given, n, expected", [
    ("1,2,4,64", 64, [1, 2, 4, 64]),
    ("8, 2,,1, 2 ", 8, [1, 2, 8]),  # blanks skipped, sorted, each once
    ([4, "2", 4.0, np.int64(1)], 4, [1, 2, 4]),  # ints, integer strings, integral floats, numpy ints
    (3, 4, [3]),  # one integer
    ("1,1000", None, [1, 1000]),  # no n: no upper bound
    (None, 6, [1, 2, 4, 6]),  # default: 1, 2, 4, ..., n
    (None, None, None),
])
def test_parse_ks_values(given, n, expected):
    assert parse_ks(given, n) == expected


@pytest.mark.parametrize("given, n, msg", [
    ("1,two", 8, "k values must be integers, got '1,two'"),
    ([1, 2.5], 8, "k values must be integers, got [1, 2.5]"),  # no silent truncation to 2
    ([True], 8, "k values must be integers, got [True]"),
    (object(), 8, "k values must be integers, got <object"),
    ("", 8, "no k values given"),
    (" , ", 8, "no k values given"),
    ([], None, "no k values given"),
    ("0,2", 8, "k=0 is out of range: pass@k needs 1 <= k <= n=8"),
    ([-3, 16], 8, "k=-3 is out of range: pass@k needs 1 <= k <= n=8"),  # below 1 is named first
    ([1, 16, 32], 8, "k=16 is out of range: pass@k needs 1 <= k <= n=8"),  # the first k above n
])
def test_parse_ks_errors(given, n, msg):
    with pytest.raises(ValueError) as err:
        parse_ks(given, n)
    assert str(err.value).startswith(msg) and "\n" not in str(err.value)


def test_parse_ks_caller_messages_and_error_class():
    class Bad(ValueError):
        pass

    kw = dict(error=Bad, not_integers="A {ks!r}", empty="B n={n}", too_small="C {k} {n}", too_large="D {k} {n}")
    for given, msg in [("x", "A 'x'"), ("", "B n=4"), ("0", "C 0 4"), ("1,5", "D 5 4")]:
        with pytest.raises(Bad) as err:
            parse_ks(given, 4, **kw)
        assert str(err.value) == msg


def test_parse_ks_callers_keep_their_messages(tmp_path):
    """The four callers (eval CLI's --k, `run_eval`/`summarize`, `compare`, training's `eval_ks`) all parse with
    `parse_ks`, each with its own one-line messages."""
    from exploration_trl.eval import EvalError
    from exploration_trl.eval.command import parse_k_option
    from exploration_trl.eval.compare import compare
    from exploration_trl.eval.harness import summarize
    from exploration_trl.trainers.components.heldout_eval import parse_eval_ks

    assert parse_k_option("8,1,2") == [1, 2, 8] and parse_k_option(None) is None
    for given, msg in [("1,two", "--k expects a comma-separated list of integers such as 1,2,4,8, got '1,two'"),
                       ("0,1", "--k values must be positive integers, got '0,1'"),
                       (",", "--k values must be positive integers, got ','")]:
        with pytest.raises(EvalError) as err:
            parse_k_option(given)
        assert str(err.value) == msg

    rows = [{"correct": [True, False, False, False]}]
    assert list(summarize(rows, diversity=False)["pass_at_k"]) == ["1", "2", "4"]
    assert list(summarize(rows, ks="2,1,2", diversity=False)["pass_at_k"]) == ["1", "2"]
    for given, msg in [("1,x", "k values must be integers, got '1,x'"), ([], "no k values given"),
                       ([1, 8], "k=8 is out of range: pass@k needs 1 <= k <= n=4")]:
        with pytest.raises(EvalError) as err:
            summarize(rows, ks=given, diversity=False)
        assert str(err.value) == msg

    results = tmp_path / "results.json"
    results.write_text('{"schema": "exploration_trl.eval/results/v1", "problems": [{"n": 4, "c": 1}]}')
    for given, msg in [("1,x", "k values must be integers, got '1,x'"), ("0", "k values must be positive integers"),
                       ("", "k values must be positive integers"),
                       ([1, 8, 16], "k=8 exceeds the number of samples of every run (largest n = 4)")]:
        with pytest.raises(EvalError) as err:
            compare([results], ks=given)
        assert str(err.value) == msg

    assert parse_eval_ks(None, 8) == [1, 2, 4, 8] and parse_eval_ks("8,1", 8) == [1, 8]
    for given, msg in [([1, "a"], "eval_ks is [1, 'a'] but must be integers, e.g. [1, 8, 64]"),
                       ([], "eval_ks holds nothing but each k must satisfy 1 <= k <= eval_n=8"),
                       ([0, 1], "eval_ks holds 0 but each k must satisfy 1 <= k <= eval_n=8"),
                       ([1, 16], "eval_ks holds 16 but each k must satisfy 1 <= k <= eval_n=8")]:
        with pytest.raises(ValueError) as err:
            parse_eval_ks(given, 8)
        assert str(err.value) == msg
