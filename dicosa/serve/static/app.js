// dicosa's search page: plain JavaScript, no build step.
// State lives in the URL (?q=&without=&mode=&source=&page= or ?like=ID[&row=R]&page=), so a
// search can be shared and the Back button works. Everything shown comes from /api/...; text from the server
// is put in with textContent only.
"use strict";

const PAGE = 12;
const $ = (id) => document.getElementById(id);
const el = {
  form: $("search"), q: $("q"), without: $("without"), mode: $("mode"),
  modeField: $("mode-field"), facts: $("facts"), status: $("status"), notes: $("notes"),
  source: $("source"), sourceField: $("source-field"),
  results: $("results"), pager: $("pager"), prev: $("prev"), next: $("next"),
  pageLabel: $("page-label"), playerBox: $("player-box"), player: $("player"),
  nowPlaying: $("now-playing"), closePlayer: $("close-player"),
  template: $("hit-template"),
};
let info = null;
let current = 0; // the request in flight: older answers are dropped
let shown = { text: "", kind: "" }; // what the status said before a player's error

function clock(seconds) {
  // m:ss, with tenths where the time is not a whole second; h:mm:ss past an hour
  if (seconds === null || seconds === undefined) return "?";
  const whole = Math.abs(seconds - Math.round(seconds)) < 0.05;
  if (whole) seconds = Math.round(seconds);
  const h = Math.floor(seconds / 3600);
  const m = Math.floor((seconds - 3600 * h) / 60);
  const s = seconds - 3600 * h - 60 * m;
  const sec = whole ? String(s).padStart(2, "0") : s.toFixed(1).padStart(4, "0");
  return h ? `${h}:${String(m).padStart(2, "0")}:${sec}` : `${m}:${sec}`;
}

function say(text, kind = "") {
  delete el.status.dataset.player;
  shown = { text, kind };
  el.status.textContent = text;
  el.status.className = `status ${kind}`;
}

function sayPlayer(text) {
  // a player's error: shown until a video plays, then what the status said before
  el.status.textContent = text;
  el.status.className = "status error";
  el.status.dataset.player = "1";
}

function clearPlayer() {
  if (el.status.dataset.player) say(shown.text, shown.kind);
}

function state() {
  const p = new URLSearchParams(location.search);
  return {
    q: p.get("q") || "", without: p.get("without") || "", mode: p.get("mode") || "",
    source: p.get("source") || "", like: p.get("like") || "", row: p.get("row") || "",
    page: Math.max(1, parseInt(p.get("page") || "1", 10) || 1),
  };
}

function go(next, replace = false) {
  const p = new URLSearchParams();
  if (next.like) {
    p.set("like", next.like);
    if (next.row) p.set("row", next.row);
  } else {
    if (next.q) p.set("q", next.q);
    if (next.without) p.set("without", next.without);
    if (next.mode) p.set("mode", next.mode);
    if (next.source) p.set("source", next.source);
  }
  if (next.page > 1) p.set("page", String(next.page));
  const url = `${location.pathname}${p.toString() ? "?" + p : ""}`;
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  window.scrollTo(0, 0);
  show();
}

