// The search page: one form over POST /search, one button per hit over POST /explain.
// Plain JS, no framework and nothing loaded from elsewhere (the service's CSP forbids it).
// Every text from the service goes in through textContent, never as HTML.
"use strict";

(function () {
  const KEY_STORE = "cpr-search-api-key";
  const $ = (id) => document.getElementById(id);
  const form = $("search-form");
  const keyInput = $("api-key");
  let lastResult = null; // the query and field the hits on the page were found for
  let answered = 0; // searches answered (or failed) so far: the form's data-answered

  // -- the key: entered once, kept in this browser ------------------------------------------

  function storedKey() {
    try {
      return window.localStorage.getItem(KEY_STORE) || "";
    } catch (e) {
      return ""; // storage refused (a private window's policy): the field still works
    }
  }

  function showKeyState() {
    $("key-state").textContent = storedKey() ? "key saved in this browser" : "no key saved";
  }

  keyInput.value = storedKey();
  showKeyState();
  // the key panel is shown only where the service asks for a key (GET healthz says so)
  const keyBox = $("key-box");
  keyBox.hidden = true;
  fetch("healthz")
    .then((r) => (r.ok ? r.json() : null))
    .then((health) => {
      if (health && health.api_key) {
        keyBox.hidden = false;
        keyBox.open = !keyInput.value; // asked for until one is kept
      }
    })
    .catch(() => {
      /* the search itself will say what is wrong */
    });
  keyInput.addEventListener("change", () => {
    try {
      window.localStorage.setItem(KEY_STORE, keyInput.value.trim());
    } catch (e) {
      /* kept in the field for this page only */
    }
    showKeyState();
  });
  $("forget-key").addEventListener("click", () => {
    keyInput.value = "";
    try {
      window.localStorage.removeItem(KEY_STORE);
    } catch (e) {
      /* nothing was kept */
    }
    showKeyState();
  });

  // -- calling the service -----------------------------------------------------------------

  class ApiError extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  async function call(path, body) {
    const headers = { "content-type": "application/json" };
    const key = keyInput.value.trim();
    if (key) headers["x-api-key"] = key;
    let response;
    try {
      response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
    } catch (e) {
      throw new ApiError(
        "Could not reach the search service (network error): check that `cpr serve` is " +
          "running and try again.",
        0,
      );
    }
    let answer = null;
    try {
      answer = await response.json();
    } catch (e) {
      answer = null; // a proxy's HTML page, an empty body
    }
    if (response.ok && answer !== null) return answer;
    const said = answer && typeof answer.error === "string" ? answer.error : "";
    throw new ApiError(readable(response.status, said), response.status);
  }

  function readable(status, said) {
    switch (status) {
      case 401:
        return (
          "The service needs its API key (" + (said || "missing or wrong X-API-Key") + "): " +
          "enter it under “API key” and try again."
        );
      case 413:
        return "Request too large: " + (said || "shorten the problem.");
      case 422:
        return "The service refused the request: " + (said || "check the problem and filters.");
      case 503:
        return "The service is busy: " + (said || "retry shortly.");
      default:
        return said
          ? "The service answered " + status + ": " + said
          : "The service answered " + status + " without an explanation.";
    }
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  function setStatus(message) {
    $("status").textContent = message;
  }

  // -- searching ----------------------------------------------------------------------------

  function request() {
    const body = {
      query: $("query").value,
      other_fields_only: $("other-fields-only").checked,
      exclude_fields: $("exclude-fields")
        .value.split(",")
        .map((f) => f.trim())
        .filter((f) => f),
      infer_field: true,
      abstracts: true,
    };
    // numbers go as typed: the service checks them and says what is wrong
    const k = $("k").value.trim();
    if (k) body.k = Number(k);
    const before = $("before").value.trim();
    if (before) body.before = Number(before);
    return body;
  }

  // -- the URL: a search is a link (/?q=…&other_fields_only=1&before=2020) -----------------

  const URL_FIELDS = {
    q: "query",
    exclude_fields: "exclude-fields",
    before: "before",
    k: "k",
  };

  function formFromUrl() {
    const params = new URLSearchParams(window.location.search);
    Object.entries(URL_FIELDS).forEach(([name, id]) => {
      $(id).value = params.has(name) ? params.get(name) : name === "k" ? "10" : "";
    });
    const only = params.get("other_fields_only");
    $("other-fields-only").checked = only === "1" || only === "true";
    return Boolean((params.get("q") || "").trim());
  }

  function urlFromForm() {
    const params = new URLSearchParams();
    Object.entries(URL_FIELDS).forEach(([name, id]) => {
      const value = $(id).value.trim();
      if (value && !(name === "k" && value === "10")) params.set(name, value);
    });
    if ($("other-fields-only").checked) params.set("other_fields_only", "1");
    const query = params.toString();
    const url = window.location.pathname + (query ? "?" + query : "");
    if (url !== window.location.pathname + window.location.search) {
      window.history.pushState(null, "", url);
    }
  }

  async function search(event) {
    event.preventDefault();
    urlFromForm();
    await run();
  }

  async function run() {
    const button = $("search-button");
    showError("");
    setStatus("Searching…");
    button.disabled = true;
    try {
      const answer = await call("search", request());
      showResult(answer.results[0]);
    } catch (e) {
      setStatus("");
      showError(e.message);
      if (e.status === 401) {
        $("key-box").open = true;
        keyInput.focus();
      }
    } finally {
      button.disabled = false;
      form.dataset.answered = String(++answered); // what a test waits for
    }
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function showResult(result) {
    lastResult = result;
    const field = result.query_field;
    $("query-field").textContent = field || "not known (this index has no fields)";
    $("query-field-source").textContent = field ? "(" + result.query_field_source + ")" : "";
    $("summary").hidden = false;
    const list = $("results");
    list.replaceChildren(...result.hits.map(hitItem));
    const n = result.hits.length;
    setStatus(
      n === 0
        ? "No paper passes these filters."
        : n + (n === 1 ? " paper" : " papers") + " found" +
            (result.filters.other_fields_only ? " outside " + (field || "its field") : "") +
            ".",
    );
  }

  function rankText(rank) {
    return rank === null || rank === undefined ? "–" : "#" + rank;
  }

  function hitItem(hit) {
    const item = el("li", "hit");
    item.dataset.corpusId = String(hit.corpus_id);
    item.dataset.field = hit.field || "";
    item.append(el("h3", "title", hit.title || "(untitled)"));

    const meta = el("p", "meta");
    const parts = [
      ["year", hit.year === null ? "year unknown" : hit.year],
      ["field", hit.field || "field unknown"],
      ["domain", hit.domain || "domain unknown"],
      ["score", "score " + Number(hit.score).toFixed(4)],
      ["ranks", "dense " + rankText(hit.dense_rank) + " · BM25 " + rankText(hit.bm25_rank)],
    ];
    parts.forEach(([name, text], i) => {
      if (i) meta.append(" · ");
      meta.append(el("span", name, text));
    });
    item.append(meta);

    if (hit.abstract) item.append(el("p", "abstract", hit.abstract));
    else item.append(el("p", "abstract withheld", "Abstract withheld by licence."));

    const button = el("button", "explain", "Explain the analogy");
    button.type = "button";
    const box = el("div", "explanation");
    box.hidden = true;
    button.addEventListener("click", () => explain(hit, button, box));
    item.append(button, box);
    return item;
  }

  // -- explaining one hit -------------------------------------------------------------------

  async function explain(hit, button, box) {
    if (box.dataset.state === "done") {
      // asked already: the button shows or hides the answer
      box.hidden = !box.hidden;
      button.textContent = box.hidden ? "Show the explanation" : "Hide the explanation";
      return;
    }
    button.disabled = true;
    button.textContent = "Asking the LLM…";
    box.hidden = false;
    box.replaceChildren(el("p", "hint", "Asking the LLM how this paper's idea carries over…"));
    try {
      const answer = await call("explain", {
        query: lastResult.query,
        corpus_id: hit.corpus_id,
        query_field: lastResult.query_field,
      });
      box.replaceChildren(...explanation(answer));
      box.dataset.state = "done";
      button.textContent = "Hide the explanation";
    } catch (e) {
      box.replaceChildren(el("p", "error", e.message));
      button.textContent = "Explain the analogy";
    } finally {
      button.disabled = false;
    }
  }

  const DECISIONS = {
    observed_analogy: "Observed analogy",
    potential_analogy: "Potential analogy",
    not_analogy: "Not an analogy",
  };

  function explanation(answer) {
    const exp = answer.explanation;
    if (!exp) {
      return [
        el(
          "p",
          "error",
          "The LLM gave no valid explanation for this paper (" + answer.status + ").",
        ),
      ];
    }
    const out = [
      el(
        "p",
        "decision",
        (DECISIONS[exp.decision] || exp.decision) +
          (exp.transfer_type ? " · transfer: " + exp.transfer_type : ""),
      ),
    ];

    out.push(el("h4", null, "Mappings"));
    const mappings = exp.object_mappings || [];
    out.push(
      listOf(
        "mappings",
        mappings.map(
          (m) => m.q_object + " ↔ " + m.d_object + (m.role ? " (" + m.role + ")" : ""),
        ),
        "none",
      ),
    );

    out.push(el("h4", null, "Shared relations"));
    const relations = exp.shared_relations || [];
    out.push(
      listOf(
        "relations",
        relations.map(
          (r) =>
            r.predicate +
            "(" + (r.q_arguments || []).join(", ") + ") ↔ " +
            r.predicate +
            "(" + (r.d_arguments || []).join(", ") + ")",
        ),
        "none",
      ),
    );

    const path = exp.transfer_path || {};
    if (path.from_d || path.through_mappings || path.helps_q) {
      out.push(el("h4", null, "Transfer path"));
      const steps = el("dl", "transfer-path");
      [
        ["From the paper", path.from_d],
        ["Through the mappings", path.through_mappings],
        ["Helps the problem", path.helps_q],
      ].forEach(([label, text]) => {
        if (!text) return;
        steps.append(el("dt", null, label), el("dd", null, text));
      });
      out.push(steps);
    }
    if (exp.reason) out.push(el("p", "reason", "Why: " + exp.reason));
    return out;
  }

  function listOf(className, items, empty) {
    const list = el("ul", className);
    if (!items.length) list.append(el("li", "hint", empty));
    items.forEach((text) => list.append(el("li", null, text)));
    return list;
  }

  form.addEventListener("submit", search);
  // a shared link runs its search; going back or forward runs the one in the URL
  if (formFromUrl()) run();
  window.addEventListener("popstate", () => {
    if (formFromUrl()) run();
  });
  $("query").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
})();
