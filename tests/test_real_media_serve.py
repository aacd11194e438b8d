"""Real footage indexed, checked, served and shown in a real browser, told the truth.

One index of real files (``tests/_real_footage.py``), built by ``dicosa index`` with the tiny
random-weight model: a portrait phone video (display matrix), a video shown tall, an XviD AVI
(no browser plays it as it is), a download cut at half its bytes, a 9.04-s clip whose last
stored frame sits near its end, and a copy of a clip removed after indexing (its file gone).
``index`` and ``check`` name the partial video, the API says what it lost and sends the AVI
converted (GET and HEAD alike), and Chromium plays it, draws thumbnails upright, shows the
partial note, clears a player error once another video plays, and keeps every bar in its card.
The media cache that converts the AVIs is tested on its own too: once per file, within its
budget, whole files only.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import threading
from email.utils import formatdate
from pathlib import Path

import av
import pytest
import simplejpeg

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from dicosa.cli.main import main
from dicosa.serve.app import Settings, create_app
from dicosa.serve.engine import Engine
from dicosa.serve.transcode import MediaCache, Plan, plan, probe

from ._system import reason
from .test_real_media import SAME, difference

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", str(REPO / "configs/synthetic.yaml"), "--set", "model.num_frames=4"]
QUERY = "a man rides a bike"


@pytest.fixture(scope="module")
def built(real_footage, tmp_path_factory) -> dict:
    """The index, what ``index`` and ``check`` printed, and the files by short name."""
    folder = tmp_path_factory.mktemp("real-index")
    videos = folder / "videos"
    videos.mkdir()
    sources = {"portrait": real_footage.portrait(), "tall": real_footage.rotated(180),
               "xvid": real_footage.avi("xvid"), "cut": real_footage.truncated(),
               "gone": real_footage.carphone,
               "ending": real_footage.join([(real_footage.bikes, 0.0, 9.04)],
                                           "bikes-9.04s.mp4", fps=25)[0]}
    files = {}
    for name, source in sources.items():
        files[name] = videos / f"{name}{source.suffix}"
        shutil.copyfile(source, files[name])
    out, printed = folder / "index", {}
    for command in (["index", str(videos), "--out", str(out), "--num-workers", "0", *TINY],
                    ["check", str(out)]):
        with contextlib.redirect_stdout(io.StringIO()) as said:
            assert main(command) == 0
        printed[command[0]] = said.getvalue()
    files["gone"].unlink()  # moved away after indexing: its hit cannot be played
    return {"index": out, "printed": printed, "files": files, "media": folder / "media"}


@pytest.fixture(scope="module")
def engine(built) -> Engine:
    return Engine.open(built["index"])


@pytest.fixture(scope="module")
def client(engine, built):
    app = create_app(engine, Settings(reload_interval_s=0, media_cache=str(built["media"])))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def hits_by_name(client) -> dict[str, dict]:
    answer = client.get("/api/search", params={"q": QUERY, "k": 12})
    assert answer.status_code == 200
    return {hit["name"].rsplit(".", 1)[0]: hit for hit in answer.json()["hits"]}


def test_index_and_check_name_the_partial_video(built):
    cut = str(built["files"]["cut"])
    index = built["printed"]["index"]
    assert "1 partial video(s), indexed from what decodes" in index
    line = next(line for line in index.splitlines() if cut in line)
    assert "its frames end at 2.1 s of the 5.3 s its container states" in line
    check = built["printed"]["check"].splitlines()
    assert check[-1] == "ok" and "1 partial video(s)" in check[0]
    assert [line for line in check if line.startswith("partial video:")] == [
        f"partial video: {cut}: " + line.split(f"{cut}: ", 1)[1]]


def test_the_api_says_what_a_partial_video_lost(client):
    hits = hits_by_name(client)
    partial = hits["cut"]["partial"]
    assert partial["decoded"] == pytest.approx(2.16, abs=0.05)
    assert partial["expected"] == pytest.approx(5.28)
    assert partial["damage"].startswith("its frames end at 2.1 s of the 5.3 s")
    assert hits["xvid"]["partial"] is None and hits["portrait"]["partial"] is None
    details = client.get(f"/api/videos/{hits['cut']['id']}").json()
    assert details["partial"] == partial


def test_an_avi_is_sent_converted_and_head_answers_as_get(client):
    hit = hits_by_name(client)["xvid"]
    assert hit["media_type"] == "video/mp4"  # what the stream sends, not the AVI's type
    got = client.get(hit["video"])
    head = client.head(hit["video"])
    source = client.app.state.service.engine.video(hit["id"]).path
    # a converted file's version is its source's, not the time the cache last used it
    assert head.headers["last-modified"] == formatdate(source.stat().st_mtime, usegmt=True)
    assert got.status_code == head.status_code == 200 and head.content == b""
    for name in ("content-type", "content-length", "accept-ranges", "etag", "last-modified"):
        assert head.headers[name] == got.headers[name], name
    assert got.headers["content-type"] == "video/mp4" and got.content[4:8] == b"ftyp"
    part = client.get(hit["video"], headers={"Range": "bytes=100-199",
                                             "If-Range": got.headers["etag"]})
    assert part.status_code == 206 and part.content == got.content[100:200]
    direct = hits_by_name(client)["portrait"]  # H.264 MP4: sent as it is
    assert client.head(direct["video"]).headers["content-length"] == str(
        Path(client.app.state.service.engine.video(direct["id"]).path).stat().st_size)


def test_thumbnails_are_upright(client):
    hits = hits_by_name(client)
    for name, shape in (("portrait", (136, 320)), ("tall", (320, 136))):
        image = simplejpeg.decode_jpeg(client.get(hits[name]["thumbnail"]).content)
        assert image.shape[:2] == shape, name


@pytest.mark.parametrize("kind, how, media_type", [
    ("xvid", "transcode", "video/mp4"), ("div3", "transcode", "video/mp4"),
    ("cinepak", "transcode", "video/mp4"), ("bikes", "direct", "video/mp4"),
    ("subtitled", "remux", "video/mp4"),  # H.264 in Matroska
])
def test_what_a_browser_cannot_play_is_converted(real_footage, kind, how, media_type):
    if kind == "bikes":
        path = real_footage.bikes
    elif kind == "subtitled":
        path = real_footage.with_subtitles(real_footage.bikes, [(1, 2, "hello")])
    else:  # half a second: FFmpeg's Cinepak encoder takes ~8 s a second of video
        path = real_footage.avi(kind, f"bikes-{kind}-short.avi", seconds=0.5)
    assert plan(probe(path)) == Plan(how, media_type)


def test_the_media_cache_converts_once_keeps_a_budget_and_leaves_no_part_files(
        real_footage, tmp_path):
    cache = MediaCache(tmp_path / "media", max_bytes=1 << 30)
    xvid, div3 = real_footage.avi("xvid"), real_footage.avi("div3")

    def get(path: Path) -> tuple:
        stat = path.stat()
        return cache.get(path, stat.st_size, stat.st_mtime)

    answers = []
    threads = [threading.Thread(target=lambda: answers.append(get(xvid))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({a[0] for a in answers}) == 1 and cache.converted == 1  # four asked, one made
    made, media_type, converted = answers[0]
    assert converted and media_type == "video/mp4" and made.parent == tmp_path / "media"
    found = probe(made)
    assert (found.family, found.video, found.pixels) == ("mp4", "h264", "yuv420p")
    with av.open(str(made)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    with av.open(str(xvid)) as container:
        source = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == len(source) and difference(frames[50], source[50]) < SAME
    assert get(xvid)[0] == made and cache.converted == 1  # kept: not converted again
    cache.max_bytes = made.stat().st_size + 1  # room for one of the two
    second = get(div3)[0]
    assert second.is_file() and not made.exists()  # the least recently used left
    assert not [p for p in (tmp_path / "media").iterdir() if p.name.startswith(".tmp-")]
    assert get(real_footage.bikes) == (real_footage.bikes, "video/mp4", False)


# -- the page, in Chromium ------------------------------------------------------------------

try:  # the API tests above run without Selenium
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from .test_serve_browser import WAIT, chromium, click, open_page
    SELENIUM = True
except (ImportError, pytest.skip.Exception):
    SELENIUM = False

browsing = pytest.mark.skipif(not SELENIUM or reason("chromium", "chromedriver") is not None,
                              reason=reason("chromium", "chromedriver") or "needs Selenium")


@pytest.fixture(scope="module")
def page(engine, built):
    from ._serve import served

    app = create_app(engine, Settings(reload_interval_s=0, media_cache=str(built["media"])))
    driver = chromium()
    with served(app) as url:
        open_page(driver, url, q=QUERY)
        yield driver
    driver.quit()


def card(page, name: str):
    return next(c for c in page.find_elements(By.CSS_SELECTOR, "#results li.hit")
                if c.find_element(By.CSS_SELECTOR, ".name").text.startswith(name + "."))


@browsing
def test_the_page_says_a_video_is_partial(page):
    note = card(page, "cut").find_element(By.CSS_SELECTOR, ".partial")
    assert note.is_displayed() and note.text.startswith("Partial: its frames end at 2.1 s")
    assert not card(page, "xvid").find_element(By.CSS_SELECTOR, ".partial").is_displayed()


@browsing
def test_the_page_shows_thumbnails_upright_and_a_tall_one_whole(page):
    WebDriverWait(page, WAIT).until(lambda d: d.execute_script(
        "return [...document.querySelectorAll('#results .thumb img')]"
        ".every(i => !i.getAttribute('src') || (i.complete && i.naturalWidth > 0))"))
    size = "return [arguments[0].naturalWidth, arguments[0].naturalHeight]"
    portrait = card(page, "portrait").find_element(By.CSS_SELECTOR, ".thumb img")
    tall = card(page, "tall").find_element(By.CSS_SELECTOR, ".thumb img")
    width, height = page.execute_script(size, portrait)
    assert width > height  # the phone's matrix turns it back to the landscape original
    width, height = page.execute_script(size, tall)
    assert height > width
    assert "tall" in card(page, "tall").find_element(By.CSS_SELECTOR, ".thumb").get_attribute(
        "class")


@browsing
def test_an_avi_plays_and_a_player_error_clears_when_another_video_plays(page):
    status = page.find_element(By.ID, "status")
    results = status.text
    click(page, card(page, "gone").find_element(By.CSS_SELECTOR, ".thumb"))
    assert "cannot be played: its file is not available" in status.text
    assert "error" in status.get_attribute("class")
    click(page, card(page, "xvid").find_element(By.CSS_SELECTOR, ".thumb"))
    WebDriverWait(page, WAIT).until(lambda d: d.execute_script(
        "const v = document.getElementById('player');"
        "return v.readyState >= 2 && v.currentTime > 0.5;"))  # it plays: time advances
    assert page.execute_script("return document.getElementById('player').error") is None
    assert status.text == results and "error" not in status.get_attribute("class")
    page.execute_script("document.getElementById('player').pause()")


@browsing
def test_every_timeline_bar_stays_in_its_card(page):
    """The 9.04-s clip's last stored frame is at 9 s: its bar starts 0.4% from the right
    edge, closer than its least width (3 px)."""
    for hit in page.find_elements(By.CSS_SELECTOR, "#results li.hit"):
        box = hit.find_element(By.CSS_SELECTOR, ".timeline").rect
        for bar in hit.find_elements(By.CSS_SELECTOR, ".timeline .frame"):
            assert box["x"] - 0.5 <= bar.rect["x"]
            assert bar.rect["x"] + bar.rect["width"] <= box["x"] + box["width"] + 0.5
    ending = card(page, "ending").find_elements(By.CSS_SELECTOR, ".timeline .frame")
    assert float(ending[-1].get_attribute("data-time")) == pytest.approx(9.0)
