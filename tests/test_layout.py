"""The package's shape: no import cycles, a task is one folder, the example task imports one module."""
from __future__ import annotations

import layout

TASKS = ("spanflow.tasks.ner", "spanflow.tasks.re", "spanflow.tasks.embed")


def test_no_import_cycle_between_files():
    assert layout.cycles(layout.graph()) == []


def test_no_import_cycle_between_packages():
    assert layout.cycles(layout.package_graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert layout.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_task_folder_never_imports_another_task():
    for m, deps in layout.graph().items():
        own = layout.package_of(m)
        if own in TASKS:
            foreign = {d for d in deps if layout.package_of(d) in TASKS and layout.package_of(d) != own}
            assert not foreign, f"{m} imports {sorted(foreign)}"


def test_shared_layers_import_no_task_folder():
    # the CLI is a view of each command; `spanflow embed` is the embed task's own command
    for m, deps in layout.graph().items():
        if layout.package_of(m) in TASKS or m.startswith("spanflow.cli") or m == "spanflow":
            continue
        tasks = {d for d in deps if layout.package_of(d) in TASKS}
        assert not tasks, f"{m} imports {sorted(tasks)}"


def test_no_task_module_at_the_top_of_the_package():
    top = {m for m, path in layout.modules().items() if m.count(".") == 1 and path.name != "__init__.py"}
    assert top <= {"spanflow.atomic", "spanflow.errors"}, top


def test_the_example_task_imports_one_spanflow_module():
    assert layout.example_task_imports() == {"spanflow.tasks.api"}


def test_shared_layers_never_switch_on_a_tasks_name():
    assert layout.shared_task_switches() == {}


def test_the_switch_finder_finds_a_switch(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('if cfg.get("task") == "ner" or task.name in ("re", "x") or args.command == "embed":\n    pass\n')
    assert layout.task_name_tests(src) == ["1: cfg.get('task') == 'ner'", "1: task.name in ('re', 'x')"]
