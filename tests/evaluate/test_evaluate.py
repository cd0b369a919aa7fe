"""Evaluation: committed execution in the real worlds, metrics, and the `envace evaluate` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.cli import main
from envace.evaluate.metrics import field_agreement, summarize
from envace.evaluate.runner import evaluate_policy
from envace.policy.types import ToolCall
from envace.rollout.engine import RolloutConfig
from envace.rollout.policies import OraclePolicy, RandomPolicy
from envace.rollout.types import CallRecord, Trajectory


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    assert (
        main(
            [
                "tasks",
                "generate",
                "--out",
                str(out),
                "--n-train",
                "6",
                "--n-test",
                "30",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    return out


def test_oracle_scores_one_and_random_about_zero(
    task_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "evaluate",
                "--policy",
                "oracle",
                "--tasks",
                str(task_dir / "test.jsonl"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    oracle = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert oracle["n_tasks"] == 30
    assert oracle["success_rate"] == 1.0
    assert oracle["valid_call_rate"] == 1.0
    assert oracle["rehearsal_fidelity"] == 1.0
    assert "success_rate" in capsys.readouterr().out
    assert (
        main(
            [
                "evaluate",
                "--policy",
                "random",
                "--tasks",
                str(task_dir / "test.jsonl"),
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    rnd = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert rnd["success_rate"] <= 0.1
    assert rnd["rehearsal_fidelity"] is not None and rnd["rehearsal_fidelity"] < 0.2
    lines = (tmp_path / "r" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 30 and json.loads(lines[0])["messages"][0]["role"] in ("system", "user")


def test_bad_inputs_exit_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    assert (
        main(["evaluate", "--policy", "oracle", "--tasks", str(bad), "--out", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err
    assert "bad.jsonl:1" in err and "Traceback" not in err
    assert (
        main(["evaluate", "--policy", str(tmp_path), "--tasks", str(bad), "--out", str(tmp_path)])
        == 2
    )


def test_fidelity_metrics_by_hand() -> None:
    assert field_agreement({"a": 1, "b": 2}, {"a": 1, "b": 3}) == 0.5
    assert field_agreement({"a": 1}, {"a": 1, "c": 0}) == 0.5
    assert field_agreement([1], [1]) == 1.0
    from envace.tasks.model import Task, Turn

    task = Task(
        id="t",
        tools=({"type": "function", "function": {"name": "f", "parameters": {}}},),
        turns=(Turn("u"),),
    )
    call = ToolCall("f", {})
    traj = Trajectory(task=task, traj_id="t#0", reward=1.0, success=True, turn_scores=[1.0])
    traj.calls = [
        CallRecord(0, call, {"x": 1}, "real", True, rehearsed={"x": 1}),
        CallRecord(0, call, {"x": 1, "y": 2}, "real", True, rehearsed={"x": 1, "y": 3}),
        CallRecord(
            0, call, {"error": {"code": "E"}}, "real", False, rehearsed={"error": {"code": "E"}}
        ),
        CallRecord(0, call, {"error": {"code": "E"}}, "real", False, rehearsed={"ok": 1}),
    ]
    m = summarize([traj])
    assert m.rehearsal_fidelity == 0.5  # 2 of 4 exact
    assert m.rehearsal_field_fidelity == pytest.approx((1 + 0.5 + 1 + 0) / 4)
    assert m.error_flag_recall == 0.5 and m.error_flag_false_rate == 0.0
    assert m.valid_call_rate == 0.5 and m.calls_per_task == 4


def test_evaluate_policy_without_probes_reports_no_fidelity(task_dir: Path) -> None:
    from envace.tasks.loader import load_tasks

    tasks = load_tasks(task_dir / "test.jsonl").tasks[:5]
    res = evaluate_policy(OraclePolicy(), tasks, RolloutConfig(), probe_fidelity=False)
    assert res.metrics.success_rate == 1.0 and res.metrics.rehearsal_fidelity is None
    res = evaluate_policy(RandomPolicy(1), tasks, RolloutConfig())
    assert res.metrics.n_episodes == 5


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
        (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
        (["--rehearsal-temperature", "inf"], "--rehearsal-temperature must be a finite number"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--max-context-tokens", "0"], "--max-context-tokens must be >= 1, got 0"),
        (["--rehearsal-memory-tokens", "0"], "--rehearsal-memory-tokens must be >= 1"),
        (["--max-context-tokens", "256"], "--max-context-tokens (256) must be greater than"),
        (["--store", "ftp://x"], "unsupported URI scheme 'ftp'"),
    ],
)
def test_bad_flags_are_refused_before_the_evaluation_runs(
    task_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    out = tmp_path / "o"
    args = ["evaluate", "--policy", "oracle", "--tasks", str(task_dir / "test.jsonl")]
    assert main([*args, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (out / "report.json").exists()  # refused up front: nothing was evaluated


def test_a_missing_or_corrupt_checkpoint_exits_2_naming_it(
    task_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    micro_model: object,
    tiny_tokenizer: object,
) -> None:
    from envace.policy.tiny import save_checkpoint

    args = ["evaluate", "--tasks", str(task_dir / "test.jsonl"), "--out", str(tmp_path / "o")]
    assert main([*args, "--policy", "/nonexistent/dir"]) == 2
    err = capsys.readouterr().err
    assert "no such checkpoint directory: /nonexistent/dir" in err
    assert "oracle, random, empty" in err and "Repo id" not in err
    ckpt = save_checkpoint(micro_model, tiny_tokenizer, tmp_path / "ckpt")
    (ckpt / "model.safetensors").write_bytes(b"\x01\x02")
    assert main([*args, "--policy", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert f"cannot load the checkpoint {ckpt}" in err and "re-download" in err
    assert "Traceback" not in err


def test_evaluate_takes_the_runs_prompt_settings() -> None:
    """`envace evaluate` can show a checkpoint the prompts it was trained with."""
    import argparse

    from envace.evaluate import cli as evaluate_cli

    parser = argparse.ArgumentParser()
    evaluate_cli.register(parser.add_subparsers())
    base = ["evaluate", "--policy", "oracle", "--out", "o"]
    default = evaluate_cli._rollout_config(parser.parse_args(base))
    assert (default.tool_schemas, default.sim_whitelist) == ("full", "schemas")
    args = parser.parse_args([*base, "--tool-schemas", "compact", "--sim-whitelist", "names"])
    cfg = evaluate_cli._rollout_config(args)
    assert (cfg.tool_schemas, cfg.sim_whitelist) == ("compact", "names")


# ---------------------------------------------------------------------------------------------
# Every task that validates can be evaluated (issue #20)


def _bank_task(task_dir: Path, **changes: object) -> dict[str, object]:
    """A generated bank task (a valid world state), with `changes` applied on top."""
    for line in (task_dir / "test.jsonl").read_text().splitlines():
        data = json.loads(line)
        if data["environment"]["name"] == "bank":
            data.update(changes)
            return data
    raise AssertionError("the generated split has no bank task")


def test_a_task_without_an_environment_is_refused_up_front_or_skipped(
    task_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.jsonl"
    plain = {
        "id": "no-world",
        "tools": [{"type": "function", "function": {"name": "ping", "parameters": {}}}],
        "turns": [{"user": "ping", "expected_calls": [{"name": "ping", "arguments": {}}]}],
    }
    path.write_text(json.dumps(_bank_task(task_dir)) + "\n" + json.dumps(plain) + "\n")
    args = ["evaluate", "--policy", "oracle", "--tasks", str(path), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        "1 task(s) name no environment ('no-world'): evaluation runs every task in its world" in err
    )
    assert "Traceback" not in err and "--skip-invalid leaves them out" in err
    assert main([*args, "--skip-invalid"]) == 0
    captured = capsys.readouterr()
    assert "task 'no-world' names no environment; not evaluated" in captured.err
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["n_tasks"] == 1 and metrics["success_rate"] == 1.0
    from envace.errors import UserInputError
    from envace.tasks.io import task_from_dict

    with pytest.raises(UserInputError, match="name no environment"):
        evaluate_policy(OraclePolicy(), [task_from_dict(plain)], RolloutConfig())


def test_random_and_empty_play_any_valid_schema(task_dir: Path, tmp_path: Path) -> None:
    """`true` sub-schemas, an empty enum and a list of types used to crash the random policy."""
    odd = {
        "type": "object",
        "properties": {
            "a": True,
            "b": {"enum": []},
            "c": {"type": ["integer", "null"]},
            "d": {"enum": [{"deep": [1]}]},
        },
    }
    tools = [{"type": "function", "function": {"name": "transfer", "parameters": odd}}]
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps(_bank_task(task_dir, tools=tools, turns=[{"user": "go"}])) + "\n")
    for policy in ("random", "empty"):
        out = tmp_path / policy
        assert main(["evaluate", "--policy", policy, "--tasks", str(path), "--out", str(out)]) == 0
        assert json.loads((out / "metrics.json").read_text())["n_episodes"] == 1


def test_the_valid_call_rate_checks_integers_as_the_world_does() -> None:
    from envace.rollout.validation import call_is_schema_valid
    from envace.tasks.model import Task, Turn

    params = {"type": "object", "properties": {"n": {"type": "integer"}}}
    task = Task(
        id="t",
        tools=({"type": "function", "function": {"name": "f", "parameters": params}},),
        turns=(Turn("u"),),
    )
    assert call_is_schema_valid(task, ToolCall("f", {"n": 430}))
    assert not call_is_schema_valid(task, ToolCall("f", {"n": 430.0}))


def test_the_example_of_the_task_format_validates_and_the_oracle_solves_it(
    tmp_path: Path,
) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "task_format.md").read_text("utf-8")
    example = doc.split("## Example", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.jsonl"
    path.write_text(json.dumps(json.loads(example)) + "\n")
    from envace.tasks.loader import load_tasks

    tasks = load_tasks(path).tasks
    assert evaluate_policy(OraclePolicy(), tasks, RolloutConfig()).metrics.success_rate == 1.0
