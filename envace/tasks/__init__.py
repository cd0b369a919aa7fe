"""Tasks: the data model, loading and validation of task files, and the reference importer.

The task format (JSON Lines, one task per line) is the project's public data contract; see
docs/task_format.md. Importing this package does not import jsonschema (that happens on the
first validation), so it stays cheap for code that only needs the data model.
"""

from envace.tasks.importer import import_reference, read_reference
from envace.tasks.io import task_from_dict, task_to_dict, write_tasks_jsonl
from envace.tasks.loader import (
    LoadResult,
    TaskFormatError,
    TaskProblem,
    check_task,
    load_tasks,
)
from envace.tasks.model import ChecklistItem, EnvironmentSpec, ExpectedCall, Task, Turn

__all__ = [
    "ChecklistItem",
    "EnvironmentSpec",
    "ExpectedCall",
    "LoadResult",
    "Task",
    "TaskFormatError",
    "TaskProblem",
    "Turn",
    "check_task",
    "import_reference",
    "load_tasks",
    "read_reference",
    "task_from_dict",
    "task_to_dict",
    "write_tasks_jsonl",
]
