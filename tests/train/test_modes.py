"""Every training mode runs RL iterations on a micro model and trains the right rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envace.config import load_config
from envace.run import RunContext, RunPaths, init_model, load_splits, prepare_tasks, rl_stage
from envace.train.tracking import MetricsLogger
from tests.helpers.micro import MICRO


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    out = tmp_path_factory.mktemp("modes")
    cfg = load_config(None, MICRO)
    paths = RunPaths(out, str(out))
    prepare_tasks(cfg, paths)
    splits = load_splits(paths.tasks)
    model, tok = init_model(cfg, splits, out / "init")
    return splits, model, tok


@pytest.mark.parametrize(
    ("overrides", "learners"),
    [
        (["rollout.mode=rehearsal"], {"policy"}),
        (["rollout.mode=real"], {"policy"}),
        (["rollout.mode=external"], {"policy"}),
        (["algo.sharing=noshare"], {"caller", "simulator"}),
        (["algo.train_roles=caller"], {"policy"}),
        (["algo.simulator_reward=fidelity"], {"policy"}),
    ],
)
def test_mode_runs_and_updates(
    setup: tuple[Any, ...], tmp_path: Path, overrides: list[str], learners: set[str]
) -> None:
    import copy

    splits, model, tok = setup
    cfg = load_config(None, [*MICRO, "train.iterations=2", *overrides])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    m = copy.deepcopy(model)
    logger = MetricsLogger(tmp_path, tensorboard=False)
    ctx = RunContext(cfg, RunPaths(tmp_path, str(tmp_path)), splits, m, tok)
    trained, records, _engine = rl_stage(ctx, logger)
    logger.close()
    assert [r["iteration"] for r in records] == [1, 2]
    names = {k.split("/")[0] for k in records[0] if k.endswith("/rows") and not k.startswith("adv")}
    assert names == learners
    rec = records[-1]
    if cfg.rollout.mode == "real":
        assert rec["rows/simulator"] == 0.0
        assert "rollout/sim_field_fidelity" not in rec  # no rehearsal to score
    elif rec["rows/simulator"] > 0:  # rehearsals of worlds' tasks, scored against the worlds
        assert 0.0 <= rec["rollout/sim_field_fidelity"] <= 1.0
    if cfg.rollout.mode == "external":
        assert rec["policy/rows"] <= rec["rows/caller"]  # simulator rows are not trained
    if cfg.algo.train_roles == "caller":
        assert rec["policy/rows"] <= rec["rows/caller"]
    changed = any(not (trained.state_dict()[k] == v).all() for k, v in before.items())
    if (
        rec.get("policy/rows", rec.get("caller/rows", 0.0)) > 0
        and rec.get("policy/grad_norm", 1.0) > 0
    ):
        assert changed
    assert (tmp_path / "checkpoints" / "rl" / "iter_000002" / "MANIFEST.json").is_file()
