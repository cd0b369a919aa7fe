"""`envace tasks validate|import|generate`, run in-process through `envace.cli.main`."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from envace.cli import main
from envace.tasks import import_reference, load_tasks
from tests.helpers.task_cli import run, task

FIXTURES = Path(__file__).parent / "fixtures"
VALID = FIXTURES / "valid_tasks.jsonl"


def bad_file(tmp_path: Path) -> Path:
    """Line 1 valid, line 2 bad (no turns), line 3 valid, line 4 not JSON, line 6 valid."""
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(task("a")), json.dumps(task("b", turns=[])), json.dumps(task("c"))]
    lines += ["{oops", "", json.dumps(task("d"))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# validate


def test_validate_valid_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "tasks", "validate", str(VALID))
    assert (code, out, err) == (0, "3 valid, 0 invalid\n", "")


def test_validate_stops_each_file_at_its_first_bad_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "tasks", "validate", str(bad_file(tmp_path)), str(VALID))

    assert code == 2
    assert err.splitlines() == [
        f"{tmp_path / 'bad.jsonl'}:2 (id=b): turns: must have at least 1 item"
    ]
    assert out == (
        "4 valid, 1 invalid, 3 not checked (each file stops at its first bad task; "
        "use --skip-invalid to check them all)\n"
    )


def test_validate_skip_invalid_checks_every_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bad_file(tmp_path)
    code, out, err = run(capsys, "tasks", "validate", "--skip-invalid", str(path))

    assert code == 2
    assert out == "3 valid, 2 invalid\n"
    errors = [line for line in err.splitlines() if line.startswith(str(path) + ":")]
    assert errors == [
        f"{path}:2 (id=b): turns: must have at least 1 item",
        f"{path}:4: not valid JSON: Expecting property name enclosed in double quotes at column 2",
    ]


def test_validate_counts_unreadable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    code, out, err = run(capsys, "tasks", "validate", str(missing), str(VALID))
    assert code == 2
    assert (
        err == f"{missing}: cannot read the task file: No such file or directory; check the path\n"
    )
    assert out == "3 valid, 0 invalid, 1 unreadable file(s)\n"


@pytest.mark.skipif(
    importlib.util.find_spec("envace.envs.registry") is None,
    reason="envace.envs.registry is not installed",
)
def test_validate_checks_environment_names_against_the_registry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "env.jsonl"
    path.write_text(json.dumps(task("e", environment={"name": "no-such-world"})) + "\n")
    code, _, err = run(capsys, "tasks", "validate", str(path))
    assert code == 2
    assert err.startswith(f"{path}:1 (id=e): environment.name: unknown environment 'no-such-world'")


def test_tasks_without_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(capsys, "tasks")
    assert code == 2
    assert "validate" in err and "import" in err and "generate" in err


# ---------------------------------------------------------------------------------------------
# import


def test_import_writes_a_loadable_task_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = FIXTURES / "reference_records.json"
    out_path = tmp_path / "out" / "tasks.jsonl"
    code, out, err = run(capsys, "tasks", "import", str(src), "--out", str(out_path))

    assert code == 0 and err == ""
    assert out == f"imported 2 task(s) from {src} to {out_path}\n"
    assert load_tasks(out_path, known_environments=()).tasks == import_reference(src)


def test_import_bad_record_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = json.loads((FIXTURES / "reference_records.json").read_text("utf-8"))
    records[1]["extra_info"]["tools"] = "not json"
    src = tmp_path / "refs.json"
    src.write_text(json.dumps(records), encoding="utf-8")
    out_path = tmp_path / "tasks.jsonl"

    code, out, err = run(capsys, "tasks", "import", str(src), "--out", str(out_path))
    assert code == 2 and out == ""
    assert err.startswith(
        f"envace: error: {src} record 1 (id=18): extra_info.tools: not valid JSON"
    )
    assert not out_path.exists()

    code, out, err = run(
        capsys, "tasks", "import", str(src), "--out", str(out_path), "--skip-invalid"
    )
    assert code == 0
    assert out == f"imported 1 task(s) from {src} to {out_path} (1 invalid record(s) skipped)\n"
    assert f"{src} record 1 (id=18): extra_info.tools" in err
    assert [t.id for t in load_tasks(out_path, known_environments=()).tasks] == ["fbf37337-aaaa"]


def test_import_with_nothing_valid_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "empty.json"
    src.write_text("[]", encoding="utf-8")
    code, _, err = run(capsys, "tasks", "import", str(src), "--out", str(tmp_path / "o.jsonl"))
    assert code == 2
    assert err == f"envace: error: {src}: no valid record to import; nothing written\n"


# ---------------------------------------------------------------------------------------------
# generate


@pytest.mark.parametrize(
    ("flag", "value"), [("--n-train", "0"), ("--n-test", "0"), ("--n-train", "-3")]
)
def test_generate_refuses_empty_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    argv = {"--n-train": "4", "--n-test": "2"} | {flag: value}
    code, out, err = run(
        capsys, "tasks", "generate", "--out", str(tmp_path), *[x for kv in argv.items() for x in kv]
    )
    assert code == 2 and out == ""
    assert err == f"envace: error: {flag} must be at least 1, got {value}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(
    importlib.util.find_spec("envace.tasks.generate") is None,
    reason="envace.tasks.generate is not installed",
)
def test_generate_writes_loadable_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "gen"
    argv = ("tasks", "generate", "--out", str(out_dir), "--n-train", "3", "--n-test", "2")
    code, out, _err = run(capsys, *argv)
    assert code == 0
    counts: dict[str, int] = {}
    paths: dict[str, Path] = {}
    for line in out.splitlines():
        split, rest = line.split(": ", 1)
        path_text, count_text = rest.rsplit(" (", 1)
        paths[split], counts[split] = Path(path_text), int(count_text.split()[0])
        assert paths[split].parent == out_dir
    assert counts["train"] == 3 and counts["test"] == 2
    # the task splits are valid task files
    for split in ("train", "test"):
        assert len(load_tasks(paths[split]).tasks) == counts[split]

    shutil.rmtree(out_dir)
    code_again, out_again, _ = run(capsys, *argv)
    assert (code_again, out_again) == (0, out), "same seed, same output"


def test_generate_commits_to_a_store(tmp_path: Path) -> None:
    from envace.storage.artifacts import verify

    out, store = tmp_path / "out", tmp_path / "store"
    assert (
        main(
            [
                "tasks",
                "generate",
                "--out",
                str(out),
                "--n-train",
                "2",
                "--n-test",
                "1",
                "--store",
                str(store),
            ]
        )
        == 0
    )
    names = {f.path for f in verify(str(store)).files}
    assert names == {"train.jsonl", "test.jsonl", "gold_train.jsonl"}
