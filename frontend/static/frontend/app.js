/* Loopwright operator UI: local times, confirmations, copy buttons and live updates (SSE).
   Progressive: every page works without this file (times then read in UTC, reload to refresh). */
(function () {
  "use strict";

  var pad = function (n) { return String(n).padStart(2, "0"); };

  function zoneName(date) {
    var parts = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(date);
    var zone = parts.find(function (p) { return p.type === "timeZoneName"; });
    return zone ? zone.value : "";
  }

  function localText(date) {
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) + " " +
      pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds()) + " " +
      zoneName(date);
  }

  /* <time datetime="…Z" data-local>… UTC</time> → the viewer's time zone (UTC kept as tooltip). */
  function localizeTimes(root) {
    root.querySelectorAll("time[data-local]").forEach(function (el) {
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) { return; }
      el.title = el.textContent.trim();
      el.textContent = localText(date).trim();
      el.removeAttribute("data-local");
    });
  }

  function fragment(html) {
    var template = document.createElement("template");
    template.innerHTML = html.trim();
    var node = template.content.firstElementChild;
    localizeTimes(template.content);
    return node;
  }

  function announce(text) {
    var region = document.getElementById("live-announcer");
    if (region) { region.textContent = text; }
  }

  function setIndicator(indicator, state, text) {
    if (!indicator) { return; }
    indicator.dataset.state = state;
    indicator.textContent = text;
  }

  /* One EventSource; handlers get the parsed JSON data and the source. */
  function connect(url, indicator, handlers) {
    var source = new EventSource(url);
    setIndicator(indicator, "connecting", "Connecting…");
    source.addEventListener("open", function () { setIndicator(indicator, "live", "Live"); });
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED) {
        setIndicator(indicator, "off", "Live updates stopped; reload the page.");
      } else {
        setIndicator(indicator, "reconnecting", "Reconnecting…");
      }
    });
    Object.keys(handlers).forEach(function (name) {
      source.addEventListener(name, function (event) {
        handlers[name](JSON.parse(event.data), source);
      });
    });
    return source;
  }

  function shortId(id) { return id.replace(/-/g, "").slice(-8); }

  function label(status) { return String(status || "").replace(/_/g, " "); }

  /* --- Monitor ---------------------------------------------------------------------------- */

  function newerThan(row, other) {
    var a = Date.parse(row.dataset.created), b = Date.parse(other.dataset.created);
    return a > b || (a === b && row.dataset.runId > other.dataset.runId);
  }

  function insertSorted(body, row, max) {
    var rows = Array.prototype.slice.call(body.rows);
    var before = rows.find(function (r) { return newerThan(row, r); });
    if (!before && rows.length >= max) { return false; }
    body.insertBefore(row, before || null);
    while (body.rows.length > max) { body.deleteRow(-1); }
    return true;
  }

  function monitor(table) {
    var body = table.tBodies[0];
    var insert = table.dataset.liveInsert === "true";
    var max = parseInt(table.dataset.maxRows, 10) || 50;
    var empty = document.getElementById("runs-empty");
    var counts = document.getElementById("run-counts");
    var indicator = document.querySelector("[data-live-indicator]");
    var refreshEmpty = function () { if (empty) { empty.hidden = body.rows.length > 0; } };
    connect(table.dataset.stream, indicator, {
      run: function (data) {
        var row = fragment(data.html);
        var old = document.getElementById("run-" + data.id);
        var name = row.cells[2] ? row.cells[2].textContent.trim() : "";
        if (old) {
          if (old.dataset.status !== data.status) {
            row.classList.add("flash-row");
            announce("Run " + shortId(data.id) + " of " + name + " is now " + label(data.status) + ".");
          }
          old.replaceWith(row);
        } else if (insert && insertSorted(body, row, max)) {
          row.classList.add("flash-row");
          announce("New run " + shortId(data.id) + " of " + name + ": " + label(data.status) + ".");
        }
        refreshEmpty();
      },
      "run-gone": function (data) {
        var old = document.getElementById("run-" + data.id);
        if (old) { old.remove(); refreshEmpty(); }
      },
      summary: function (data) { if (counts) { counts.innerHTML = data.html; } }
    });
  }

  /* --- A run's page ----------------------------------------------------------------------- */

  function keepOpen(oldNode, newNode) {
    var before = oldNode.querySelectorAll("details");
    var after = newNode.querySelectorAll("details");
    for (var i = 0; i < before.length && i < after.length; i++) { after[i].open = before[i].open; }
  }

  function runPage(page) {
    var indicator = page.querySelector("[data-live-indicator]");
    if (page.dataset.terminal === "true") { return; }
    var timeline = document.getElementById("timeline");
    var events = document.getElementById("events-body");
    var summary = document.getElementById("run-summary");
    var actions = document.getElementById("run-actions");
    var verdict = document.getElementById("run-verdict");
    var artifacts = document.getElementById("run-artifacts");
    connect(page.dataset.stream, indicator, {
      event: function (data) {
        if (document.getElementById("event-" + data.seq)) { return; }
        var row = fragment(data.html);
        row.classList.add("flash-row");
        events.appendChild(row);
      },
      step: function (data) {
        var group = document.getElementById(data.group);
        if (!group) {
          group = fragment(data.group_html);
          timeline.appendChild(group);
          document.getElementById("timeline-empty").hidden = true;
        }
        var item = fragment(data.html);
        var old = document.getElementById("step-" + data.seq);
        if (old) {
          keepOpen(old, item);
          old.replaceWith(item);
        } else {
          item.classList.add("flash-row");
          /* Before the group's live text, if a next model step is already streaming. */
          group.querySelector("ol.steps").insertBefore(item, document.getElementById("live-" + data.group));
        }
      },
      /* The text a streaming model step has released so far; empty html: the step is recorded. */
      live: function (data) {
        var old = document.getElementById("live-" + data.group);
        if (!data.html) {
          if (old) { old.remove(); }
          return;
        }
        var group = document.getElementById(data.group);
        if (!group) {
          group = fragment(data.group_html);
          timeline.appendChild(group);
          document.getElementById("timeline-empty").hidden = true;
        }
        var item = fragment(data.html);
        if (old) { old.replaceWith(item); } else { group.querySelector("ol.steps").appendChild(item); }
      },
      run: function (data) {
        summary.innerHTML = data.summary_html;
        localizeTimes(summary);
        if (actions.dataset.status !== data.status) {
          /* Only on a status change, so a half-typed cancel reason is not wiped by progress. */
          actions.innerHTML = data.actions_html;
          actions.dataset.status = data.status;
          announce("The run is now " + label(data.status) + ".");
        }
        var open = verdict.querySelector("details[open]") !== null;
        verdict.innerHTML = data.verdict_html;
        var raw = verdict.querySelector("details");
        if (raw && open) { raw.open = true; }
        if (artifacts && data.artifacts_html !== undefined) {
          var shown = Array.prototype.map.call(
            artifacts.querySelectorAll("details[open]"), function (d) { return d.id; });
          artifacts.innerHTML = data.artifacts_html;
          shown.forEach(function (id) {
            var again = document.getElementById(id);
            if (again) { again.open = true; }
          });
          localizeTimes(artifacts);
        }
        var waterfall = document.getElementById("waterfall");
        if (waterfall && data.waterfall_html !== undefined) {
          /* Bars keep their ids (span ids are stable): an opened bar stays open. */
          var opened = Array.prototype.map.call(
            waterfall.querySelectorAll("details[open]"), function (d) { return d.dataset.span; });
          var drawn = fragment(data.waterfall_html);
          opened.forEach(function (span) {
            var again = drawn.querySelector('details[data-span="' + span + '"]');
            if (again) { again.open = true; }
          });
          waterfall.replaceWith(drawn);
        }
      },
      done: function (data, source) {
        source.close();
        document.querySelectorAll("li.step-live").forEach(function (item) { item.remove(); });
        setIndicator(indicator, "done", "Finished: " + label(data.status) + ".");
      }
    });
  }

  function approvalsQueue(queue) {
    var indicator = document.querySelector("[data-live-indicator]");
    var waiting = null;
    function typing() {
      var active = document.activeElement;
      return active && queue.contains(active) && active.tagName === "INPUT" && active.value !== "";
    }
    function apply(data) {
      var selected = queueRows(queue).indexOf(queue.querySelector("tr.selected"));
      var id = selected >= 0 ? queueRows(queue)[selected].dataset.approval : null;
      queue.innerHTML = data.html;
      localizeTimes(queue);
      var again = id ? queue.querySelector('tr[data-approval="' + id + '"]') : null;
      if (again) { select(queue, again); }
      announce(data.pending + " approval" + (data.pending === 1 ? "" : "s") + " pending.");
    }
    /* Not while someone is typing a reason in the queue: the update waits until they leave it. */
    queue.addEventListener("focusout", function () {
      if (waiting && !typing()) { var data = waiting; waiting = null; apply(data); }
    });
    connect(queue.dataset.stream, indicator, {
      queue: function (data) {
        if (typing()) { waiting = data; } else { apply(data); }
      }
    });
    approvalKeys(queue);
  }

  function queueRows(queue) {
    return Array.prototype.slice.call(queue.querySelectorAll("#approvals-pending tbody tr"));
  }

  function select(queue, row) {
    queueRows(queue).forEach(function (r) { r.classList.remove("selected"); r.removeAttribute("aria-current"); });
    row.classList.add("selected");
    row.setAttribute("aria-current", "true");
    row.focus({ preventScroll: false });
  }

  /* j/k: next/previous pending approval; a: approve it; r: its reason field, Enter rejects;
     o: open it. Only when focus is not in a field (typing stays typing). */
  function approvalKeys(queue) {
    document.addEventListener("keydown", function (event) {
      if (event.ctrlKey || event.metaKey || event.altKey) { return; }
      var target = event.target;
      if (target instanceof HTMLInputElement && target.name === "reason" && event.key === "Enter") {
        var form = target.form;
        var reject = form ? form.querySelector('button[value="reject"]') : null;
        if (reject) { event.preventDefault(); form.requestSubmit(reject); }
        return;
      }
      if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement ||
          target instanceof HTMLSelectElement) { return; }
      var rows = queueRows(queue);
      if (!rows.length) { return; }
      var current = rows.indexOf(queue.querySelector("tr.selected"));
      if (event.key === "j" || event.key === "k") {
        var next = event.key === "j" ? Math.min(current + 1, rows.length - 1) : Math.max(current - 1, 0);
        select(queue, rows[next < 0 ? 0 : next]);
        event.preventDefault();
        return;
      }
      if (current < 0) { return; }
      var row = rows[current];
      var decide = row.querySelector("form.queue-decide");
      if (event.key === "a" && decide) {
        event.preventDefault();
        decide.requestSubmit(decide.querySelector('button[value="approve"]'));
      } else if (event.key === "r" && decide) {
        event.preventDefault();
        decide.querySelector('input[name="reason"]').focus();
      } else if (event.key === "o") {
        var open = row.querySelector("a.approval-open");
        if (open) { event.preventDefault(); open.click(); }
      }
    });
  }

  /* --- Everywhere ------------------------------------------------------------------------- */

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var button = event.submitter;
    var question = (button && button.dataset.confirm) || (form instanceof HTMLFormElement && form.dataset.confirm);
    if (form instanceof HTMLFormElement && question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  /* <button data-copy="id" hidden>: copies the text of element #id (shown only when it can). */
  document.addEventListener("click", function (event) {
    var button = event.target instanceof Element ? event.target.closest("button[data-copy]") : null;
    var source = button ? document.getElementById(button.dataset.copy) : null;
    if (!source) { return; }
    navigator.clipboard.writeText(source.textContent).then(function () {
      var label = button.textContent;
      button.textContent = "Copied";
      announce("Copied to the clipboard.");
      window.setTimeout(function () { button.textContent = label; }, 1500);
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    localizeTimes(document);
    if (navigator.clipboard && window.isSecureContext) {
      document.querySelectorAll("button[data-copy]").forEach(function (b) { b.hidden = false; });
    }
    var zone = document.querySelector("[data-timezone]");
    if (zone) {
      zone.textContent = "your time zone (" + Intl.DateTimeFormat().resolvedOptions().timeZone + ")";
    }
    var table = document.getElementById("runs-table");
    if (table && table.dataset.stream && window.EventSource) { monitor(table); }
    var page = document.getElementById("run-page");
    if (page && page.dataset.stream && window.EventSource) { runPage(page); }
    var queue = document.getElementById("approvals-queue");
    if (queue && queue.dataset.stream && window.EventSource) { approvalsQueue(queue); }
  });
})();
