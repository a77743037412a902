"""code_execution: HumanEval tests in a sandboxed subprocess."""

import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from exploration_trl.rewards import (
    code_execution,
    make_code_execution,
    pop_failure_counts,
)
from exploration_trl.rewards.code import (
    build_program,
    extract_code,
    run_in_sandbox,
    sandbox_capabilities,
)

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs POSIX resource limits")

HUMANEVAL = Path(__file__).resolve().parents[1] / "exploration_trl" / "data" / "benchmarks" / "HumanEval.jsonl.gz"


@pytest.fixture(scope="module")
def problems():
    with gzip.open(HUMANEVAL, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == 164
    return {row["task_id"]: row for row in rows}


def columns(rows):
    return dict(
        test=[r["test"] for r in rows],
        entry_point=[r["entry_point"] for r in rows],
        prompts=[r["prompt"] for r in rows],
    )


def _sandbox_dirs():
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("exploration-trl-sandbox-")}


def _processes_of(uid):
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def test_canonical_solutions_pass(problems):
    rows = list(problems.values())[::7]  # 24 problems spread over the file
    assert len(rows) >= 20
    before = _sandbox_dirs()
    start = time.monotonic()
    rewards = code_execution([r["canonical_solution"] for r in rows], **columns(rows))
    elapsed = time.monotonic() - start
    assert rewards == [1.0] * len(rows), [r["task_id"] for r, x in zip(rows, rewards) if x != 1.0]
    assert elapsed < 30
    assert _sandbox_dirs() <= before  # every temporary directory was removed


def test_full_function_in_fence_and_conversational(problems):
    rows = [problems["HumanEval/0"], problems["HumanEval/10"]]  # /10 needs a helper from its prompt
    fenced = [f"Here you go:\n```python\n{r['prompt']}{r['canonical_solution']}```\nDone." for r in rows]
    assert code_execution(fenced, **columns(rows)) == [1.0, 1.0]
    conv = [[{"role": "assistant", "content": c}] for c in fenced]
    assert code_execution(conv, **columns(rows)) == [1.0, 1.0]
    # full definition without the prompt's imports/helpers still works: the header is prepended
    bare = (
        "```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        + rows[0]["canonical_solution"]
        + "```"
    )
    assert code_execution([bare], **columns(rows[:1])) == [1.0]


def test_wrong_solution_fails(problems):
    row = problems["HumanEval/2"]  # truncate_number
    rewards = code_execution(["    return number\n", "    return number % 1.0\n"], **columns([row, row]))
    assert rewards == [0.0, 1.0]
    assert code_execution(["this is not python at all :("], **columns([row])) == [0.0]


def test_exit_zero_is_not_a_pass(problems):
    row = problems["HumanEval/2"]
    hacks = ["    return 0\nimport os\nos._exit(0)\n", "    return 0\nraise SystemExit(0)\n"]
    assert code_execution(hacks, **columns([row, row])) == [0.0, 0.0]


def test_infinite_loop_times_out(problems):
    pop_failure_counts()
    row = problems["HumanEval/2"]
    timeout = 1.5
    reward = make_code_execution(timeout=timeout)
    start = time.monotonic()
    assert reward(["    while True:\n        pass\n"], **columns([row])) == [0.0]
    elapsed = time.monotonic() - start
    assert elapsed < timeout + 2.0
    assert pop_failure_counts() == {"code_execution": 1}
    assert pop_failure_counts() == {}


def test_memory_hog_fails(problems):
    row = problems["HumanEval/2"]
    hog = "    x = bytearray(4 * 1024 ** 3)\n    return number % 1.0\n"
    assert code_execution([hog], **columns([row]), memory_mb=256) == [0.0]


def test_python_fork_bomb_is_blocked(problems):
    row = problems["HumanEval/2"]
    bomb = "    import os\n    while True:\n        os.fork()\n"
    start = time.monotonic()
    assert code_execution([bomb], **columns([row]), timeout=3.0) == [0.0]
    assert time.monotonic() - start < 5.0
    assert os.getpid() > 0 and code_execution(["    return number % 1.0\n"], **columns([row])) == [1.0]


