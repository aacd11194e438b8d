"""RowCache: a per-row array beside an index, computed once per row and per maker."""

import json

import numpy as np

from dicosa.search.row_cache import RowCache


class Counting:
    """``compute`` that records the ids it was asked for; row i's value is i + offset."""

    def __init__(self, offset: float = 0.0, width: int = 3):
        self.asked: list[int] = []
        self.offset, self.width = offset, width

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        self.asked += ids.tolist()
        return np.repeat(ids[:, None] + self.offset, self.width, axis=1).astype(np.float32)


def test_rows_are_computed_once_then_reused_after_reopening(tmp_path):
    compute = Counting()
    cache = RowCache(tmp_path, "parts", "model-a", 3)
    array = cache.extend(5, np.array([0, 1, 3, 4]), compute)  # row 2 was removed
    assert compute.asked == [0, 1, 3, 4]
    np.testing.assert_array_equal(array[:, 0], [0, 1, 0, 3, 4])  # removed: zeros

    again = RowCache(tmp_path, "parts", "model-a", 3)
    np.testing.assert_array_equal(again.extend(5, np.array([0, 1, 3, 4]), compute), array)
    grown = again.extend(7, np.array([0, 1, 3, 4, 5, 6]), compute)
    assert compute.asked == [0, 1, 3, 4, 5, 6]  # only the new rows
    np.testing.assert_array_equal(grown[:5], array)
    assert json.loads((tmp_path / "parts.json").read_text()) == {"key": "model-a", "rows": 7}


def test_another_makers_array_is_computed_again_and_disowned(tmp_path):
    RowCache(tmp_path, "parts", "model-a", 3).extend(4, np.arange(4), Counting())
    other = Counting(offset=100)
    array = RowCache(tmp_path, "parts", "model-b", 3).extend(4, np.arange(4), other)
    assert other.asked == [0, 1, 2, 3] and array[0, 0] == 100
    back = Counting()
    RowCache(tmp_path, "parts", "model-a", 3).extend(4, np.arange(4), back)
    assert back.asked == [0, 1, 2, 3]  # model-b's rows are never taken for model-a's


def test_a_damaged_width_is_computed_again_and_no_folder_keeps_it_in_memory(tmp_path):
    RowCache(tmp_path, "parts", "model-a", 3).extend(2, np.arange(2), Counting())
    compute = Counting(width=4)
    array = RowCache(tmp_path, "parts", "model-a", 4).extend(2, np.arange(2), compute)
    assert compute.asked == [0, 1] and array.shape == (2, 4)
    memory = RowCache(None, "parts", "model-a", 3)
    memory.extend(2, np.arange(2), Counting())
    assert len(memory.array) == 2 and not list(tmp_path.glob("*.tmp"))
