"""EnvACE: train LLM tool-use agents with world rehearsal.

One policy acts (writes tool calls) and rehearses (plays the environment and writes the tool
results itself); both roles are trained together with role-wise GRPO on task success.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
