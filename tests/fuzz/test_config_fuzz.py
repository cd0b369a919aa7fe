"""Property tests of the config loader: any YAML document and any `--set` override is either
loaded (into a config that serialises, as OUT/config.json needs) or refused with a ConfigError;
never another exception, and never slowly (alias bombs, recursive anchors, deep nesting)."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
import typing
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace import config as c
from envace.errors import ConfigError

SECONDS_PER_CASE = 5.0  # generous: the machine may be busy; a hang would take forever
# ENVACE_FUZZ_EXAMPLES=5000 for a deeper search; the default keeps this file to seconds.
FUZZ = settings(
    max_examples=int(os.environ.get("ENVACE_FUZZ_EXAMPLES", "150")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _paths() -> list[str]:
    """Every key path of the config (`seed`, `rollout.n`, ...)."""
    found = []
    for name, tp in typing.get_type_hints(c.Config).items():
        if dataclasses.is_dataclass(tp):
            found += [f"{name}.{f.name}" for f in dataclasses.fields(tp)]
        else:
            found.append(name)
    return found


PATHS = _paths()
SECTIONS = sorted({p.split(".")[0] for p in PATHS})
FIELDS = sorted({p.split(".")[-1] for p in PATHS})

names = st.one_of(st.sampled_from(SECTIONS + FIELDS), st.text("abz_<", min_size=1, max_size=4))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([2**32, 2**32 - 1, -1, 0, 10**5000 // 10**4990]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
documents = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(names, kids, max_size=5)),
    max_leaves=25,
)
yaml_chars = st.text(alphabet=":-[]{}&*!|>'\"#, ?%@\n\t.0123456789e+abn_<", max_size=120)


def _load(text: str | None, overrides: list[str]) -> None:
    """The property: loaded (and serialisable) or ConfigError, within SECONDS_PER_CASE."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = None
        if text is not None:
            path = Path(tmp) / "c.yaml"
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            cfg = c.load_config(path, overrides)
        except ConfigError as exc:
            assert str(exc)  # a message, not an empty error
        else:
            json.dumps(cfg.to_dict())
    assert time.perf_counter() - t0 < SECONDS_PER_CASE


@FUZZ
@given(st.dictionaries(st.sampled_from(SECTIONS), documents, max_size=4))
def test_random_documents_load_or_are_refused(doc: dict[str, object]) -> None:
    import yaml

    _load(yaml.safe_dump(doc, allow_unicode=True), [])


@FUZZ
@given(yaml_chars)
def test_random_yaml_text_loads_or_is_refused(text: str) -> None:
    _load(text, [])


@FUZZ
@given(
    st.lists(
        st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=9),
        min_size=1,
        max_size=12,
    )
)
def test_alias_graphs_load_or_are_refused(refs: list[list[int]]) -> None:
    """Anchor i is a list of aliases of anchors refs[i] (earlier: a DAG that can grow
    exponentially; itself or later: recursive or undefined)."""
    rows = ["train:", "  deepspeed_config:"]
    for i, targets in enumerate(refs):
        items = ", ".join(f"*a{t}" if t != i or i == 0 else "1" for t in targets)
        rows.append(f"    k{i}: &a{i} [{items}]")
    rows.append(f"    self: &s {{me: *{'s' if len(refs) % 3 == 0 else 'a0'}}}")
    _load("\n".join(rows) + "\n", [])


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.one_of(st.sampled_from(PATHS), st.text("abc._", max_size=8)),
            st.one_of(yaml_chars, scalars.map(str)),
        ),
        max_size=5,
    )
)
def test_random_overrides_load_or_are_refused(pairs: list[tuple[str, str]]) -> None:
    _load(None, [f"{key}={value}" for key, value in pairs])


@FUZZ
@given(st.sampled_from(PATHS), st.integers(min_value=0, max_value=3))
def test_a_key_given_twice_is_always_refused(path: str, gap: int) -> None:
    """Whatever the key and whatever lies between the two copies."""
    section, _, key = path.partition(".")
    filler = "".join(f"  zz{i}: 0\n" for i in range(gap))
    if key:
        text = f"{section}:\n  {key}: 1\n{filler}  {key}: 2\n"
    else:
        text = f"{path}: 1\n{filler.replace('  ', '')}{path}: 2\n"
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "c.yaml"
        file.write_text(text)
        try:
            c.load_config(file)
        except ConfigError as exc:
            assert "given twice" in str(exc), (text, str(exc))
        else:
            raise AssertionError(f"loaded a duplicate key: {text!r}")
