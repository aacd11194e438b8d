"""The search page in a real Chromium (Selenium 4, Debian's chromium + chromium-driver).

A uvicorn server on a free loopback port serves scenes of coloured shapes (``_scene_clips.py``)
as VP9 clips, with a concepts head ("without") and a lexical head (word chips). Skipped, with
the reason, where Chromium or its driver is not installed; ``make test`` installs both where
it may (``tests/_system.py``).

``DICOSA_SCREENSHOT=docs/serve.png`` writes the page's screenshot there (the one in the docs).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("selenium")

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from dicosa.serve.app import Settings, create_app
from dicosa.serve.engine import Engine

from ._scene_clips import SLOTS, A, B, scene_index
from ._serve import served
from ._system import NEEDS, needs

DRIVER = NEEDS["chromedriver"].found()
pytestmark = needs("chromium", "chromedriver")

PAGE = 12  # the page's results per page (app.js)
WAIT = 30  # seconds: a loaded 2-core machine is slow


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    index, scenes = scene_index(tmp_path_factory.mktemp("clips"))
    return Engine(index), scenes


@pytest.fixture(scope="module")
def base(collection):
    with served(create_app(collection[0], Settings(reload_interval_s=0))) as url:
        yield url


def chromium(*extra: str):
    """A headless Chromium driven by chromedriver (skips the test where it cannot start)."""
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,900",
                     "--autoplay-policy=no-user-gesture-required", *extra):
        options.add_argument(argument)
    try:
        driver = webdriver.Chrome(service=DriverService(str(DRIVER)), options=options)
    except WebDriverException as exc:
        pytest.skip(f"Chromium does not start here: {exc.msg}")
    driver.set_page_load_timeout(WAIT)
    return driver


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def open_page(browser, base: str, **params) -> None:
    browser.get(f"{base}/?{urllib.parse.urlencode(params)}")
    wait_settled(browser)


def wait_settled(browser) -> None:
    """Until the page has answered: results, or a plain-words empty or error state."""
    WebDriverWait(browser, WAIT).until(lambda d: d.execute_script(
        "const s = document.getElementById('status');"
        "return s.textContent && !s.classList.contains('busy')"
        " && !document.getElementById('results').hasAttribute('aria-busy');"))


def click(browser, element) -> None:
    """A user's click: on the element in the middle of the window (not under the bar)."""
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def order(browser) -> list[int]:
    return [int(li.get_attribute("data-id"))
            for li in browser.find_elements(By.CSS_SELECTOR, "#results li.hit")]


def has_b(scenes, ids) -> list[bool]:
    return [B in scenes[i] for i in ids]


def test_results_render_with_thumbnails_timelines_and_details(browser, base, collection):
    engine = collection[0]
    open_page(browser, base, q="a red circle")
    shown = order(browser)
    expected = engine.search(_request("a red circle", PAGE)).body["hits"]
    assert shown == [h["id"] for h in expected]
    assert "Results 1–12" in browser.find_element(By.ID, "status").text
    first = browser.find_element(By.CSS_SELECTOR, "#results li.hit")
    assert "score" in first.get_attribute("title") and "proposed by" in first.get_attribute(
        "title")
    bars = first.find_elements(By.CSS_SELECTOR, ".timeline .frame")
    assert len(bars) == SLOTS
    for part in (".moments", ".moment-list"):  # a clip is its own one moment: not drawn
        assert not first.find_element(By.CSS_SELECTOR, part).is_displayed()
    best = expected[0]["moment"]["best"]
    assert [b.get_attribute("data-frame") for b in bars if "best" in b.get_attribute(
        "class")] == [str(best["frame"])]
    WebDriverWait(browser, WAIT).until(lambda d: d.execute_script(
        "return [...document.querySelectorAll('#results img')].slice(0, 4)"
        ".every(i => i.complete && i.naturalWidth > 0)"))
    assert browser.execute_script(
        "return document.getElementById('player').canPlayType('video/webm; codecs=\"vp9\"')")


