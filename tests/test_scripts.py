"""train.py and evaluate.py turn the errors a user can fix into one line, not a traceback."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), REPO / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["train.py", "evaluate.py"])
def test_missing_annotations_fail_fast_with_one_line(script, tmp_path):
    main = _script(script).main
    with pytest.raises(SystemExit) as exit_info:
        main(["--dataset", "msrvtt", f"data.root={tmp_path}",
              f"train.output_dir={tmp_path / 'run'}"])
    # Raised before the model (and its weights download) is built.
    message = str(exit_info.value.code)
    assert message.startswith(f"{script}: error: annotation file not found")
    assert "MSRVTT_" in message