async function ask(url, options) {
  let response;
  try {
    response = await fetch(url, { credentials: "same-origin", ...options });
  } catch (e) {
    throw new Error("the server cannot be reached");
  }
  if (response.status === 401) {
    location.href = `/login?next=${encodeURIComponent(location.pathname + location.search)}`;
    throw new Error("this server needs its API key");
  }
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const error = new Error((body && body.error) || `the server answered ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

async function loadInfo() {
  try {
    info = await ask("/api/info");
  } catch (e) {
    if (e.status === 503) { setTimeout(loadInfo, 2000); say("The index is still opening…"); }
    else say(`The service does not answer: ${e.message}.`, "error");
    return;
  }
  const heads = [];
  const plugins = info.plugins || {};
  if (plugins.words) heads.push("words");
  if (plugins.exclusion) heads.push("“without”");
  if (plugins.fusion) heads.push("titles");
  const words = Object.keys((plugins.text && plugins.text.sources) || {});
  el.facts.textContent = `${info.videos.toLocaleString()} videos · ${info.model.arch}` +
    (heads.length ? ` · ${heads.join(", ")}` : "") +
    (words.length ? ` · words from ${words.join(", ")}` : "");
  el.sourceField.hidden = !words.length;  // pictures only: nothing to choose
  el.source.title = words.length ? `match the pictures, the words (${words.join(", ")}), or both`
    : "";
  el.mode.replaceChildren();
  for (const [name, help] of Object.entries(info.modes)) {
    const option = new Option(name, name, false, name === info.default_mode);
    option.title = help;
    el.mode.add(option);
  }
  el.modeField.hidden = Object.keys(info.modes).length < 2;
  el.without.disabled = !plugins.exclusion;
  el.without.title = plugins.exclusion ? "what must not be in the video"
    : "this index has no concepts head, so it cannot leave things out";
  show();
}

function show() {
  if (!info) return;
  const s = state();
  el.q.value = s.q;
  el.without.value = s.without;
  if (s.mode && info.modes[s.mode]) el.mode.value = s.mode;
  el.source.value = ["visual", "text"].includes(s.source) ? s.source : "";
  if (s.like) {
    const p = new URLSearchParams({ k: PAGE, offset: (s.page - 1) * PAGE });
    if (s.row) p.set("row", s.row);
    return run(s, `/api/videos/${encodeURIComponent(s.like)}/similar?${p}`);
  }
  if (!s.q.trim()) {
    el.results.replaceChildren(); el.notes.replaceChildren(); el.pager.hidden = true;
    say("Type what you are looking for, for example “a red circle moves left”. " +
        (info.plugins && info.plugins.exclusion
          ? "Put what must not be in the video under “without”." : ""));
    return;
  }
  const p = new URLSearchParams({ q: s.q, k: PAGE, offset: (s.page - 1) * PAGE,
                                  explain: "true" });
  for (const part of s.without.split(",")) if (part.trim()) p.append("exclude", part.trim());
  if (s.mode) p.set("mode", s.mode);
  if (s.source) p.set("source", s.source);
  run(s, `/api/search?${p}`);
}

async function run(s, url) {
  const mine = ++current;
  say("Searching…", "busy");
  el.results.setAttribute("aria-busy", "true");
  let answer;
  try {
    answer = await ask(url);
  } catch (e) {
    if (mine !== current) return;
    el.results.replaceChildren(); el.pager.hidden = true;
    el.results.removeAttribute("aria-busy");
    say(`The search did not work: ${e.message}.`, "error");
    return;
  }
  if (mine !== current) return;
  el.results.removeAttribute("aria-busy");
  render(s, answer);
}

function render(s, answer) {
  el.notes.replaceChildren(...answer.notes.map((n) => {
    const li = document.createElement("li"); li.textContent = n; return li;
  }));
  if (answer.truncated) {
    const li = document.createElement("li");
    li.textContent = `Only the first ${info.model.max_words} tokens of the query were read.`;
    el.notes.append(li);
  }
  el.results.replaceChildren(...answer.hits.map((hit) => card(hit, answer)));
  const like = `videos like ${s.row ? "a moment of " : ""}video ${s.like}`;
  const what = s.like ? like : `“${s.q}”` +
    (s.without ? ` without “${s.without}”` : "");
  if (!answer.hits.length) {
    say(s.page > 1 ? `There are no more results for ${what}.`
      : `No video matches ${what}. Try other words, or fewer of them.`, "empty");
  } else {
    const first = answer.query.offset + 1;
    const t = answer.times_ms;
    const parts = [["query", t.encode], ["words", t.words], ["first stage", t.first_stage],
                   ["rerank", t.rerank], ["moments", t.moments]]
      .filter(([, v]) => v !== undefined).map(([n, v]) => `${n} ${v.toFixed(0)}`);
    const by = answer.ranked_by;
    const ranked = by && by.by !== "pictures" ? ` · ranked by ${by.by} (${by.sources.join(", ")})`
      : "";
    say(`Results ${first}–${first + answer.hits.length - 1} for ${what}${ranked} · ` +
        `${(t.total || 0).toFixed(0)} ms (${parts.join(" · ")})`);
  }
  el.pager.hidden = s.page === 1 && !answer.more;
  el.prev.disabled = s.page === 1;
  el.next.disabled = !answer.more;
  el.pageLabel.textContent = `page ${s.page}`;
}

function card(hit, answer) {
  const node = el.template.content.firstElementChild.cloneNode(true);
  node.dataset.id = hit.id;
  node.id = `hit-${hit.rank}`;
  const stages = hit.stage_scores
    ? Object.entries(hit.stage_scores).map(([k, v]) => `${k} ${v.toFixed(4)}`).join(", ")
    : "every video reranked";
  node.title = `score ${hit.score.toFixed(4)} · DiCoSA ${hit.dicosa.toFixed(4)} · ` +
    `proposed by ${hit.stage} (${stages})`;
  node.querySelector(".name").textContent = hit.title || hit.name;
  node.querySelector(".rank").textContent = `#${hit.rank}`;
  node.querySelector(".score").textContent = hit.score.toFixed(3);
  node.querySelector(".stage").textContent = hit.stage;
  const thumb = node.querySelector(".thumb");
  const img = thumb.querySelector("img");
  const best = hit.moment ? hit.moment.best : null;
  img.addEventListener("load", () =>  // a portrait picture is shown whole, not cropped
    thumb.classList.toggle("tall", img.naturalHeight > img.naturalWidth));
  if (hit.thumbnail) img.src = hit.thumbnail;
  else thumb.classList.add("missing");
  img.alt = `${hit.name}${best && best.time !== null ? " at " + clock(best.time) : ""}`;
  if (best && best.by === "words") thumb.title = "where the words matched";
  thumb.querySelector(".when").textContent = best && best.time !== null ? clock(best.time) : "";
  thumb.addEventListener("click", () => play(hit, best ? best.time : 0, node));
  partial(node, hit);
  timeline(node, hit);
  said(node, hit);
  chips(node, hit, answer);
  node.querySelector(".like").addEventListener("click",
    () => go({ like: String(hit.id), row: node.dataset.row || "", page: 1 }));
  return node;
}

function partial(node, hit) {
  // a video whose decode lost part of it: indexed from the rest, and said so
  const note = node.querySelector(".partial");
  if (!hit.partial) return;
  note.hidden = false;
  note.textContent = `Partial: ${hit.partial.damage}`;
  note.title = "indexed from what decodes; the rest of the file could not be read";
}

function timeline(node, hit) {
  // The whole video, left to right: one bar per frame the index keeps (a long video's thinned
  // by the server, and of a very long one only the segments it scored), placed at its time,
  // as high as the query matches there; below it the hit's moments, the time ranges that
  // matched best. A click plays from there.
  const box = node.querySelector(".timeline");
  box.setAttribute("aria-label", "where the query matches, over the whole video");
  if (!hit.moment) { box.textContent = "no frames (indexed from its title)"; return; }
  if (hit.moment.scored_rows < hit.moment.rows) {
    box.title = `${hit.moment.scored_rows} of its ${hit.moment.rows} segments scored`;
    box.setAttribute("aria-label", `where the query matches, over the whole video (${box.title})`);
  }
  const frames = hit.moment.frames.filter((f) => f.time !== null);
  if (!frames.length) { box.textContent = "frame times unknown"; box.classList.add("none"); }
  const last = frames.length ? frames[frames.length - 1].time : 0;
  const span = Math.max(hit.duration || 0, last + 1e-3,
                        ...(hit.moments || []).map((m) => m.end || 0));
  const scores = frames.map((f) => f.score).filter((v) => v !== null);
  const low = Math.min(...scores), high = Math.max(...scores);
  const byScore = scores.length > 1 && high > low;  // a long video: relevance varies
  const top = Math.max(...frames.map((f) => f.weight), 1e-9);
  // A bar reaches the next frame, but no further than the strip's usual spacing: a sampled
  // strip has no frames in the segments it did not score, and a bar does not claim them.
  const gaps = frames.slice(1).map((f, i) => f.time - frames[i].time).sort((a, b) => a - b);
  const step = gaps.length ? gaps[Math.floor(gaps.length / 2)] : span;
  frames.forEach((f, i) => {
    const next = Math.min(i + 1 < frames.length ? frames[i + 1].time : span, f.time + step);
    const bar = document.createElement("button");
    bar.type = "button";
    bar.className = "frame" + (f.frame === hit.moment.best.frame ? " best" : "");
    const height = byScore && f.score !== null ? (f.score - low) / (high - low) : f.weight / top;
    bar.style.setProperty("--w", String(height));
    bar.style.setProperty("--x", String(f.time / span));
    bar.style.setProperty("--dx", String(Math.max(0, next - f.time) / span));
    bar.dataset.time = String(f.time);
    bar.dataset.frame = String(f.frame);
    bar.setAttribute("aria-label", `play from ${clock(f.time)} (weight ${f.weight.toFixed(2)})`);
    bar.title = `${clock(f.time)} · weight ${f.weight.toFixed(3)}` +
      (f.score !== null ? ` · score ${f.score.toFixed(3)}` : "");
    bar.addEventListener("click", () => play(hit, f.time, node));
    bar.addEventListener("keydown", (event) => {
      const step = { ArrowLeft: -1, ArrowRight: 1 }[event.key];
      if (!step) return;
      const all = [...box.querySelectorAll(".frame")];
      const j = all.indexOf(bar) + step;
      if (all[j]) { all[j].focus(); event.preventDefault(); }
    });
    box.append(bar);
  });
  moments(node, hit, span);
}

function moments(node, hit, span) {
  // The moments as marks on a track under the strip, at their times, and as a list of their
  // time ranges (best first) that a click plays: a long video's moments are too narrow on
  // the track to carry their times. A video of one segment is its own moment: neither.
  const track = node.querySelector(".moments");
  const list = node.querySelector(".moment-list");
  track.replaceChildren(); list.replaceChildren();
  const ranges = (hit.moments || []).filter((m) => m.start !== null && m.end !== null);
  const whole = !hit.moment || hit.moment.rows < 2;
  track.hidden = !ranges.length || !span || whole;
  list.hidden = !ranges.length || whole;
  ranges.forEach((m, i) => {
    const range = `${clock(m.start)}–${clock(m.end)}`;
    const pick = () => {
      // "More like this" now starts from this moment
      node.dataset.row = String(m.row);
      node.querySelector(".like").textContent = "More like this moment";
      play(hit, m.start, node);
    };
    const mark = document.createElement("button");
    mark.type = "button";
    mark.tabIndex = -1;  // the list below is the keyboard's way in
    mark.className = "moment" + (i === 0 ? " best" : "");
    mark.style.setProperty("--x", String(m.start / span));
    mark.style.setProperty("--dx", String((m.end - m.start) / span));
    mark.dataset.start = String(m.start);
    mark.dataset.end = String(m.end);
    mark.dataset.row = String(m.row);
    mark.title = `moment ${range} · score ${m.score.toFixed(3)}`;
    mark.addEventListener("click", pick);
    track.append(mark);
    const item = document.createElement("li");
    const time = document.createElement("button");
    time.type = "button";
    time.className = "moment-time" + (i === 0 ? " best" : "");
    time.textContent = range;
    time.title = mark.title;
    time.setAttribute("aria-label", `play the moment ${clock(m.start)} to ${clock(m.end)} ` +
                      `(score ${m.score.toFixed(2)})`);
    time.addEventListener("click", pick);
    item.append(time);
    list.append(item);
  });
}

function folded(word) {
  // a word as the text index compares it: lower case, accents removed
  return word.normalize("NFD").replace(/\p{M}/gu, "").toLowerCase();
}

function marked(text, words) {
  // the line's text with the query's words in <mark>, built from text nodes only
  const wanted = new Set(words);
  const parts = [];
  let at = 0;
  for (const m of text.matchAll(/[\p{L}\p{N}]+/gu)) {
    if (!wanted.has(folded(m[0]))) continue;
    parts.push(document.createTextNode(text.slice(at, m.index)));
    const mark = document.createElement("mark");
    mark.textContent = m[0];
    parts.push(mark);
    at = m.index + m[0].length;
  }
  parts.push(document.createTextNode(text.slice(at)));
  return parts;
}

function said(node, hit) {
  // What was said or written that matched, under the moments: its time (a click plays from
  // there), its source, the line with the query's words marked.
  const list = node.querySelector(".lines");
  const lines = hit.lines || (hit.line ? [hit.line] : []);
  list.hidden = !lines.length;
  for (const line of lines) {
    const item = document.createElement("li");
    item.className = "said";
    item.dataset.source = line.source;
    const when = document.createElement("button");
    when.type = "button";
    when.className = "said-when";
    when.textContent = `${line.source} ${clock(line.start)}–${clock(line.end)}`;
    when.setAttribute("aria-label", `play from ${clock(line.start)}, where the ` +
                      `${line.source} matched`);
    when.addEventListener("click", () => play(hit, line.start, node));
    const text = document.createElement("span");
    text.className = "said-text";
    text.append(...marked(line.text, line.words));
    item.append(when, text);
    list.append(item);
  }
}

function chip(text, kind, title) {
  const li = document.createElement("li");
  li.className = `chip ${kind}`;
  li.textContent = text;
  if (title) li.title = title;
  return li;
}

function chips(node, hit, answer) {
  const why = hit.explain || {};
  const words = node.querySelector(".words");
  if (why.words) {
    const shared = Object.entries(why.words.words).slice(0, 6);
    for (const [w, c] of shared) words.append(chip(w, "word", `contributes ${c.toFixed(3)}`));
    if (!shared.length) words.append(chip("no shared words", "word none"));
  }
  const concepts = node.querySelector(".concepts");
  if (why.exclusion) {
    const named = (list) => [...new Set(list.flatMap((d) => d.words))].slice(0, 4).join(", ");
    const matched = named(why.exclusion.matched_words);
    const absent = named(why.exclusion.excluded_empty_words);
    if (matched) concepts.append(chip(`✓ ${matched}`, "concept matched",
      "concepts of the query this video shows"));
    if (absent) concepts.append(chip(`✗ ${absent}`, "concept absent",
      `concepts of “${answer.query.without.join(", ")}” absent from this video`));
    if (why.exclusion.demoted) concepts.append(chip("shows it: moved back", "concept demoted"));
  }
}

function play(hit, time, node) {
  if (!hit.video) { sayPlayer(`${hit.name} cannot be played: its file is not available.`);
                    return; }
  if (hit.media_type && el.player.canPlayType(hit.media_type) === "") {
    sayPlayer(`This browser cannot play ${hit.name} (${hit.media_type}); the thumbnails ` +
              "still show the moment.");
    return;
  }
  clearPlayer();
  el.player.dataset.name = hit.name;
  const start = time || 0;
  el.playerBox.hidden = false;
  el.nowPlaying.textContent = `${hit.title || hit.name} · from ${clock(start)}`;
  document.querySelectorAll(".hit.playing").forEach((n) => n.classList.remove("playing"));
  if (node) node.classList.add("playing");
  const seek = () => {
    el.player.currentTime = start;
    el.player.play().catch(() => { /* autoplay refused: the controls are there */ });
  };
  if (el.player.dataset.id !== String(hit.id)) {
    el.player.dataset.id = String(hit.id);
    el.player.src = hit.video;
    el.player.addEventListener("loadedmetadata", seek, { once: true });
    el.player.load();
  } else if (el.player.readyState >= 1) seek();
  else el.player.addEventListener("loadedmetadata", seek, { once: true });
  if (node && hit.media_token !== undefined) {
    const img = node.querySelector(".thumb img");
    img.src = `/api/videos/${hit.id}/thumb?t=${start}` +
      (hit.media_token ? `&${hit.media_token}` : "");
    node.querySelector(".when").textContent = clock(start);
  }
  el.playerBox.scrollIntoView({ block: "nearest" });
}

function closePlayer() {
  el.player.pause();
  el.playerBox.hidden = true;
  document.querySelectorAll(".hit.playing").forEach((n) => n.classList.remove("playing"));
}

el.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const q = el.q.value.trim();
  if (!q) { say("Type what to look for first.", "error"); el.q.focus(); return; }
  const mode = el.modeField.hidden || el.mode.value === info.default_mode ? "" : el.mode.value;
  const source = el.sourceField.hidden ? "" : el.source.value;
  go({ q, without: el.without.value.trim(), mode, source, page: 1 });
});
el.prev.addEventListener("click", () => go({ ...state(), page: state().page - 1 }));
el.next.addEventListener("click", () => go({ ...state(), page: state().page + 1 }));
el.closePlayer.addEventListener("click", closePlayer);
el.player.addEventListener("playing", clearPlayer);
el.player.addEventListener("error", () => {
  if (!el.player.getAttribute("src")) return;
  sayPlayer(`${el.player.dataset.name || "This video"} cannot be played: the server could ` +
            "not send it in a form this browser plays.");
});
window.addEventListener("popstate", show);
document.addEventListener("keydown", (event) => {
  const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
  if (event.key === "/" && !typing) { event.preventDefault(); el.q.focus(); el.q.select(); }
  if (event.key === "Escape" && !el.playerBox.hidden) closePlayer();
});
loadInfo();
