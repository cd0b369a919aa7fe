"""`envace store ...` run in-process through `envace.cli.main`, against the S3 test server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envace.cli import main


def _src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "tok").mkdir(parents=True)
    (src / "weights.bin").write_bytes(b"\x07" * 5000)
    (src / "tok" / "vocab.txt").write_text("a\nb\n")
    return src


def test_put_ls_verify_get_latest(
    env_s3: Any, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"minio://{bucket}/run/ckpt/iter_000003"
    assert main(["store", "put", str(_src(tmp_path)), uri]) == 0
    assert f"committed {uri}: 2 file(s), 5004 bytes" in capsys.readouterr().out

    assert main(["store", "ls", f"minio://{bucket}/run/ckpt"]) == 0
    assert capsys.readouterr().out.split() == ["DIR", f"{uri}/"]
    assert main(["store", "ls", "-r", uri]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[1] for r in rows] == [
        f"{uri}/MANIFEST.json",
        f"{uri}/tok/vocab.txt",
        f"{uri}/weights.bin",
    ]
    assert [r[0] for r in rows[1:]] == ["4", "5000"]

    assert main(["store", "verify", "--deep", uri]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK {uri}: 2 file(s), 5004 bytes") and "sizes and sha256" in out

    assert main(["store", "get", uri, str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "weights.bin").read_bytes() == b"\x07" * 5000
    assert rows[0][0] == str((tmp_path / "out" / "MANIFEST.json").stat().st_size)
    capsys.readouterr()

    assert main(["store", "latest", f"minio://{bucket}/run/ckpt"]) == 0
    assert capsys.readouterr().out.strip() == uri


@pytest.mark.parametrize("where", ["s3", "local"])
def test_verify_exits_1_on_missing_partial_and_corrupt(
    where: str, env_s3: Any, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = f"minio://{bucket}/v" if where == "s3" else str(tmp_path / "store")
    uri = f"{base}/a"
    assert main(["store", "verify", uri]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"envace store verify: FAILED: no artifact at {uri}: nothing is stored there"
    )

    assert main(["store", "put", str(_src(tmp_path)), uri]) == 0
    from envace.storage import open_store

    store, key = open_store(uri)
    store.put_bytes(b"\x08" * 5000, f"{key}/weights.bin".lstrip("/"))  # same size, new bytes
    capsys.readouterr()
    assert main(["store", "verify", uri]) == 0  # sizes still agree
    assert main(["store", "verify", "--deep", uri]) == 1
    err = capsys.readouterr().err
    assert "corrupt artifact at" in err and "weights.bin (sha256 differs" in err
    assert len(err.strip().splitlines()) == 1

    store.delete(f"{key}/MANIFEST.json".lstrip("/"))
    assert main(["store", "verify", uri]) == 1
    assert f"partial artifact at {uri}" in capsys.readouterr().err
    assert main(["store", "latest", base]) == 1
    assert "no complete checkpoint" in capsys.readouterr().err


def test_user_errors_exit_2_with_one_line(
    env_s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["store", "put", str(tmp_path / "missing"), "minio://envace/x"]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["store", "get", "minio://envace/../x", str(tmp_path)]) == 2
    assert "'..' segment" in capsys.readouterr().err
    monkeypatch.delenv("ENVACE_S3_SECRET_KEY")
    assert main(["store", "ls", "s3://envace/x"]) == 2
    assert (
        "ENVACE_S3_SECRET_KEY or ENVACE_S3_SECRET_KEY_FILE or AWS_SECRET_ACCESS_KEY"
        in capsys.readouterr().err
    )


def test_cli_import_stays_light() -> None:
    """`envace --help` imports every cli module: ours must not pull in the minio SDK."""
    code = (
        "import sys, envace.storage.cli, envace.storage;"
        "assert 'minio' not in sys.modules and 'urllib3' not in sys.modules, sorted(sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