def test_timeline_click_plays_the_video_from_that_frame(browser, base, collection):
    engine, _ = collection
    open_page(browser, base, q="a green cross")
    hit = engine.search(_request("a green cross", PAGE)).body["hits"][0]
    frame = 2
    wanted = hit["moment"]["frames"][frame]["time"]
    assert wanted == pytest.approx(2.5)  # slot 2 of 40 frames at 10 fps: frame 25
    card = browser.find_element(By.CSS_SELECTOR, f"#results li.hit[data-id='{hit['id']}']")
    click(browser, card.find_elements(By.CSS_SELECTOR, ".timeline .frame")[frame])
    WebDriverWait(browser, WAIT).until(lambda d: d.execute_script(
        "const v = document.getElementById('player');"
        "return v.readyState >= 1 && !v.seeking && v.currentTime > 0;"))
    now = browser.execute_script("const v = document.getElementById('player'); v.pause();"
                                 "return v.currentTime;")
    assert wanted - 0.05 <= now <= wanted + 1.0  # seeked there (and may have played on)
    assert browser.find_element(By.ID, "player").get_attribute("src").endswith(
        f"/api/videos/{hit['id']}/stream")
    assert "from 0:02.5" in browser.find_element(By.ID, "now-playing").text
    # Keyboard: focus the first bar, Enter plays from its time.
    bar = card.find_elements(By.CSS_SELECTOR, ".timeline .frame")[0]
    browser.execute_script("arguments[0].focus()", bar)
    bar.send_keys(Keys.ENTER)
    first = hit["moment"]["frames"][0]["time"]
    WebDriverWait(browser, WAIT).until(lambda d: d.execute_script(
        "const v = document.getElementById('player');"
        f"return !v.seeking && v.currentTime < {first + 1.0};"))
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    assert not browser.find_element(By.ID, "player-box").is_displayed()


def test_without_changes_the_ranking_and_names_the_absent_concepts(browser, base, collection):
    _, scenes = collection
    open_page(browser, base, q="a red circle")
    before = order(browser)
    assert any(has_b(scenes, before[:4]))  # the plain query ranks videos with B high
    field = browser.find_element(By.ID, "without")
    field.clear()
    field.send_keys("a blue square", Keys.ENTER)
    WebDriverWait(browser, WAIT).until(lambda d: "without=" in d.current_url)
    wait_settled(browser)
    after = order(browser)
    assert after != before and sorted(after[:4]) == [0, 1, 2, 3]
    assert not any(has_b(scenes, after[:4]))
    first = browser.find_element(By.CSS_SELECTOR, "#results li.hit")
    assert first.find_elements(By.CSS_SELECTOR, ".chip.absent")  # B's concepts, absent
    assert first.find_elements(By.CSS_SELECTOR, ".chip.matched")
    screenshot(browser)


def test_word_chips_show_the_words_shared_with_the_query(browser, base):
    open_page(browser, base, q="a red circle")
    words = [c.text for c in browser.find_elements(By.CSS_SELECTOR,
                                                    "#results li.hit:first-child .chip.word")]
    assert words and {"red", "circle"} & set(words)


def test_paging_url_and_more_like_this(browser, base):
    open_page(browser, base, q="a red circle")
    first_page = order(browser)
    click(browser, browser.find_element(By.ID, "next"))
    WebDriverWait(browser, WAIT).until(lambda d: "page=2" in d.current_url)
    wait_settled(browser)
    second = order(browser)
    assert second and not set(second) & set(first_page)
    assert browser.find_element(By.CSS_SELECTOR, "#results li.hit .rank").text == f"#{PAGE + 1}"
    browser.back()
    WebDriverWait(browser, WAIT).until(lambda d: "page=2" not in d.current_url)
    wait_settled(browser)
    assert order(browser) == first_page
    seed = first_page[0]
    click(browser, browser.find_element(By.CSS_SELECTOR, "#results li.hit .like"))
    WebDriverWait(browser, WAIT).until(lambda d: f"like={seed}" in d.current_url)
    wait_settled(browser)
    assert order(browser) and seed not in order(browser)


