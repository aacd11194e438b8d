import importlib.util
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dicosa.__main__ import main
from dicosa.data.protocol import FrameProtocol
from dicosa.data.synthetic import make_synthetic
from dicosa.index import VideoIndex
from dicosa.loading import load_model, model_from_source

from .conftest import tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", "configs/synthetic.yaml", "--set", "model.num_frames=4"]


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dicosa", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = make_synthetic(tmp_path_factory.mktemp("synthetic"), num_train=0, num_test=5,
                          size=32, seconds=1.0, num_workers=1)
    (root / "videos" / "broken.mp4").write_bytes(b"\x00" * 64)
    return root / "videos"


@pytest.fixture(scope="module")
def index_dir(folder, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("cli") / "index"
    return out, run_cli("index", str(folder), "--out", str(out), "--num-workers", "1", *TINY)


def test_index_then_search(index_dir):
    out, done = index_dir
    assert done.returncode == 0, done.stderr
    assert "indexed 5 videos" in done.stdout and "skipped 1" in done.stdout
    assert "broken.mp4" in done.stdout
    # no checkpoint, so no fitted summary: the per-frame stage, said in one line
    assert "first stage: 'frames'" in done.stdout
    assert json.loads((out / "manifest.json").read_text())["first_stage"]["summary"] == "frames"

    # search rebuilds the model the manifest recorded (same seed, same weights).
    query = "a red circle moves left"
    found = run_cli("search", str(out), query, "-k", "3", "--json")
    assert found.returncode == 0, found.stderr
    answer = json.loads(found.stdout)
    assert answer["query"] == query and [r["rank"] for r in answer["results"]] == [1, 2, 3]
    scores = [r["score"] for r in answer["results"]]
    assert scores == sorted(scores, reverse=True)
    # 5 videos, 1000 candidates: every video is reranked by DiCoSA ("all").
    assert {r["stage"] for r in answer["results"]} == {"all"} and answer["candidates"] == 1000
    assert all(r["dicosa"] == r["score"] for r in answer["results"])
    assert set(answer["stats"]) >= {"encode_s", "first_stage_s", "rerank_s"}

    model = load_model(None, str(REPO / "configs/synthetic.yaml"), ["model.num_frames=4"])[0]
    expected = VideoIndex.load(out, model).search(query, k=3)
    assert [(r["path"], r["score"]) for r in answer["results"]] == [
        (h.path, pytest.approx(h.score, abs=1e-6)) for h in expected]


def test_search_stages_on_the_command_line(index_dir, capsys, monkeypatch):
    out, _ = index_dir
    monkeypatch.chdir(REPO)
    runs = {}
    for args in (["--candidates", "2"], ["--exhaustive"]):
        assert main(["search", str(out), "a red circle", "-k", "2", "--json", *args, *TINY]) == 0
        runs[args[0]] = json.loads(capsys.readouterr().out)
    two_stage, exhaustive = runs["--candidates"], runs["--exhaustive"]
    assert {r["stage"] for r in two_stage["results"]} == {"dense"}
    assert two_stage["stats"]["candidates"] == [2]
    assert all(r["stage_score"] is not None for r in two_stage["results"])
    assert {r["stage"] for r in exhaustive["results"]} == {"exhaustive"}
    assert exhaustive["candidates"] is None


def test_unknown_backend_is_one_sentence(folder, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    code = main(["index", str(folder), "--out", str(tmp_path / "x"), "--backend", "annoy",
                 "--num-workers", "0", *TINY])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "unknown first-stage backend 'annoy'" in err[-1]
    assert "Traceback" not in "".join(err)


def test_search_table(index_dir, capsys, monkeypatch):
    out, _ = index_dir
    monkeypatch.chdir(REPO)
    assert main(["search", str(out), "a blue square", "-k", "2", *TINY]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith('top 2 of 5 videos for "a blue square" (')
    assert lines[1].split() == ["rank", "score", "stage", "moment", "path"] and len(lines) == 4
    assert [line.split()[0] for line in lines[2:]] == ["1", "2"]
    # a 1-s clip is one moment over its whole length
    assert all(line.split()[3] == "00:00–00:01" for line in lines[2:])
    assert all(Path(line.split()[4]).is_file() for line in lines[2:])


def test_the_table_says_which_stage_proposed_in_plain_words(index_dir, capsys, monkeypatch):
    out, _ = index_dir
    monkeypatch.chdir(REPO)
    said = {}
    for name, args in (("two stages", ["--candidates", "2"]), ("all", []),
                       ("exhaustive", ["--exhaustive"])):
        assert main(["search", str(out), "a blue square", "-k", "2", *args, *TINY]) == 0
        said[name] = capsys.readouterr().out.splitlines()[0]
    head = 'top 2 of 5 videos for "a blue square" '
    assert said["two stages"] == head + ("(2 candidates from the first stage (dense mode) "
                                         "reranked by DiCoSA)")
    assert said["all"] == head + "(all 5 rows reranked by DiCoSA)"
    assert said["exhaustive"] == head + "(every video scored by DiCoSA)"


def test_a_damaged_first_stage_is_rebuilt_with_one_warning_naming_its_file(
        index_dir, tmp_path, caplog, monkeypatch):
    out, _ = index_dir
    copy = Path(shutil.copytree(out, tmp_path / "index"))
    removed = copy / "frames" / "dense.removed.npy"
    removed.write_bytes(removed.read_bytes()[:10])
    monkeypatch.chdir(REPO)
    with caplog.at_level(logging.WARNING, logger="dicosa"):
        assert main(["search", str(copy), "a blue square", "-k", "2", "--candidates", "2",
                     *TINY]) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()]
    assert f"{removed} cannot be read" in warning


def test_the_python_api_takes_numpy_integers_and_refuses_bytes_as_bytes(index_dir):
    import numpy as np

    from dicosa.index import open_index
    from dicosa.search.query import QueryError

    out, _ = index_dir
    index = open_index(out)
    hits = index.search("a red circle", k=np.int64(3), candidates=np.int32(4))
    assert [h.id for h in hits] == [h.id for h in index.search("a red circle", k=3,
                                                                candidates=4)]
    for bad, said in ((b"a red circle", "a query must be text (str), got bytes: decode them "
                                        "first (query.decode('utf-8'))"),
                      ([b"a"], "a query must be text (str), got bytes"),
                      ("   ", "the query is empty: give the text of what to find")):
        with pytest.raises(QueryError) as refused:
            index.search(bad, k=2)
        assert str(refused.value) == said
    with pytest.raises(QueryError, match="what to exclude must be text"):
        index.search("a red circle", k=2, exclude=[b"a dog"])
    for k in (True, 2.0, np.float32(2)):
        with pytest.raises(QueryError, match="k must be a positive number of results"):
            index.search("a red circle", k=k)


def test_numpy_integers_are_whole_numbers_wherever_ints_are(index_dir, folder):
    import numpy as np

    from dicosa.data.moments import didemo_range
    from dicosa.data.segments import SegmentPolicy
    from dicosa.index import open_index
    from dicosa.text.extract import TextSettings

    policy = SegmentPolicy(window=np.int64(4), rate=np.int32(2))
    assert policy.window == 4 and type(policy.window) is int and policy.step == 2
    assert TextSettings(ocr_frames=np.uint8(3)).ocr_frames == 3
    assert didemo_range(np.int64(1), np.int64(2)) == (5, 15)
    out, _ = index_dir
    index = open_index(out)
    assert index.add(folder, batch_size=np.int64(2), num_workers=np.int64(0),
                     shard_size=np.int32(2), progress=False) == 0  # all indexed already
    with pytest.raises(ValueError, match="batch_size must be a whole number of at least 1, "
                                         "got 0"):
        index.add(folder, batch_size=0, progress=False)


def test_search_with_another_model_fails_clearly(index_dir, capsys, tmp_path):
    out, _ = index_dir
    code = main(["search", str(out), "a dog", "--config", str(REPO / "configs/synthetic.yaml"),
                 "--set", "model.num_frames=4", "--set", "train.seed=7"])
    assert code == 2 and "different weights" in capsys.readouterr().err
    code = main(["search", str(tmp_path / "nothing"), "a dog"])
    assert code == 2 and "not a video index" in capsys.readouterr().err


def test_config_models_are_reproducible_and_outlive_their_file(tmp_path, caplog):
    """The record an index keeps of a config model rebuilds it: from the file, and from the
    record's copy of it once the file is gone (said in one line)."""
    mine = tmp_path / "mine.yaml"
    shutil.copy(REPO / "configs/synthetic.yaml", mine)
    a, source, _ = load_model(None, str(mine), ["model.num_frames=4"])
    b = load_model(None, source["config"], source["overrides"])[0]
    assert Path(source["config"]).is_absolute()
    mine.unlink()
    with caplog.at_level(logging.WARNING, logger="dicosa"):
        c = model_from_source(json.loads(json.dumps(source)))  # as a manifest holds it
    for again in (b, c):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                     again.state_dict().values(), strict=True))
    assert caplog.text.count(f"the config file {mine} is gone") == 1


