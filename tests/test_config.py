"""The typed config: files, overrides, and errors that name the key, the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.config import load_config
from envace.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["local.yaml", "gpu-1.yaml", "reference-8b.yaml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = load_config(ROOT / "configs" / name)
    assert cfg.rollout.n >= 1


def test_the_laptop_config_trains_the_embedded_pretrained_model() -> None:
    cfg = load_config(ROOT / "configs" / "local.yaml")
    assert cfg.model.path is None and cfg.model.preset == "smollm2-135m"
    assert cfg.model.dtype == "auto" and cfg.rollout.tool_schemas == "compact"
    assert cfg.train.trainable == "top_layers" and cfg.train.top_layers == 12


def test_reference_config_matches_the_paper_setup() -> None:
    cfg = load_config(ROOT / "configs" / "reference-8b.yaml")
    assert cfg.model.path == "Qwen/Qwen3-8B"
    assert (cfg.rollout.batch_tasks, cfg.rollout.n) == (16, 4)
    assert cfg.train.lr == 1e-6 and cfg.train.weight_decay == 0.01 and cfg.train.grad_clip == 1.0
    assert (cfg.algo.clip_low, cfg.algo.clip_high, cfg.algo.dual_clip) == (0.2, 0.2, 3.0)
    assert cfg.algo.kl_coef == 0.0 and not cfg.algo.normalize_std
    assert cfg.algo.baseline == "row_mean" and cfg.algo.sharing == "share"


def test_overrides_parse_yaml_scalars() -> None:
    cfg = load_config(
        None, ["train.lr=1e-5", "rollout.mode=real", "eval.max_tasks=null", "algo.dual_clip=null"]
    )
    assert cfg.train.lr == 1e-5 and cfg.rollout.mode == "real"
    assert cfg.eval.max_tasks is None and cfg.algo.dual_clip is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.lr=abc"], "train.lr: expected float, got 'abc'"),
        (
            ["rollout.mode=foo"],
            "rollout.mode: 'foo' is not one of 'rehearsal' | 'real' | 'external'",
        ),
        (["train.bogus=1"], "train: unknown key 'bogus'; known keys:"),
        (["rollout.n=0"], "rollout.n: 0 must be >= 1"),
        (["rollout.n=1.5"], "rollout.n: expected int, got 1.5"),
        (["tensorboard=yes please"], "tensorboard: expected true or false"),
        (["train=3"], "train: expected a mapping, got 3"),
        (["noequals"], "expected KEY.PATH=VALUE"),
        (
            ["algo.sharing=noshare", "rollout.mode=external"],
            "use sharing: share, or rollout.mode: rehearsal",
        ),
        (["algo.train_roles=simulator", "rollout.mode=real"], "use rollout.mode: rehearsal"),
        (
            ["algo.rehearsal_grading=shown_world", "rollout.mode=real"],
            "use rehearsal_grading: task, or rollout.mode: rehearsal or external",
        ),
        (
            ["algo.rehearsal_grading=imagined"],
            "algo.rehearsal_grading: 'imagined' is not one of 'task' | 'shown_world'",
        ),
        (["rollout.top_p=0"], "rollout.top_p: 0.0 must be in (0, 1]"),
        (["warm_start.grounding_dropout=2"], "warm_start.grounding_dropout: 2.0"),
        (["warm_start.micro_batch_tokens=0"], "warm_start.micro_batch_tokens: 0 must be >= 1"),
        (["train.micro_batch_tokens=-5"], "train.micro_batch_tokens: -5 must be >= 1 or null"),
        (
            ["rollout.decode=generate", "rollout.compile_decode=true"],
            "rollout.compile_decode: True compiles the static decoder's step: needs rollout.decode",
        ),
        (["train.lr=.inf"], "train.lr: inf is not a finite number"),
        (["algo.kl_coef=.nan"], "algo.kl_coef: nan is not a finite number"),
        (["train.lr=[1"], "--set 'train.lr=[1': the value is not a YAML scalar"),
        (["train.lr={a: 1"], "quote a string value"),
        (["warm_start.batch_rows=0"], "warm_start.batch_rows: 0 must be >= 1"),
        (["warm_start.lr=-1"], "warm_start.lr: -1.0 must be in (0, 1)"),
        (["train.lr=1e38"], "train.lr: 1e+38 must be in (0, 1)"),
        (["rollout.max_batch_size=0"], "rollout.max_batch_size: 0 must be in [1, 4096]"),
        (["model.vocab_size=0"], "model.vocab_size: 0 must be in [512, 262144]"),
        (["rollout.max_context_tokens=0"], "must exceed rollout.caller_max_new_tokens"),
        (["eval.n=0"], "eval.n: 0 must be in [1, 1000]"),
        (["model.device=gpu"], "model.device: 'gpu' is not auto, cpu, cuda or cuda:N"),
        (["model.device=cuda:x"], "model.device: 'cuda:x' is not auto, cpu, cuda or cuda:N"),
        (
            ["rollout.simulator_max_new_tokens=0"],
            "rollout.simulator_max_new_tokens: 0 must be in [1, 131072]",
        ),
    ],
)
def test_bad_values_name_the_key_and_the_fix(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- 1\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path)  # a directory
    bad.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match="not a YAML text file"):
        load_config(bad)


def test_every_field_is_documented() -> None:
    import dataclasses

    from envace import config as c

    sections = (
        c.Config,
        c.TasksConfig,
        c.ModelConfig,
        c.RolloutSection,
        c.AlgoConfig,
        c.TrainConfig,
        c.WarmStartConfig,
        c.EvalConfig,
    )
    for cls in sections:
        docs = c.field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if len(docs.get(f.name, "")) < 8]
        assert missing == [], (cls.__name__, missing)


def test_config_show_prints_values_with_their_docs(capsys: pytest.CaptureFixture[str]) -> None:
    from envace.cli import main

    local = str(ROOT / "configs" / "local.yaml")
    assert main(["config", "show", "--config", local, "--set", "train.lr=3e-5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "train:  # The RL optimisation loop." in lines
    lr = next(x for x in lines if x.strip().startswith("lr: 3.0e-05"))
    assert "# reference (8B): 1e-6 constant" in lr
    assert any(
        x.strip().startswith("preset: smollm2-135m  # only when path is None") for x in lines
    )
    # the printed values read back as the same config
    import yaml

    data = yaml.safe_load(out)
    assert data["train"]["lr"] == 3e-5 and data["rollout"]["tool_schemas"] == "compact"
    assert main(["config", "show", "--set", "algo.clip_low=1"]) == 2
    assert "algo.clip_low=1.0 must be in [0, 1)" in capsys.readouterr().err


def test_the_clip_rule_is_the_losss_own() -> None:
    from envace.algo.losses import LossConfig

    # 0 is a legal clip_low and clip_high for the loss, so it is for the config
    cfg = load_config(None, ["algo.clip_low=0", "algo.clip_high=0"])
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (0.0, 0.0)
    LossConfig(clip_low=0.0, clip_high=0.0)
    for bad in ("algo.clip_low=1", "algo.clip_high=-0.1", "algo.dual_clip=1"):
        with pytest.raises(ConfigError, match=r"^algo\."):
            load_config(None, [bad])


# --- YAML the loader refuses (issue #20 item 3) ----------------------------------------------
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train:\n  lr: 1e-5\nrollout:\n  n: 2\ntrain:\n  iterations: 3\n", "line 5: key 'train'"),
        ("train:\n  lr: 1.0e-5\n  lr: 2.0e-5\n", "line 3: key 'lr' is given twice"),
        ("train: {deepspeed_config: {a: 1, a: 2}}\n", "line 1: key 'a' is given twice"),
    ],
)
def test_a_key_given_twice_is_refused_at_every_level(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match="given twice") as err:
        load_config(_write(tmp_path, text))
    assert message in str(err.value) and "keep one" in str(err.value)


def test_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    text = "train:\n  deepspeed_config:\n    base: &b {x: 1, y: 2}\n    mine: {<<: *b, y: 3}\n"
    cfg = load_config(_write(tmp_path, text))
    assert cfg.train.deepspeed_config["mine"] == {"x": 1, "y": 3}


def test_an_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    import time

    from envace.config import MAX_YAML_VALUES

    rows = ["train:", "  deepspeed_config:", "    l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    rows += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_VALUES} values"):
        load_config(_write(tmp_path, "\n".join(rows) + "\n"))
    assert time.perf_counter() - t0 < 2.0


def test_aliases_under_the_limit_expand_into_separate_copies(tmp_path: Path) -> None:
    text = "train:\n  deepspeed_config:\n    a: &a {stage: 2}\n    b: *a\n"
    cfg = load_config(_write(tmp_path, text), ["train.deepspeed_config.a.stage=3"])
    assert cfg.train.deepspeed_config == {"a": {"stage": 3}, "b": {"stage": 2}}


def test_a_recursive_anchor_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="line 2: an alias refers to a mapping or list"):
        load_config(_write(tmp_path, "train:\n  deepspeed_config: &x {a: *x}\n"))
    with pytest.raises(ConfigError, match="recursive anchor"):
        load_config(None, ["train.deepspeed_config=&a [*a]"])


def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nested more than 64 levels"):
        load_config(_write(tmp_path, "a: " + "[" * 3000 + "]" * 3000 + "\n"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train:\n  deepspeed_config: {when: 2024-01-01}\n", "line 2: a 'timestamp' value"),
        ("train:\n  deepspeed_config: !!binary aGk=\n", "a 'binary' value"),
        ("seed: " + "9" * 5000 + "\n", "a value cannot be read (Exceeds the limit"),
        ("1: 2\n", "<root>: unknown key 1"),
        ("tasks:\n  ? [1, 2]\n  : 3\n", "not valid YAML"),
    ],
)
def test_values_json_cannot_hold_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    assert message in str(err.value)


def test_an_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = _write(tmp_path, "# " + "x" * (1024 * 1024) + "\n")
    with pytest.raises(ConfigError, match="larger than 1048576 bytes"):
        load_config(path)


def test_an_empty_section_takes_overrides(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "tasks:\n"), ["tasks.seed=3"]).tasks.seed == 3


# --- ranges (issue #20 item 3) ---------------------------------------------------------------
@pytest.mark.parametrize("key", ["seed", "tasks.seed", "train.seed"])
def test_seeds_lie_in_what_every_generator_accepts(key: str) -> None:
    assert load_config(None, [f"{key}={2**32 - 1}"])
    for bad in ("1.0e+26", str(2**32), "-1"):
        with pytest.raises(ConfigError, match=rf"^{key}: .* must be in \[0, 4294967296\)"):
            load_config(None, [f"{key}={bad}"])


def test_rollout_size_is_bounded_and_the_error_names_the_memory() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.n=100000"])
    text = str(err.value)
    assert text.startswith("rollout.n: 100000 x rollout.batch_tasks 16 = 1600000 trajectories")
    assert "limit of 16384" in text and "36.6 GiB" in text
    assert load_config(None, ["rollout.n=1024", "rollout.batch_tasks=16"]).rollout.n == 1024


def test_warm_start_epochs_zero_means_none_and_negative_is_refused() -> None:
    assert load_config(None, ["warm_start.epochs=0"]).warm_start.epochs == 0
    with pytest.raises(ConfigError, match=r"warm_start.epochs: -1.0 must be in \[0, 10000\]"):
        load_config(None, ["warm_start.epochs=-1"])


def test_every_numeric_field_has_a_range_rule() -> None:
    import dataclasses
    import typing

    from envace import config as c

    ruled = {path for path, _, _ in c._RULES} | set(c._CHECKED_ELSEWHERE)

    def numeric(tp: object) -> bool:
        args = typing.get_args(tp) or (tp,)
        return any(a in (int, float) for a in args)

    sections = typing.get_type_hints(c.Config)
    checked, missing = [], []
    for prefix, cls in [("", c.Config)] + [
        (f"{name}.", tp) for name, tp in sections.items() if dataclasses.is_dataclass(tp)
    ]:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if numeric(hints[f.name]):
                checked.append(f"{prefix}{f.name}")
                if f"{prefix}{f.name}" not in ruled:
                    missing.append(f"{prefix}{f.name}")
    assert missing == []
    assert {"seed", "rollout.n", "warm_start.epochs", "algo.dual_clip"} <= set(checked)


def test_huge_numbers_are_config_errors_not_crashes() -> None:
    with pytest.raises(ConfigError, match=r"train.lr: .* is not a finite number"):
        load_config(None, [f"train.lr={10**400}"])
    with pytest.raises(ConfigError, match="must be in"):
        load_config(None, [f"train.iterations={10**400}"])
