"""``crashproof verify`` in-process: JSON for CI, exit codes, the matrix and the seed."""

from __future__ import annotations

import json

import pytest

from crashproof.cli import main


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich tables: no folding in assertions


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "verify", "verify_scenarios:TINY", "--seed", "3", "--recovery-points", "1", "--json"
    )
    assert code == 0
    report = json.loads(out)
    assert report["ok"] is True
    assert report["seed"] == 3
    assert report["target"] == "verify_scenarios:TINY"
    assert report["crash_points"] == len(report["reference"]["crash_points"]) > 10
    assert report["counts"]["DIVERGED"] == 0
    assert len(report["reference"]["fingerprint"]) == 64
    kinds = {r["case"]["kind"] for r in report["results"]}
    # Two recoverers and a stale checkpoint are on by default (at 2 crash points).
    assert kinds == {
        "reference",
        "redelivery",
        "crash",
        "double-crash",
        "two-recoverers",
        "stale-checkpoint",
    }
    assert report["kind_counts"]["stale-checkpoint"] == {"SAME": 2, "REFUSED": 0, "DIVERGED": 0}
    assert report["repro"] == (
        "crashproof verify verify_scenarios:TINY --mode inproc --seed 3 --recovery-points 1"
    )


def test_diverged_exits_1_with_matrix_and_seed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "verify", "verify_scenarios:LEAKY", "--seed", "77", "--recovery-points", "0"
    )
    assert code == 1
    assert "crash matrix: leaky (inproc), seed 77" in out
    assert "DIVERGED" in out
    assert (
        "seed 77; replay with: crashproof verify verify_scenarios:LEAKY --mode inproc --seed 77"
        in out
    )


def test_json_on_divergence(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "verify", "verify_scenarios:LEAKY", "--json", "--max-points", "3", "--seed", "1"
    )
    report = json.loads(out)
    assert report["max_points"] == 3
    assert len([r for r in report["results"] if r["case"]["kind"] == "crash"]) == 3
    assert code == (0 if report["ok"] else 1)


def test_subprocess_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "verify",
        "verify_scenarios:TINY",
        "--mode",
        "subprocess",
        "--seed",
        "3",
        "--max-points",
        "2",
        "--recovery-points",
        "0",
        "--workers",
        "2",
        "--json",
    )
    assert code == 0, out
    report = json.loads(out)
    assert report["mode"] == "subprocess"
    # 2 crashes, 1 reference, 1 redelivery, and by default at (up to) 2 of the crash
    # points tried: a race, a take-over and a stale checkpoint each.
    stale = sum(report["kind_counts"]["stale-checkpoint"].values())
    assert stale >= 1
    assert report["counts"] == {"SAME": 4 + 3 * stale, "REFUSED": 0, "DIVERGED": 0}


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("verify_scenarios", "does not name a scenario"),
        ("verify_scenarios:FileEnv", "is not a crashproof.verify.Scenario"),
        ("no_such_module_here:X", "cannot import module"),
        ("verify_scenarios:STEP_WITH_EFFECT.nope", "is not a crashproof.verify.Scenario"),
    ],
)
def test_bad_targets_are_usage_errors(
    capsys: pytest.CaptureFixture[str], target: str, message: str
) -> None:
    code, _, err = run(capsys, "verify", target)
    assert code == 2
    assert message in err


def test_bad_mode_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, "verify", "verify_scenarios:TINY", "--mode", "sideways")
    assert code == 2


def test_powercut_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "verify", "verify_scenarios:TINY", "--mode", "powercut", "--seed", "5", "--json"
    )
    assert code == 0, out
    report = json.loads(out)
    assert report["mode"] == "powercut"
    assert report["counts"]["DIVERGED"] == 0
    assert report["counts"]["SAME"] == len(report["results"])