@pytest.mark.skipif(importlib.util.find_spec("dicosa.training") is None,
                    reason="dicosa.training has not landed yet")
def test_demo_quick(tmp_path):
    log = tmp_path / "demo.log"  # `dicosa demo > log 2>&1`: a file, not a terminal
    with log.open("w") as out:
        code = subprocess.run([sys.executable, "-m", "dicosa", "demo", "--out",
                               str(tmp_path / "demo"), "--quick"], cwd=REPO, stdout=out,
                              stderr=subprocess.STDOUT, timeout=300).returncode
    text = log.read_text()
    assert code == 0, text[-3000:]
    print(text)
    # progress as plain lines: no carriage-return redraws, each bar's end still said; the
    # whole log was 4.5 KB when measured (a tqdm bar redrawn into it would add kilobytes)
    assert "\r" not in text and len(text.encode()) < 6_000
    for said in ("training: 2/2 step (100%)", "encoding videos: 1/1 batch (100%)",
                 "indexing videos: 10/10 video (100%)"):
        assert said in text, said
    for name in ("factors.png", "metrics.json", "search.json", "index/manifest.json"):
        assert (tmp_path / "demo" / name).is_file(), name
    assert (tmp_path / "demo" / "factors.png").read_bytes()[:4] == b"\x89PNG"
    search = json.loads((tmp_path / "demo" / "search.json").read_text())
    assert len(search["results"]) == 5
    # the pair is the test split's first caption, said so; where its video ranked, said
    assert "the test split's first caption" in search["rule"] and search["rule"] in text
    rank = search["expected_rank"]["exhaustive"]
    assert 1 <= rank <= 10  # 8 test and 2 long videos
    assert f"{Path(search['expected']).name} ranks {rank} of 10 videos" in text
    assert f"test R@1 is {search['model_test_t2v']['R@1']:.1f}%" in text
    exclusion = json.loads((tmp_path / "demo" / "exclusion.json").read_text())
    assert exclusion["results"] and all("shows_b" in r for r in exclusion["results"])
    assert "R@1" in text and str(tmp_path / "demo" / "factors.png") in text


