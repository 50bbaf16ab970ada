"""The model list page, ``docs/reference/models.md``, generated from the model registry
(:mod:`smoeweather.models.registry`): every registered network of every task with what its builder says.

Regenerate it after registering a network (``tests/models/test_registry.py`` fails while it is stale)::

    .venv/bin/python docs/hooks/model_list.py
"""

from __future__ import annotations

from pathlib import Path

PAGE_PATH = Path(__file__).resolve().parents[1] / "reference" / "models.md"
INTRO = """# Models

Every network `smoe train` can build, by task: the `model.name` a config gives, and what it is. This page is
**generated** from the model registry (`smoeweather.models.registry`) by `docs/hooks/model_list.py`; a network
is added by one decorated builder (see [development](../development.md)). The keys each model takes are its
constructor's arguments ([API reference](api/models.md)); `smoe train` refuses any other with a did-you-mean.
"""
TASK_TITLES = {"weather": "Weather (`weatherbench` and `postprocess` tasks)", "heat": "Heat diffusion (`heat`)",
               "vision": "Vision (`vision`)"}


def page_text() -> str:
    """The whole page, as ``docs/reference/models.md`` must hold it."""
    from smoeweather.models import registry

    parts = [INTRO]
    for task in registry.TASKS:
        rows = [f"| `{e.name}` | {e.kind} | {e.doc} |" for e in registry.entries(task)]
        parts.append(f"## {TASK_TITLES[task]}\n\n| name | output | network |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    PAGE_PATH.write_text(page_text(), encoding="utf-8")
    print(f"wrote {PAGE_PATH}")