def test_empty_and_error_states_are_plain_words(browser, base):
    def status() -> str:
        return browser.find_element(By.ID, "status").text

    open_page(browser, base, q="zebra", mode="bow")  # shares no word with any video
    assert not order(browser) and status().startswith("No video matches “zebra”")
    open_page(browser, base, q="x" * 600)
    assert "The search did not work: the query is 600 characters long" in status()
    open_page(browser, base)
    assert status().startswith("Type what you are looking for")
    browser.find_element(By.TAG_NAME, "body").send_keys("/")
    assert browser.switch_to.active_element.get_attribute("id") == "q"


def test_with_an_api_key_the_login_cookie_lets_the_page_and_its_video_in(browser, collection):
    key = "the key of this test"
    with served(create_app(collection[0], Settings(api_key=key, reload_interval_s=0))) as url:
        browser.get(f"{url}/?q=a+red+circle")
        WebDriverWait(browser, WAIT).until(lambda d: "/login" in d.current_url)
        field = browser.find_element(By.NAME, "key")
        field.send_keys("a wrong key", Keys.ENTER)
        WebDriverWait(browser, WAIT).until(lambda d: "failed=1" in d.current_url)
        assert browser.find_element(By.ID, "failed").is_displayed()
        browser.find_element(By.NAME, "key").send_keys(key, Keys.ENTER)
        WebDriverWait(browser, WAIT).until(lambda d: "q=a+red+circle" in d.current_url
                                           and "/login" not in d.current_url)
        wait_settled(browser)
        assert order(browser)
        bar = browser.find_elements(By.CSS_SELECTOR, "#results li.hit .timeline .frame")[1]
        click(browser, bar)
        WebDriverWait(browser, WAIT).until(lambda d: d.execute_script(
            "const v = document.getElementById('player');"
            "return v.readyState >= 1 && !v.seeking && v.currentTime > 1;"))
        browser.delete_all_cookies()


def _request(q: str, k: int):
    from dicosa.serve.engine import SearchRequest

    return SearchRequest(q, k=k)


def screenshot(browser) -> None:
    """The page as the docs show it, when DICOSA_SCREENSHOT names a file (kept small)."""
    target = os.environ.get("DICOSA_SCREENSHOT")
    if not target:
        return
    from PIL import Image

    browser.execute_script("window.scrollTo(0, 0)")
    raw = Path(target).with_suffix(".raw.png")
    browser.save_screenshot(str(raw))
    image = Image.open(raw).convert("RGB")
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)
    raw.unlink()


