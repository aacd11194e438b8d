"""The plugin contract: what a plugin declares (options, modes, explanations, annotations)
reaches searches and answers through the index alone, and the front ends name no plugin."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from dicosa.index import SearchMode, VideoIndex
from dicosa.index.plugins import IndexPlugin, QueryOption, chosen_plugins
from dicosa.model import VideoFeatures
from dicosa.plugins import ExclusionPlugin, LexicalPlugin, TextPlugin, TitlesPlugin
from dicosa.search.query import QueryError
from dicosa.search.sparse import SparseIndexError

PACKAGE = Path(__file__).resolve().parents[1] / "dicosa"


def _imports(source: str, package: tuple[str, ...]) -> set[str]:
    """The dicosa modules (and names) ``source``, a module of ``package``, imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("dicosa.")}


@pytest.mark.parametrize(("room", "never"), [
    ("cli", "dicosa.plugins"), ("serve", "dicosa.plugins"), ("serve", "dicosa.heads"),
    ("index", "dicosa.text"), ("index", "dicosa.plugins")])
def test_front_ends_and_the_index_name_no_plugin(room, never):
    """The command line and the service reach plugins through the index; the index reaches
    the text plugin through the contract (the commands that train or fit heads, ``heads``
    and ``index``'s summary, are the front ends of heads/ and may import it)."""
    files = sorted((PACKAGE / room).glob("*.py"))
    assert files
    offending = {f.name: sorted(n for n in _imports(f.read_text(), ("dicosa", room))
                                if n.startswith(never + ".")) for f in files}
    assert {name: found for name, found in offending.items() if found} == {}


def test_the_import_scan_sees_every_kind_of_import():
    """The scan above cannot pass by missing an import."""
    source = ("from ..plugins.text import TextPlugin\nimport dicosa.heads.base\n"
              "from . import engine\nfrom dicosa.text import rrf\n")
    assert _imports(source, ("dicosa", "serve")) == {
        "dicosa.plugins.text.TextPlugin", "dicosa.heads.base", "dicosa.serve.engine",
        "dicosa.text.rrf"}


def test_each_plugin_reads_the_options_it_declares():
    """``from_options``: None where the options ask nothing of a plugin, a plugin in the
    record's place, False to leave it out; what it cannot take is one sentence."""
    assert chosen_plugins({"query": "a dog", "k": 10}) == {}
    late = {"head": None, "beta_semantic": 0.0, "beta_title": 5.0, "trust": 1.0}
    assert TitlesPlugin.from_options({"trust": 0.0}, None) is None  # nothing to fuse
    changed = TitlesPlugin.from_options({"trust": 0.0}, late)
    assert (changed.late, changed.beta_title, changed.trust) == (True, 5.0, 0.0)
    assert TitlesPlugin.from_options({"no_fusion": True}, late) is False
    with pytest.raises(QueryError, match="--no-fusion searches without fusion"):
        TitlesPlugin.from_options({"no_fusion": True, "fusion": True}, late)
    with pytest.raises(ValueError, match=r"add --concepts HEAD\.pt"):
        ExclusionPlugin.from_options({"exclusion_set": {"window": 3}}, None)
    with pytest.raises(SparseIndexError, match=r"add --head HEAD\.pt"):
        LexicalPlugin.from_options({"sparse_backend": "exact"}, None)
    assert TextPlugin.from_options({"head": "x.pt"}, None) is None  # a search: no text option
    assert TextPlugin.from_options({"subtitles": False, "speech": None, "ocr": None}, None) is None
    reads = TextPlugin.from_options({"subtitles": None, "speech": "off", "ocr": None}, None)
    assert reads.asked["subtitles"] is None and reads.asked["speech"] is False


class Stamp(IndexPlugin):
    """A plugin of this test: an option, a default mode, and something to say of every hit."""

    key = "stamp"
    api_name = "stamped"

    def __init__(self):
        self.seen: list = []

    def attach(self, ctx) -> None:
        ctx.add_option(QueryOption("colour", self.colour, {"type": "string"}))
        ctx.add_modes(default="again", again=SearchMode(("dense",), "the dense stage again"))
        ctx.add_query_encoder(lambda encoded: self.seen.append(encoded.extra.get("colour")))

    @staticmethod
    def colour(value: object) -> str:
        if value not in ("red", "blue"):
            raise QueryError(f"no colour {value!r}")
        return str(value).upper()

    def explain(self, result, i):
        return {"row": result.hits[i].row}

    def annotate(self, result, i):
        return {"stamp": i}

    def summary(self, result):
        return {"stamped": True}

    def evidence(self, result, i):
        return ("stamp", (0.0, 1.0)) if i == 0 else None

    def readable(self, said):
        return [f"stamp {said['stamp']}", *([f"row {said['explain']['row']}"]
                                            if "explain" in said else [])]

    def describe(self):
        return {"colours": 2}


@pytest.fixture(scope="module")
def index(cli_model):
    index = VideoIndex(cli_model, device="cpu")
    n, frames = 6, cli_model.config.num_frames
    video = VideoFeatures(torch.randn(n, frames, cli_model.embed_dim).half(),
                          torch.ones(n, frames, dtype=torch.bool))
    index.add_features(video, [{"path": f"/v{i}.mp4"} for i in range(n)])
    return index


def test_a_request_is_checked_once_by_the_index(index):
    assert index.default_mode == "dense" and not index.plugins.leaves_out
    assert index.check_request(source="visual") == {"source": ["visual"]}
    for asked, said in [({"mode": "bow"}, "no 'bow' search mode"),
                        ({"exclude": ["a dog"]}, "cannot leave things out"),
                        ({"source": "speech"}, "no text lines"),
                        ({"source": "sound"}, "unknown source"),
                        ({"flavour": "x"}, "takes no search option 'flavour'")]:
        with pytest.raises(QueryError, match=said):
            index.check_request(**asked)


def test_what_a_plugin_declares_reaches_searches_and_answers(index):
    plugin = index.use(Stamp(), record=False)
    try:
        assert index.default_mode == "again"
        result = index.query("a red circle", k=3, colour="red")
        assert plugin.seen == ["RED"]
        with pytest.raises(QueryError, match="no colour 'green'"):
            index.query("a red circle", colour="green")
        said, row = index.annotations, result.hits[0].row
        assert said.explain(result, 0) == {"stamped": {"row": row}}
        assert said.hit(result, 1) == {"stamp": 1}
        assert said.answer(result) == {"ranked_by": {"by": "pictures", "sources": []},
                                       "stamped": True}
        assert said.evidence(result, 0) == ("stamp", (0.0, 1.0))
        assert said.evidence(result, 1) == ("pictures", None)
        assert said.readable(result, 0, explain=True) == ["stamp 0", f"row {row}"]
        assert said.readable(result, 2) == ["stamp 2"]
        assert said.describe() == {"stamped": {"colours": 2}}
    finally:
        index.plugins.detach("stamp")
    assert index.default_mode == "dense" and "colour" not in index.plugins.query_options
