"""`envace pipeline compile` refuses an --out it cannot write and resource flags Kubernetes (or
kfp) would refuse, with one message naming the flag, before anything is compiled."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.cli import main


def _compile(capsys: pytest.CaptureFixture[str], out: Path, *flags: str) -> tuple[int, str]:
    code = main(["pipeline", "compile", "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_out_must_be_a_yaml_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _compile(capsys, tmp_path / "pipeline.json")
    assert code == 2 and "give a file path ending in .yaml" in err
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    code, err = _compile(capsys, folder)
    assert code == 2 and f"--out {folder}: is a folder" in err


def test_out_below_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    code, err = _compile(capsys, blocker / "sub" / "p.yaml")
    assert code == 2 and f"{blocker} is a file, not a folder" in err
    assert blocker.read_text() == "keep"


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(),
    reason="needs Linux /proc: the one folder where even root cannot create a file",
)
def test_unwritable_out_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Even root cannot create files in /proc: the write itself fails, after the checks.
    code, err = _compile(capsys, Path("/proc/x.yaml"))
    assert code == 2 and "cannot write /proc/x.yaml" in err


def test_compile_replaces_the_old_file_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "p.yml"
    code, _ = _compile(capsys, out, "--rounds=0")
    assert code == 0 and out.read_text().startswith("# PIPELINE DEFINITION")
    assert sorted(p.name for p in out.parent.iterdir()) == ["p.yml"]  # no scratch file left


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--cpu=lots", "--cpu 'lots' is not a Kubernetes CPU quantity"),
        ("--memory=lots", "--memory 'lots' is not a Kubernetes memory quantity"),
        ("--memory=1.5Gi", "pipeline steps take a whole number"),
        ("--shm-size=big", "--shm-size 'big' is not a Kubernetes memory quantity"),
        ("--gpus=-1", "--gpus -1: must be 0 or more"),
        ("--rounds=-2", "--rounds -2: must be 0 or more"),
        ("--store=ftp://x", "--store 'ftp://x': unsupported URI scheme 'ftp'"),
        ("--store=runs/here", "--store 'runs/here': a local folder"),
        ("--store=minio://Bad_Bucket/runs", "--store 'minio://Bad_Bucket/runs': bad bucket name"),
        ("--store-endpoint=notaurl", "--store-endpoint='notaurl': give host:port"),
        ("--store-endpoint=ftp://m:9000", "--store-endpoint='ftp://m:9000': give host:port"),
        ("--store-endpoint=http://m:99999", "--store-endpoint='http://m:99999': the port"),
    ],
)
def test_bad_quantities_are_user_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    code, err = _compile(capsys, tmp_path / "p.yaml", flag)
    assert code == 2 and message in err
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize(
    "endpoint", ["http://envace-minio:9000", "minio.example.com:443", "https://s3.amazonaws.com"]
)
def test_store_endpoints_the_steps_accept_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], endpoint: str
) -> None:
    code, _ = _compile(
        capsys,
        tmp_path / "p.yaml",
        "--rounds=0",
        "--store=s3://team/runs",
        f"--store-endpoint={endpoint}",
    )
    assert code == 0
    assert f"defaultValue: {endpoint}" in (tmp_path / "p.yaml").read_text()