def test_index_files_follow_the_umask(index_dir):
    """Every file of an index is readable by others under the usual umask 022 (safetensors'
    own writer creates 0600 files)."""
    out, done = index_dir
    assert done.returncode == 0, done.stderr
    modes = {str(p.relative_to(out)): p.stat().st_mode & 0o777 for p in out.rglob("*")
             if p.is_file()}  # the per-frame stage's files too, in frames/
    assert any(name.endswith(".safetensors") for name in modes)
    assert "frames/frames.npz" in modes
    assert set(modes.values()) == {0o644}, modes


@pytest.mark.parametrize("args, message", [
    (["", "-k", "3"], "query is empty"),
    (["   ", "-k", "3"], "query is empty"),
    (["a dog", "-k", "0"], "must be at least 1, got 0"),
    (["a dog", "-k", "-2"], "must be at least 1, got -2"),
    (["a dog", "-k", "ten"], "'ten' is not a whole number"),
    (["a dog", "--candidates", "0"], "must be at least 1, got 0"),
])
def test_bad_search_arguments_are_one_sentence(index_dir, args, message, capsys, monkeypatch):
    out, _ = index_dir
    monkeypatch.chdir(REPO)
    try:
        code = main(["search", str(out), *args, *TINY])
    except SystemExit as exc:  # argparse rejects its arguments with exit status 2
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and "Traceback" not in "".join(err)


def test_index_decodes_with_the_frame_protocol_of_the_model(tmp_path, capsys):
    released = FrameProtocol("released", "mean")
    assert load_model(None, "configs/synthetic.yaml", ["protocol=released"])[2] == released
    assert load_model(None, "configs/synthetic.yaml")[2] == FrameProtocol("segments", "black")
    _, checkpoint, root = tiny_checkpoint(tmp_path, num_train=2, val_fraction=0.0,
                                          frame_sampling="released", frame_padding="mean")
    assert load_model(str(checkpoint), None)[2] == released
    out = tmp_path / "index"
    assert main(["index", str(root / "videos"), "--out", str(out), "--checkpoint",
                 str(checkpoint), "--num-workers", "0"]) == 0
    assert "indexed 2 videos" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["frames"] == released.as_dict()


def test_bad_search_arguments_in_python(index_dir):
    out, _ = index_dir
    model = load_model(None, str(REPO / "configs/synthetic.yaml"), ["model.num_frames=4"])[0]
    index = VideoIndex.load(out, model)
    for text, k in [("", 3), (" \t", 3), (["a dog", ""], 3), ([], 3), ("a dog", 0),
                    ("a dog", -1)]:
        with pytest.raises(ValueError, match=r"query|k must"):
            index.search(text, k=k)
    with pytest.raises(ValueError, match="candidates must be a positive number"):
        index.search("a dog", candidates=0)


def _message_text(node) -> str | None:
    """A string literal's text (an f-string's literal parts joined), or None."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def test_messages_name_the_command_by_its_console_script():
    """What dicosa says (errors, warnings, help) names a command as 'dicosa check', never
    'python -m dicosa check': every string literal of the package, docstrings aside."""
    import ast

    found = []
    for path in sorted((REPO / "dicosa").rglob("*.py")):
        tree = ast.parse(path.read_text())
        documented = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                           ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            text = _message_text(node)
            if text is not None and id(node) not in documented and "-m dicosa" in text:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found
