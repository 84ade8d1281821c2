/* Loopwright's editing helpers, local and dependency-free (no CDN):
   - textarea[data-json-schema]: the JSON is checked as it is typed against the schema the
     server serves (/ui/schemas/<name>.json, from the same models the services validate with);
     problems are listed under the field with the keys allowed where an unknown key stands.
     The server checks again on submit: this only saves a round trip.
   - textarea[data-code-editor]: line numbers and syntax colours for Python and JavaScript
     (the textarea stays the real, accessible field; a highlighted copy is drawn beneath it).
   - textarea[data-pick-from="<datalist id>"]: the datalist's names as buttons that add a name
     on its own line (the makers of a pattern). */
(function () {
  "use strict";

  /* --- JSON checked against a JSON Schema ------------------------------------------------- */

  function resolve(schema, root) {
    var seen = 0;
    while (schema && schema.$ref && seen < 20) {
      var path = schema.$ref.replace(/^#\//, "").split("/");
      var target = root;
      path.forEach(function (part) { target = target ? target[part] : undefined; });
      schema = target;
      seen += 1;
    }
    return schema || {};
  }

  function typeOf(value) {
    if (value === null) { return "null"; }
    if (Array.isArray(value)) { return "array"; }
    if (typeof value === "number") { return Number.isInteger(value) ? "integer" : "number"; }
    return typeof value;
  }

  function typeMatches(wanted, actual) {
    var list = Array.isArray(wanted) ? wanted : [wanted];
    return list.indexOf(actual) >= 0 || (actual === "integer" && list.indexOf("number") >= 0);
  }

  /* Problems of value at pointer under schema: [{pointer, detail}]. A small, lenient subset of
     JSON Schema: $ref, anyOf/oneOf, type, enum, const, properties, additionalProperties,
     items, minimum/maximum. What it does not know it accepts: the server decides. */
  function check(value, schema, root, pointer, out) {
    schema = resolve(schema, root);
    var branches = schema.anyOf || schema.oneOf;
    if (branches) {
      var best = null;
      for (var i = 0; i < branches.length; i++) {
        var found = [];
        check(value, branches[i], root, pointer, found);
        if (!found.length) { return; }
        var branch = resolve(branches[i], root);
        if (best === null || (branch.type && typeMatches(branch.type, typeOf(value)))) { best = found; }
      }
      Array.prototype.push.apply(out, best || []);
      return;
    }
    var actual = typeOf(value);
    if (schema.type && !typeMatches(schema.type, actual)) {
      out.push({ pointer: pointer, detail: "expected " + [].concat(schema.type).join(" or ") + ", got " + actual });
      return;
    }
    if (schema.enum && schema.enum.indexOf(value) < 0) {
      out.push({ pointer: pointer, detail: "must be one of " + schema.enum.map(JSON.stringify).join(", ") });
      return;
    }
    if ("const" in schema && schema.const !== value) {
      out.push({ pointer: pointer, detail: "must be " + JSON.stringify(schema.const) });
    }
    if (actual === "number" || actual === "integer") {
      if (typeof schema.minimum === "number" && value < schema.minimum) { out.push({ pointer: pointer, detail: "must be at least " + schema.minimum }); }
      if (typeof schema.maximum === "number" && value > schema.maximum) { out.push({ pointer: pointer, detail: "must be at most " + schema.maximum }); }
    }
    if (actual === "object") {
      var props = schema.properties || {};
      var allowed = Object.keys(props).sort();
      Object.keys(value).forEach(function (key) {
        var here = pointer + "/" + key;
        if (props[key]) {
          check(value[key], props[key], root, here, out);
        } else if (schema.additionalProperties === false) {
          out.push({ pointer: here, detail: "unknown key " + JSON.stringify(key) + (allowed.length ? ": allowed keys are " + allowed.join(", ") : "") });
        } else if (schema.additionalProperties && typeof schema.additionalProperties === "object") {
          check(value[key], schema.additionalProperties, root, here, out);
        }
      });
    }
    if (actual === "array" && schema.items && typeof schema.items === "object") {
      value.forEach(function (item, index) { check(item, schema.items, root, pointer + "/" + index, out); });
    }
  }

  function schemaField(area) {
    var box = document.createElement("div");
    box.className = "json-check";
    box.setAttribute("aria-live", "polite");
    box.id = area.id + "-check";
    area.insertAdjacentElement("afterend", box);
    area.setAttribute("aria-describedby", ((area.getAttribute("aria-describedby") || "") + " " + box.id).trim());
    var schema = null;
    var timer = null;

    function show(lines, state) {
      box.dataset.state = state;
      box.innerHTML = "";
      lines.forEach(function (text) {
        var line = document.createElement("div");
        line.textContent = text;
        box.appendChild(line);
      });
    }

    function run() {
      if (!schema) { return; }
      var text = area.value.trim();
      if (!text) { show(["Allowed keys: " + Object.keys(resolve(schema, schema).properties || {}).sort().join(", ")], "hint"); return; }
      var value;
      try {
        value = JSON.parse(text);
      } catch (error) {
        show(["Not valid JSON yet: " + error.message], "bad");
        return;
      }
      var problems = [];
      check(value, schema, schema, "", problems);
      if (problems.length) {
        show(problems.slice(0, 8).map(function (p) { return (p.pointer || "/") + ": " + p.detail; }), "bad");
      } else {
        show(["Matches the schema."], "ok");
      }
    }

    fetch(area.dataset.jsonSchema, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (loaded) { schema = loaded; run(); })
      .catch(function () { /* the server checks on submit anyway */ });
    area.addEventListener("input", function () {
      window.clearTimeout(timer);
      timer = window.setTimeout(run, 250);
    });
  }

  /* --- A code editor: line numbers and colours ------------------------------------------- */

  var KEYWORDS = {
    python: "False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield print len range self",
    node: "async await break case catch class const continue default delete do else export extends false finally for function if import in instanceof let new null of return super switch this throw true try typeof undefined var void while yield require console",
    deno: "async await break case catch class const continue default delete do else enum export extends false finally for function if implements import in instanceof interface let new null of readonly return super switch this throw true try type typeof undefined var void while yield console Deno"
  };

  function escapeHtml(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  /* One pass over the text: comments, strings, {{placeholders}}, numbers, words. */
  function highlight(text, language) {
    var words = {};
    (KEYWORDS[language] || KEYWORDS.python).split(" ").forEach(function (w) { words[w] = true; });
    var script = language === "node" || language === "deno";
    var comment = script ? "\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?\\*\\/" : "#[^\\n]*";
    var strings = script
      ? "`(?:\\\\[\\s\\S]|[^`\\\\])*`?|\"(?:\\\\.|[^\"\\\\\\n])*\"?|'(?:\\\\.|[^'\\\\\\n])*'?"
      : "\"\"\"[\\s\\S]*?(?:\"\"\"|$)|'''[\\s\\S]*?(?:'''|$)|\"(?:\\\\.|[^\"\\\\\\n])*\"?|'(?:\\\\.|[^'\\\\\\n])*'?";
    var token = new RegExp("(" + comment + ")|(" + strings + ")|(\\{\\{\\s*\\w+\\s*\\}\\})|(\\b\\d+(?:\\.\\d+)?\\b)|([A-Za-z_$][\\w$]*)", "g");
    var out = "";
    var last = 0;
    var match;
    while ((match = token.exec(text)) !== null) {
      if (match[0] === "") { token.lastIndex += 1; continue; }
      out += escapeHtml(text.slice(last, match.index));
      var css = match[1] ? "tok-comment" : match[2] ? "tok-string" : match[3] ? "tok-placeholder" : match[4] ? "tok-number" : (words[match[5]] ? "tok-keyword" : "");
      out += css ? '<span class="' + css + '">' + escapeHtml(match[0]) + "</span>" : escapeHtml(match[0]);
      last = token.lastIndex;
    }
    return out + escapeHtml(text.slice(last)) + "\n";
  }

  function codeEditor(area) {
    var wrap = document.createElement("div");
    wrap.className = "code-editor";
    var gutter = document.createElement("pre");
    gutter.className = "code-gutter";
    gutter.setAttribute("aria-hidden", "true");
    var view = document.createElement("pre");
    view.className = "code-view";
    view.setAttribute("aria-hidden", "true");
    var code = document.createElement("code");
    view.appendChild(code);
    area.parentNode.insertBefore(wrap, area);
    wrap.appendChild(gutter);
    wrap.appendChild(view);
    wrap.appendChild(area);
    area.classList.add("code-input");
    var picker = area.dataset.languageFrom ? document.getElementById(area.dataset.languageFrom) : null;

    function language() {
      return picker ? picker.value : (area.dataset.codeEditor || "python");
    }

    function render() {
      var lines = area.value.split("\n").length;
      var numbers = "";
      for (var i = 1; i <= lines; i++) { numbers += i + "\n"; }
      gutter.textContent = numbers;
      code.innerHTML = highlight(area.value, language());
      wrap.dataset.language = language();
      sync();
    }

    function sync() {
      view.scrollTop = area.scrollTop;
      view.scrollLeft = area.scrollLeft;
      gutter.scrollTop = area.scrollTop;
    }

    area.addEventListener("input", render);
    area.addEventListener("scroll", sync);
    if (picker) { picker.addEventListener("change", render); }
    /* Tab indents; Escape first lets Tab leave the field (keyboard users are never trapped). */
    var escaped = false;
    area.addEventListener("keydown", function (event) {
      if (event.key === "Escape") { escaped = true; return; }
      if (event.key === "Tab" && !event.shiftKey && !escaped && !event.ctrlKey && !event.altKey) {
        event.preventDefault();
        var start = area.selectionStart;
        area.setRangeText("    ", start, area.selectionEnd, "end");
        render();
      }
      if (event.key !== "Tab") { escaped = false; }
    });
    render();
  }

  /* --- Pick names from a datalist --------------------------------------------------------- */

  function picker(area) {
    var list = document.getElementById(area.dataset.pickFrom);
    if (!list || !list.options.length) { return; }
    var row = document.createElement("div");
    row.className = "pick-names";
    row.setAttribute("role", "group");
    row.setAttribute("aria-label", "Employees you can add");
    Array.prototype.forEach.call(list.options, function (option) {
      var button = document.createElement("button");
      button.type = "button";
      button.className = "button-quiet pick-name";
      button.textContent = "+ " + option.value;
      button.addEventListener("click", function () {
        var names = area.value.split(/[\n,]/).map(function (n) { return n.trim(); }).filter(Boolean);
        if (names.indexOf(option.value) < 0) { names.push(option.value); }
        area.value = names.join("\n");
        area.dispatchEvent(new Event("input", { bubbles: true }));
      });
      row.appendChild(button);
    });
    area.insertAdjacentElement("afterend", row);
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("textarea[data-json-schema]").forEach(schemaField);
    document.querySelectorAll("textarea[data-code-editor]").forEach(codeEditor);
    document.querySelectorAll("textarea[data-pick-from]").forEach(picker);
  });
})();
