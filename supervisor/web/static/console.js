// pgtaskd web console: live updates without a reload. Every refresh interval, while the tab
// is visible, the page asks the server for its own live part again (the header
// X-Console-Live: 1 makes the server render only that) and swaps it in when it changed.
// No library, nothing from another site.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var state = document.getElementById("live-state");
  var every = parseInt(document.body.getAttribute("data-refresh"), 10) || 0;
  if (!live || !every || !live.firstElementChild) { return; }
  var last = null, busy = false;

  function show(name, title) {
    if (state) { state.className = "live-state " + name; state.title = title; }
  }

  function typing() {
    var active = document.activeElement;
    return active && live.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
  }

  // A <details> the reader opened or closed (a traceback) stays so across updates.
  function swap(html) {
    var kept = {};
    live.querySelectorAll("details[id]").forEach(function (d) { kept[d.id] = d.open; });
    live.innerHTML = html;
    live.querySelectorAll("details[id]").forEach(function (d) {
      if (Object.prototype.hasOwnProperty.call(kept, d.id)) { d.open = kept[d.id]; }
    });
  }

  function tick() {
    if (busy || document.hidden || typing()) { return; }
    busy = true;
    fetch(window.location.href, {
      headers: { "X-Console-Live": "1" }, credentials: "same-origin", cache: "no-store"
    }).then(function (response) {
      if (!response.ok) { show("stale", "the last update failed: " + response.status); return null; }
      return response.text();
    }).then(function (html) {
      if (html === null) { return; }
      if (html !== last) { swap(html); last = html; }
      show("live", "updated " + new Date().toLocaleTimeString());
    }).catch(function () {
      show("offline", "the console cannot be reached");
    }).then(function () { busy = false; });
  }

  window.setInterval(tick, every);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { tick(); } });
})();
