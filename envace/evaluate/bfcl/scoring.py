"""BFCL v4's overall score, computed as bfcl-eval computes its "Overall Acc".

bfcl-eval (2026.3.23, `eval_checker/eval_runner_helper.generate_leaderboard_csv`) builds the
overall from five sections with fixed weights 10/10/10/30/40 (`calculate_percentage_weighted_
accuracy`); a category that was not run counts 0 (`get_category_score`: "It will still be
considered 0 in the overall score calculation"):

- non-live (10): the unweighted mean of simple, multiple, parallel, parallel_multiple, where
  simple is the unweighted mean of simple_python, simple_java, simple_javascript;
- live (10): the four live AST categories weighted by their entry counts;
- irrelevance (10): the unweighted mean of irrelevance and live_irrelevance (live_relevance is
  shown on the leaderboard but carries no weight);
- multi-turn (30): the unweighted mean of base, miss_func, miss_param, long_context;
- agentic (40): the unweighted mean of web search (mean of base, no_snippet) and memory (mean of
  kv, vector, rec_sum).

Every step is a weighted mean, so the overall is linear in the category accuracies: each
category gets one share of the total (`category_weights`), the overall is the sum of share x
accuracy, and the coverage is the sum of the shares of the categories that ran. The tests
check this against bfcl-eval's own function on a hand-made score table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "LIVE_AST",
    "SECTION_WEIGHTS",
    "BfclOverall",
    "bfcl_overall",
    "category_weights",
]

SECTION_WEIGHTS = {
    "non_live": 0.10,
    "live": 0.10,
    "irrelevance": 0.10,
    "multi_turn": 0.30,
    "agentic": 0.40,
}
SIMPLE = ("simple_python", "simple_java", "simple_javascript")
NON_LIVE_OTHERS = ("multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
IRRELEVANCE = ("irrelevance", "live_irrelevance")
MULTI_TURN = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
WEB_SEARCH = ("web_search_base", "web_search_no_snippet")
MEMORY = ("memory_kv", "memory_vector", "memory_rec_sum")


def category_weights(live_counts: Mapping[str, int]) -> dict[str, tuple[str, float]]:
    """{category: (section, share of the overall)} for every v4 scoring category; the shares
    add up to 1. live_counts: the entries of each live AST category (the live section's
    weights: bfcl-eval weights a full run's categories by their sizes)."""
    non_live = SECTION_WEIGHTS["non_live"] / 4  # simple + the three others
    live_total = sum(live_counts[c] for c in LIVE_AST)
    agentic = SECTION_WEIGHTS["agentic"] / 2  # web search + memory
    weights: dict[str, tuple[str, float]] = {}
    weights.update({c: ("non_live", non_live / len(SIMPLE)) for c in SIMPLE})
    weights.update({c: ("non_live", non_live) for c in NON_LIVE_OTHERS})
    weights.update(
        {c: ("live", SECTION_WEIGHTS["live"] * live_counts[c] / live_total) for c in LIVE_AST}
    )
    weights.update({c: ("irrelevance", SECTION_WEIGHTS["irrelevance"] / 2) for c in IRRELEVANCE})
    weights.update({c: ("multi_turn", SECTION_WEIGHTS["multi_turn"] / 4) for c in MULTI_TURN})
    weights.update({c: ("agentic", agentic / len(WEB_SEARCH)) for c in WEB_SEARCH})
    weights.update({c: ("agentic", agentic / len(MEMORY)) for c in MEMORY})
    return weights


@dataclass(frozen=True)
class BfclOverall:
    """bfcl_overall: BFCL v4's overall (categories not run count 0). coverage: the share of
    that overall's weight that ran. sections: each section's score as bfcl-eval shows it
    (again with 0 for what did not run)."""

    bfcl_overall: float
    coverage: float
    sections: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bfcl_overall(accuracy: Mapping[str, float], live_counts: Mapping[str, int]) -> BfclOverall:
    """The overall of per-category accuracies (a category absent from `accuracy` did not run;
    categories outside v4's overall, e.g. live_relevance, carry no weight)."""
    weights = category_weights(live_counts)
    ran = {c: a for c, a in accuracy.items() if c in weights}
    sections = dict.fromkeys(SECTION_WEIGHTS, 0.0)
    for cat, acc in ran.items():
        section, share = weights[cat]
        sections[section] += share * acc / SECTION_WEIGHTS[section]
    return BfclOverall(
        bfcl_overall=sum(weights[c][1] * a for c, a in ran.items()),
        coverage=sum(weights[c][1] for c in ran),
        sections=sections,
    )
