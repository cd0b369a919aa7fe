"""Resource quantities (--cpu, --memory) are checked against the Kubernetes quantity grammar
before a TrainJob is built, so a dry run never prints a manifest the API server would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.cli import main
from envace.cluster.trainjob import (
    TrainJobSpec,
    check_cpu_quantity,
    check_memory_quantity,
)
from envace.errors import UserInputError


@pytest.mark.parametrize("value", ["16", "0.5", "500m", "2.5"])
def test_cpu_quantities_accepted(value: str) -> None:
    assert check_cpu_quantity(value, "--cpu") == value


@pytest.mark.parametrize("value", ["lots", "", "-1", "16 ", "16\n", "1.", ".5", "2Gi", "500mm"])
def test_cpu_quantities_refused(value: str) -> None:
    with pytest.raises(UserInputError, match=r"--cpu .* is not a Kubernetes CPU quantity.*500m"):
        check_cpu_quantity(value, "--cpu")


@pytest.mark.parametrize("value", ["128Gi", "512Mi", "1.5G", "1000000", "64k", "1Ti"])
def test_memory_quantities_accepted(value: str) -> None:
    assert check_memory_quantity(value, "--memory") == value


@pytest.mark.parametrize("value", ["lots", "", "128GB", "1K", "-1Gi", "Gi", "1.5.5Gi", "1Gi\n"])
def test_memory_quantities_refused(value: str) -> None:
    with pytest.raises(UserInputError, match=r"--memory .* is not a Kubernetes memory quantity"):
        check_memory_quantity(value, "--memory")


def test_memory_in_millibytes_gets_a_hint() -> None:
    with pytest.raises(UserInputError, match="m means milli-bytes; write Mi"):
        check_memory_quantity("128m", "--memory")


def test_spec_checks_its_quantities() -> None:
    with pytest.raises(UserInputError, match="--cpu 'x'"):
        TrainJobSpec(name="job", namespace="ns", cpu="x")
    with pytest.raises(UserInputError, match="--memory 'lots'"):
        TrainJobSpec(name="job", namespace="ns", memory="lots")


@pytest.mark.parametrize(("flag", "value"), [("--memory", "lots"), ("--cpu", "many")])
def test_dry_run_refuses_a_bad_quantity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    config = tmp_path / "train.yaml"
    config.write_text("seed: 0\n")
    argv = ["cluster", "submit", "--config", str(config), "--dry-run", flag, value]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{flag} {value!r} is not a Kubernetes" in err