def test_native_fork_bomb_is_contained():
    caps = sandbox_capabilities()
    if hasattr(os, "geteuid") and os.geteuid() == 0 and caps["drop"] is None:
        pytest.skip("root without a privilege drop: RLIMIT_NPROC would not apply, so don't fork-bomb")
    # Bounded, so it stays harmless even if the limit failed: at most 200 sleeping children.
    probe = (
        "import ctypes, os, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "made = 0\n"
        "while made < 200:\n"
        "    pid = libc.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    if pid < 0:\n"
        "        break\n"
        "    made += 1\n"
        "assert made < 64, made\n"
    )
    result = run_in_sandbox(probe, timeout=10.0, nproc=32)
    assert result.passed, result
    # an unbounded native fork bomb scores 0.0 and is cleaned up with the sandbox
    bomb = "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()\n"
    start = time.monotonic()
    result = run_in_sandbox(bomb, timeout=1.5, nproc=32)
    assert result.status == "timeout" and time.monotonic() - start < 4.0
    if caps["drop"]:
        import pwd

        uid = pwd.getpwnam("nobody").pw_uid
        deadline = time.monotonic() + 5
        while _processes_of(uid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_of(uid) == 0


def test_files_stay_in_the_sandbox(problems, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    row = problems["HumanEval/2"]
    writer = (
        "    with open('leak.txt', 'w') as fh:\n"
        "        fh.write('x')\n"
        "    import os\n"
        "    os.makedirs('sub/dir', exist_ok=True)\n"
        "    return number % 1.0\n"
    )
    assert code_execution([writer], **columns([row])) == [1.0]
    assert list(tmp_path.iterdir()) == []


def test_os_system_and_network_do_not_succeed(problems):
    row = problems["HumanEval/2"]
    # a world-writable directory, so that only the sandbox's own guards can stop the write
    target_dir = Path(tempfile.mkdtemp(prefix="rewards-test-"))
    target_dir.chmod(0o777)
    marker = target_dir / "pwned"
    attempt = (
        "    import os, subprocess\n"
        "    for run in (lambda: os.system('touch " + str(marker) + "'),\n"
        "                lambda: subprocess.run(['touch', '" + str(marker) + "']),\n"
        "                lambda: os.popen('touch " + str(marker) + "')):\n"
        "        try:\n"
        "            run()\n"
        "        except Exception:\n"
        "            pass\n"
        "    return number % 1.0\n"
    )
    try:
        assert code_execution([attempt], **columns([row])) == [1.0]
        assert not marker.exists()
    finally:
        shutil.rmtree(target_dir, ignore_errors=True)
    # network: the function only returns the right value if a connection succeeds
    net = (
        "    import socket, urllib.request\n"
        "    try:\n"
        "        socket.create_connection(('1.1.1.1', 53), timeout=1).close()\n"
        "        return number % 1.0\n"
        "    except Exception:\n"
        "        pass\n"
        "    try:\n"
        "        urllib.request.urlopen('http://example.com', timeout=1)\n"
        "        return number % 1.0\n"
        "    except Exception:\n"
        "        return -1.0\n"
    )
    assert code_execution([net], **columns([row])) == [0.0]
    blocked = run_in_sandbox(
        "import socket\n"
        "try:\n"
        "    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "except OSError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('socket created')\n"
    )
    assert blocked.passed, blocked


def test_malformed_rows_counted(problems):
    pop_failure_counts()
    row = problems["HumanEval/2"]
    cols = columns([row] * 3)
    cols["entry_point"][1] = "not an identifier!"
    cols["test"][2] = None
    assert code_execution([None, "    return number % 1.0\n", "    return 0\n"], **cols) == [0.0, 0.0, 0.0]
    assert pop_failure_counts() == {"code_execution": 3}


def test_extract_code_prefers_block_defining_entry_point():
    text = "```python\ndef f(x):\n    return 1\n```\n```bash\nls\n```\n```python\nprint(f(2))\n```"
    assert extract_code(text, "f").startswith("def f(x)")
    assert extract_code(text).startswith("print")
    assert extract_code("plain code") == "plain code"
    program = build_program("    return 1\n", "def check(c):\n    assert c() == 1\n", "g", header="def g():\n")
    assert program.startswith("def g():\n    return 1\n") and program.rstrip().endswith("check(g)")