def test_api_docs_render_offline(base):
    """/docs lists the operations with the network off: no name but the server's resolves,
    so a script or stylesheet from a CDN would fail to load (and the page stay blank)."""
    offline = chromium("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                       "--disable-background-networking", "--disable-component-update")
    try:
        offline.get(f"{base}/docs")
        WebDriverWait(offline, WAIT).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path"))
        paths = {e.text.replace("\u200b", "") for e in
                 offline.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
        assert {"/api/search", "/api/videos/{video_id}/stream", "/api/info"} <= paths
        loaded = offline.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        assert loaded and all(url.startswith(base) for url in loaded), loaded
    finally:
        offline.quit()


LONG = [["green cross"], ["white circle"], ["blue square"], [A, "green circle"],
        ["white cross"], ["green square"]]
OTHER_LONG = [[["white square"], [A], ["green cross"], ["blue circle"], [A, B]],
              [["green circle"], ["white cross"], ["blue cross"], ["green square"]]]


@pytest.fixture(scope="module")
def long_engines(tmp_path_factory):
    from ._scene_clips import long_index

    index = long_index(tmp_path_factory.mktemp("long"), [LONG, *OTHER_LONG])
    return Engine(index), Engine(index, timeline_rows=2)


@pytest.fixture(scope="module")
def long_base(long_engines):
    with served(create_app(long_engines[0], Settings(reload_interval_s=0))) as url:
        yield url


def test_a_moment_click_plays_its_time_range(browser, long_base):
    """A long video of six 3-s scenes: the query's scene is the hit's best moment, marked on
    the timeline of the whole video; a click plays from the moment's start."""
    open_page(browser, long_base, q="a red circle")
    cards = browser.find_elements(By.CSS_SELECTOR, "#results li.hit")
    assert len(cards) == 3
    card = next(c for c in cards if c.find_element(By.CSS_SELECTOR, ".name").text
                == "long0.webm")
    marks = card.find_elements(By.CSS_SELECTOR, ".moments .moment")
    assert marks and "best" in marks[0].get_attribute("class")
    start, end = (float(marks[0].get_attribute(f"data-{k}")) for k in ("start", "end"))
    assert (start, end) == (9.0, 12.0)  # the fourth scene, the one with the red circle
    times = card.find_elements(By.CSS_SELECTOR, ".moment-list .moment-time")
    assert len(times) == len(marks) and times[0].text == "0:09–0:12"
    assert "best" in times[0].get_attribute("class")
    assert browser.execute_script(  # each time range whole, none cut short
        "return arguments[0].every(t => t.scrollWidth <= t.clientWidth)", times)
    bars = card.find_elements(By.CSS_SELECTOR, ".timeline .frame")
    assert len(bars) == 18  # every stored frame of the whole video, at 1 frame/s
    left = [b.rect["x"] for b in bars]
    assert left == sorted(left)  # placed by time across the whole video
    tallest = max(bars, key=lambda b: b.rect["height"])
    assert 9.0 <= float(tallest.get_attribute("data-time")) < 12.0
    click(browser, times[0])
    WebDriverWait(browser, WAIT).until(lambda d: d.execute_script(
        "const v = document.getElementById('player');"
        "return v.readyState >= 1 && !v.seeking && v.currentTime > 0;"))
    now = browser.execute_script("const v = document.getElementById('player'); v.pause();"
                                 "return v.currentTime;")
    assert start - 0.05 <= now < end  # in the moment's range
    assert "More like this moment" in card.find_element(By.CSS_SELECTOR, ".like").text
    if os.environ.get("DICOSA_MOMENTS_SCREENSHOT"):  # docs/moments.png
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(os.environ["DICOSA_MOMENTS_SCREENSHOT"])


def test_a_sampled_timeline_shows_its_scored_segments_and_says_so(browser, long_engines):
    """A server whose timelines score at most 2 segments (``--timeline-rows 2``): the
    six-scene video's strip holds the frames of its best moment's segment and one other,
    placed by time, and says on hover how many of its segments were scored."""
    with served(create_app(long_engines[1], Settings(reload_interval_s=0))) as url:
        open_page(browser, url, q="a red circle")
        card = next(c for c in browser.find_elements(By.CSS_SELECTOR, "#results li.hit")
                    if c.find_element(By.CSS_SELECTOR, ".name").text == "long0.webm")
        box = card.find_element(By.CSS_SELECTOR, ".timeline")
        assert box.get_attribute("title") == "2 of its 6 segments scored"
        bars = card.find_elements(By.CSS_SELECTOR, ".timeline .frame")
        times = [float(b.get_attribute("data-time")) for b in bars]
        assert len(times) == 6 and {9.0, 10.0, 11.0} <= set(times)  # 2 segments of 3 frames
        second = box.rect["width"] / 18  # the strip spans the video's 18 s
        # each bar a frame's second: none stretches over the segments not scored
        assert max(b.rect["width"] for b in bars) <= 1.1 * second
        best = card.find_element(By.CSS_SELECTOR, ".moments .moment")
        assert (best.get_attribute("data-start"), best.get_attribute("data-end")) == (
            "9", "12")
