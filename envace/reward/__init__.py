"""Rewards: rule graders for tasks with a known answer, the checklist LLM judge, episode reward.

Nothing here imports a heavy runtime (no torch, no HTTP stack): the judge talks to any object with
a `chat_many` method, normally `envace.policy.openai_http.OpenAIChatClient`. The final-state
success rule lives with the worlds: `envace.envs.state.final_state_matches`. See docs/rewards.md.
"""

from envace.reward.episode import episode_reward
from envace.reward.judge import (
    JUDGE_RESPONSE_FORMAT,
    JUDGE_SAMPLING,
    JUDGE_SCHEMA,
    BatchChatBackend,
    ChecklistJudge,
    JudgeOutputError,
    TurnJudgement,
    TurnToGrade,
    build_judge_prompt,
    parse_judge_answer,
    serialise_messages,
    split_turn_steps,
)
from envace.reward.rules import CallMatch, canonical, match_expected_calls, turn_score_rules

__all__ = [
    "JUDGE_RESPONSE_FORMAT",
    "JUDGE_SAMPLING",
    "JUDGE_SCHEMA",
    "BatchChatBackend",
    "CallMatch",
    "ChecklistJudge",
    "JudgeOutputError",
    "TurnJudgement",
    "TurnToGrade",
    "build_judge_prompt",
    "canonical",
    "episode_reward",
    "match_expected_calls",
    "parse_judge_answer",
    "serialise_messages",
    "split_turn_steps",
    "turn_score_rules",
]
