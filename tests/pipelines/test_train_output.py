"""The train step never loses a committed artifact: an output that overlaps an input, or that
already holds something committed from other inputs, is refused before any work; an output an
earlier attempt of the same step committed (a KFP retry) is returned as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace import stages
from envace.cli import main
from envace.config import Config, load_config
from envace.errors import UserInputError
from envace.policy.hf_backend import load_model_and_tokenizer
from envace.stages.steps import _check_train_output as check_train_output
from envace.storage.artifacts import commit_dir, verify
from envace.storage.manifest import MANIFEST_NAME
from tests.pipelines.test_stages import _rows, _store_rows


@pytest.fixture(scope="module")
def inputs(
    tmp_path_factory: pytest.TempPathFactory, micro: list[str]
) -> tuple[Config, Path, str, str]:
    """(config, config file, checkpoint, rows it sampled), committed in a local store."""
    tmp = tmp_path_factory.mktemp("train-output")
    cfg = load_config(None, [*micro, "warm_start.enabled=false"])
    checkpoint = stages.prepare(cfg, str(tmp / "store")).checkpoint_uri
    _model, tokenizer = load_model_and_tokenizer(checkpoint)
    rows = _store_rows(_rows(tokenizer), checkpoint, str(tmp / "store" / "rows"), tmp / "r")
    config_file = tmp / "config.yaml"
    config_file.write_text(stages.config_text(cfg))
    return cfg, config_file, checkpoint, rows


def _manifests(*uris: str) -> dict[str, tuple[bytes, int]]:
    """Each artifact's manifest and its mtime: equal means it was never re-committed."""
    manifests = {uri: Path(uri) / MANIFEST_NAME for uri in uris}
    return {uri: (m.read_bytes(), m.stat().st_mtime_ns) for uri, m in manifests.items()}


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("{ckpt}", "is the input checkpoint"),
        ("{ckpt}/", "is the input checkpoint"),
        ("{ckpt}/../init", "is the input checkpoint"),
        ("{ckpt}/next", "is inside the input checkpoint"),
        ("{ckpt}/..", "contains the input checkpoint"),
        ("{rows}", "is the rows"),
        ("{rows}/ckpt", "is inside the rows"),
    ],
)
def test_train_step_refuses_an_output_overlapping_an_input(
    inputs: tuple[Config, Path, str, str],
    capsys: pytest.CaptureFixture[str],
    out: str,
    message: str,
) -> None:
    _cfg, config_file, checkpoint, rows = inputs
    before = _manifests(checkpoint, rows)
    argv = ["pipeline", "train-step", "--config", str(config_file), "--checkpoint", checkpoint]
    argv += ["--trajectories", rows, "--out", out.format(ckpt=checkpoint, rows=rows)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "(--out)" in err and "Traceback" not in err
    assert _manifests(checkpoint, rows) == before  # the inputs are still committed, unchanged
    verify(checkpoint, deep=True)
    verify(rows, deep=True)
    assert not (Path(checkpoint) / "next").exists() and not (Path(rows) / "ckpt").exists()


def test_minio_and_s3_spellings_of_one_location_overlap() -> None:
    with pytest.raises(UserInputError, match="is inside the input checkpoint"):
        check_train_output("minio://b-1/run/ckpt", "s3://b-1/rows", "s3://b-1/run/ckpt/x")


@pytest.mark.parametrize("iterations", ["0", "-1"])
def test_train_step_needs_at_least_one_iteration(
    inputs: tuple[Config, Path, str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    iterations: str,
) -> None:
    _cfg, config_file, checkpoint, rows = inputs
    argv = ["pipeline", "train-step", "--config", str(config_file), "--checkpoint", checkpoint]
    argv += ["--trajectories", rows, "--out", str(tmp_path / "out")]
    assert main([*argv, "--total-iterations", iterations]) == 2
    assert f"--total-iterations {iterations}: must be 1 or more" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_output_committed_from_other_inputs_is_never_replaced(
    inputs: tuple[Config, Path, str, str], tmp_path: Path
) -> None:
    cfg, _config_file, checkpoint, rows = inputs
    other = tmp_path / "other"  # a committed artifact that is no train step's output
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    commit_dir(other, str(other))
    before = _manifests(str(other))
    with pytest.raises(UserInputError, match="already holds an artifact"):
        stages.train(cfg, checkpoint, rows, str(other))
    assert _manifests(str(other)) == before and (other / "keep.txt").read_text() == "precious"
    verify(str(other), deep=True)


def test_a_retried_step_returns_its_committed_checkpoint_and_other_inputs_are_refused(
    inputs: tuple[Config, Path, str, str], tmp_path: Path, micro: list[str]
) -> None:
    cfg, _config_file, checkpoint, rows = inputs
    out = str(tmp_path / "iter_000001")
    first = stages.train(cfg, checkpoint, rows, out, total_iterations=2)
    meta = json.loads((Path(out) / stages.CHECKPOINT_META).read_text())
    assert meta["checkpoint"] == checkpoint and meta["rows"] == rows
    assert meta["config_digest"] == stages.config_digest(cfg) and meta["total_iterations"] == 2
    before = _manifests(out)
    again = stages.train(cfg, checkpoint, rows, out, total_iterations=2)  # a KFP retry
    assert again == first
    assert _manifests(out) == before  # returned as it was, never un-committed
    other_cfg = load_config(None, [*micro, "warm_start.enabled=false", "train.lr=5e-4"])
    for config, horizon in ((other_cfg, 2), (cfg, 3)):
        with pytest.raises(UserInputError, match="already holds a checkpoint trained from other"):
            stages.train(config, checkpoint, rows, out, total_iterations=horizon)
    assert _manifests(out) == before
    verify(out, deep=True)
