"""What a round changed, for a person: a version's trajectories beside the version it is compared with, the prompts
that flipped, and the flags that mark what looks like a hack (the rules are `stages/decide/reading.py`), in the
terminal, as markdown for Prefect's artifacts and as one self-contained HTML page.

The page is written here rather than with a templating or table library: it is one static file that must open from
the file system with no network (everything inline, a Content-Security-Policy that forbids any load), and the policy
wrote everything it shows, so the data travels as JSON in a non-executed script block (`<`, `>` and `&` escaped) and
the page's own script puts every string into the document with `textContent`, never as markup. A completion holding
`<script>`, `</table>` or a `javascript:` link is shown as text and does nothing. Rows are shown a page of 50 at a
time, so a 10,000-row version renders as fast as a 50-row one.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from regimen.flows.present.fmt import cell
from regimen.stages import registry
from regimen.stages.core.errors import InputError
from regimen.stages.decide import reading
from regimen.stages.rewards.scoring import passes
from regimen.stages.store import Store, StoreError
from regimen.stages.training import trajectories
from regimen.stages.training.pass_rates import prompt_id


def pick(store: Store, experiment: str, stage: str | None, version: int | None) -> dict[str, Any]:
    """A version's index entry: `version`, or the stage's newest (default stage: the judge's); InputError naming what
    is missing."""
    stage = stage or registry.judge()
    if stage not in registry.NAMES:
        raise InputError(f"trajectories: unknown stage {stage!r}; stages: {', '.join(registry.NAMES)}")
    if not store.has_experiment(experiment):
        raise InputError(f"trajectories: no experiment {experiment!r} in store {store.url}")
    versions = store.versions(experiment, stage)
    if not versions:
        raise InputError(f"trajectories: {experiment} has no completed version of {stage}")
    if version is None:
        return versions[-1]
    found = next((v for v in versions if v["version"] == version), None)
    if found is None:
        have = ", ".join(f"v{v['version']}" for v in versions[-8:])
        raise InputError(f"trajectories: {experiment}/{stage} has no version v{version} (it has {have})")
    return found


def previous(store: Store, entry: dict[str, Any]) -> dict[str, Any] | None:
    """The version compared with by default: the stage's version before this one."""
    older = [v for v in store.versions(entry["experiment"], entry["stage"]) if v["version"] < entry["version"]]
    return older[-1] if older else None


def read_rows(store: Store, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """This version's rows, read from its own files only (in a bucket: those files, checked against the manifest's
    sha256, never the model). GRPO's samples carry their group's rewards and advantages from `groups.jsonl`."""
    name = getattr(registry.get(entry["stage"]), "HELDOUT_FILE", None)  # every row (the evaluation's); else the sample
    rows = _jsonl(store, entry, name) if name else None
    if rows is None:
        rows = _jsonl(store, entry, trajectories.FILE) or []

    missing = [r for r in rows if r.get("id") is None]  # a version written before rows had ids: its prompts' digests
    for r, rid in zip(missing, reading.row_ids([r.get("prompt") for r in missing], prompt_id)):
        r["id"] = rid
    if entry["stage"] != registry.judge():
        groups = _jsonl(store, entry, trajectories.GROUPS_FILE) or []
        by_step: dict[Any, dict[str, Any]] = {}
        for batch in groups:
            for g in batch.get("groups", []):
                by_step.setdefault((batch.get("step"), g.get("id")), g)
        for r in rows:
            g = by_step.get((r.get("step"), prompt_id(r.get("prompt"))))
            if g is not None:
                r["group"] = {"rewards": g.get("rewards"), "advantage": g.get("advantage"), "alike": g.get("alike")}
    return rows


def _jsonl(store: Store, entry: dict[str, Any], name: str) -> list[dict[str, Any]] | None:
    manifest = store.whole(entry)
    sha = (manifest.get("files") or {}).get(name)
    if sha is None:
        return None
    where = store.version_path(entry["experiment"], entry["stage"], entry["version"])
    try:
        data = Path(where, name).read_bytes() if store.local else store.fs.cat_file(f"{where}/{name}")
    except OSError as exc:
        raise StoreError(f"{where}/{name}: cannot be read ({exc})") from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise StoreError(f"{where}/{name} is damaged (its sha256 does not match the manifest); it is not shown")
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def view(
    store: Store, experiment: str, stage: str | None = None, version: int | None = None, against: int | None = None
) -> dict[str, Any]:
    """Everything a page, a table or a terminal shows: the version, the one compared with (`against`, default the
    one before), each row with its flags (and its counterpart), the diff's counts and lists."""
    entry = pick(store, experiment, stage, version)
    stage = entry["stage"]
    other = pick(store, experiment, stage, against) if against is not None else previous(store, entry)
    if other is not None and other["version"] == entry["version"]:
        other = None
    metric = _metric(store, entry)
    rows = judged(read_rows(store, entry), metric)
    before = judged(read_rows(store, other), metric) if other is not None else []
    flagged = reading.flags(rows, before or None)
    for r, f in zip(rows, flagged):
        r["flags"] = f
    d = reading.diff(before, rows) if other is not None else None
    return {
        "experiment": experiment,
        "stage": stage,
        "version": entry["version"],
        "against": None if other is None else other["version"],
        "metric": metric,
        "rows": rows,
        "before": {r["id"]: r for r in before},
        "diff": d,
        "flag_counts": reading.flag_counts(flagged),
    }


def judged(rows: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Rows with the task's verdict: the one they recorded (`correct`), else (GRPO's samples, evaluations written
    before verdicts were kept) the metric reward's value by the scoring module's rule."""
    for r in rows:
        if "correct" not in r:
            r["correct"] = passes((r.get("rewards") or {}).get(metric))
    return rows


def _metric(store: Store, entry: dict[str, Any]) -> str:
    """The task's verdict where a row has none of its own (GRPO's samples): the evaluation's metric (the recipe's
    `eval.metric`, from this version's config or the experiment's newest evaluation's), a reward reaching 1.0."""
    for e in (entry, store.latest(entry["experiment"], registry.judge())):
        sections = ((e or {}).get("config") or {}).values()  # the recipe's evaluation section holds the metric
        metric = next((sec["metric"] for sec in sections if isinstance(sec, dict) and sec.get("metric")), None)
        if metric:
            return "answer" if metric == "exact_match" else str(metric)
    return "answer"


def kind_of(v: dict[str, Any]) -> dict[str, str]:
    """Each id's kind of flip in the diff (fixed, broke, still_wrong, still_right)."""
    d = v["diff"] or {}
    return {rid: k for k in reading.KINDS for rid in d.get(k, [])}


def lines(v: dict[str, Any], show: str = "flips", limit: int = 10) -> list[str]:
    """The terminal's account: the counts, then up to `limit` rows of what `show` asks for (flips, flagged, wrong,
    right, all, or a flip kind), each completion beside its counterpart."""
    out = [f"{v['experiment']}/{v['stage']} v{v['version']}: {len(v['rows'])} rows"]
    d = v["diff"]
    if d is not None:
        c = d["counts"]
        change = "n/a" if d["accuracy_change"] is None else f"{d['accuracy_change']:+.3f}"
        out.append(
            f"against v{v['against']}: {c['fixed']} wrong->right, {c['broke']} right->wrong, {c['still_wrong']} still "
            f"wrong, {c['still_right']} still right over {d['scored']} prompts both scored (accuracy {change}); "
            f"{len(d['only_before'])} only in v{v['against']}, {len(d['only_after'])} only in v{v['version']}, "
            f"{len(d['unscored'])} unscored"
        )
    else:
        out.append("no version to compare with (the first of its stage): flags only")
    counts = ", ".join(f"{k} {n}" for k, n in v["flag_counts"].items())
    out.append(f"flags: {counts}")
    for r in select(v, show)[:limit]:
        out.append(f"- [{_label(v, r)}] {_clip(reading.prompt_text(r.get('prompt')), 80)!r}")
        b = v["before"].get(r["id"])
        if b is not None:
            out.append(f"    v{v['against']}: {_clip(b.get('completion'), 100)!r}")
        said = f"{_clip(r.get('completion'), 100)!r}  reference {_clip(r.get('answer'), 40)!r}"
        out.append(f"    v{v['version']}: {said}")
        for f in r.get("flags") or []:
            out.append(f"    flag {f['flag']}: {f['why']}")
    return out


SHOWS = ("flips", "flagged", "paid_but_wrong", "wrong", "right", "all", *reading.KINDS)


def select(v: dict[str, Any], show: str) -> list[dict[str, Any]]:
    if show not in SHOWS:
        raise InputError(f"trajectories: --show {show!r}: one of {', '.join(SHOWS)}")
    kinds = kind_of(v)

    def keep(r: dict[str, Any]) -> bool:
        verdict = reading.verdict(r)
        if show == "all":
            return True
        if show == "flips":
            return kinds.get(r["id"]) in ("fixed", "broke")
        if show == "flagged":
            return bool(r.get("flags"))
        if show == "paid_but_wrong":
            return any(f["flag"] == "paid_but_wrong" for f in r.get("flags") or [])
        if show in ("wrong", "right"):
            return verdict is (show == "right")
        return kinds.get(r["id"]) == show

    return [r for r in v["rows"] if keep(r)]


def _label(v: dict[str, Any], r: dict[str, Any]) -> str:
    kind = kind_of(v).get(r["id"])
    verdict = reading.verdict(r)
    return kind or ("unscored" if verdict is None else "right" if verdict else "wrong")


def _clip(text: Any, n: int) -> str:
    s = str(text if text is not None else "")
    return s if len(s) <= n else s[: n - 1] + "…"


def markdown(v: dict[str, Any], page: str | None = None, limit: int = 8) -> str:
    """The diff as Prefect shows it (a markdown artifact): the counts, the flags, the first flips side by side, and
    where the whole page is. Every cell is escaped (`fmt.cell`)."""
    title = f"### What {v['stage']} v{v['version']} changed"
    out = [title, ""]
    d = v["diff"]
    if d is not None:
        c = d["counts"]
        change = "n/a" if d["accuracy_change"] is None else f"{d['accuracy_change']:+.3f}"
        out += [
            f"Against v{v['against']}, on the {d['scored']} held-out prompts both scored (accuracy {change}):",
            "",
            "| wrong → right | right → wrong | still wrong | still right | only before | only after | unscored |",
            "|---|---|---|---|---|---|---|",
            f"| {c['fixed']} | {c['broke']} | {c['still_wrong']} | {c['still_right']} | {len(d['only_before'])} | "
            f"{len(d['only_after'])} | {len(d['unscored'])} |",
            "",
        ]
    else:
        out += ["The first version of its stage: nothing to compare with.", ""]
    out += ["| flag | completions |", "|---|---|"]
    out += [f"| {k} | {n} |" for k, n in v["flag_counts"].items()]
    flips = select(v, "flips")[:limit] if d is not None else []
    if flips:
        out += ["", "| flip | prompt | before | after | reference |", "|---|---|---|---|---|"]
        for r in flips:
            b = v["before"].get(r["id"], {})
            out.append(
                f"| {_label(v, r)} | {cell(reading.prompt_text(r.get('prompt')))} | {cell(b.get('completion'))} | "
                f"{cell(r.get('completion'))} | {cell(r.get('answer'))} |"
            )
    flagged = select(v, "flagged")[:limit]
    if flagged:
        out += ["", "| flags | prompt | completion |", "|---|---|---|"]
        for r in flagged:
            why = "; ".join(f"{f['flag']}: {f['why']}" for f in r["flags"])
            prompt = cell(reading.prompt_text(r.get("prompt")))
            out.append(f"| {cell(why, width=200)} | {prompt} | {cell(r.get('completion'))} |")
    where = f"`{page}`" if page else "(not written)"
    out += [
        "",
        f"The whole page (every row, filters, both versions side by side): {where}; in a terminal: "
        f"`regimen trajectories {v['experiment']} --stage {v['stage']} --version {v['version']}`",
    ]
    return "\n".join(out) + "\n"


def page_data(v: dict[str, Any]) -> dict[str, Any]:
    """The page's data: one compact record per row."""
    kinds = kind_of(v)
    recs = []
    for r in v["rows"]:
        b = v["before"].get(r["id"])
        verdict = reading.verdict(r)
        recs.append(
            {
                "id": r["id"],
                "prompt": reading.prompt_text(r.get("prompt")),
                "completion": str(r.get("completion") or ""),
                "answer": None if r.get("answer") is None else str(r.get("answer")),
                "rewards": r.get("rewards") or {},
                "total": r.get("total"),
                "verdict": None if verdict is None else int(verdict),
                "kind": kinds.get(r["id"]),
                "flags": r.get("flags") or [],
                "task": r.get("source_dataset"),
                "level": r.get("level"),
                "step": r.get("step"),
                "group": r.get("group"),
                "before": None if b is None else str(b.get("completion") or ""),
            }
        )
    return {
        "title": f"{v['experiment']} / {v['stage']} v{v['version']}"
        + (f" against v{v['against']}" if v["against"] is not None else ""),
        "diff": None if v["diff"] is None else {**v["diff"]["counts"], "scored": v["diff"]["scored"]},
        "change": None if v["diff"] is None else v["diff"]["accuracy_change"],
        "flags": v["flag_counts"],
        "rewards": sorted({k for r in v["rows"] for k in (r.get("rewards") or {})}),
        "rows": recs,
    }


def _json_for_html(data: Any) -> str:
    """JSON that cannot end the script block it sits in: `<`, `>`, `&` as \\u escapes (and non-ASCII escaped, so
    U+2028 cannot either)."""
    text = json.dumps(data, ensure_ascii=True, default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


SCRIPT = r"""
(function () {
  var D = JSON.parse(document.getElementById('data').textContent);
  var PER = 50, at = 0, shown = [];
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  document.title = D.title;
  document.getElementById('title').textContent = D.title;
  var sum = document.getElementById('summary');
  if (D.diff) {
    sum.appendChild(el('p', 'wrong \u2192 right ' + D.diff.fixed + ', right \u2192 wrong ' + D.diff.broke +
      ', still wrong ' + D.diff.still_wrong + ', still right ' + D.diff.still_right + ' over ' + D.diff.scored +
      ' prompts both scored (accuracy ' + (D.change === null ? 'n/a' : (D.change >= 0 ? '+' : '') +
      D.change.toFixed(3)) + ')'));
  } else {
    sum.appendChild(el('p', 'nothing to compare with: the first version of its stage'));
  }
  var fl = Object.keys(D.flags).map(function (k) { return k + ' ' + D.flags[k]; }).join(', ');
  sum.appendChild(el('p', 'flags: ' + fl));
  function fill(id, values) {
    var s = document.getElementById(id);
    values.forEach(function (v) { var o = el('option', v); o.value = v; s.appendChild(o); });
    if (values.length === 0) s.parentNode.style.display = 'none';
  }
  var uniq = function (k) {
    var seen = {};
    D.rows.forEach(function (r) { if (r[k] !== null && r[k] !== undefined) seen[String(r[k])] = 1; });
    return Object.keys(seen).sort();
  };
  fill('reward', D.rewards); fill('task', uniq('task')); fill('level', uniq('level'));
  function keep(r) {
    var show = document.getElementById('show').value;
    var rw = document.getElementById('reward').value, tk = document.getElementById('task').value;
    var lv = document.getElementById('level').value, q = document.getElementById('search').value.toLowerCase();
    if (show === 'paid_but_wrong' && !r.flags.some(function (f) { return f.flag === 'paid_but_wrong'; })) return false;
    if (show === 'flagged' && r.flags.length === 0) return false;
    if (show === 'wrong' && r.verdict !== 0) return false;
    if (show === 'right' && r.verdict !== 1) return false;
    if (show === 'flips' && r.kind !== 'fixed' && r.kind !== 'broke') return false;
    if (['fixed', 'broke', 'still_wrong', 'still_right'].indexOf(show) >= 0 && r.kind !== show) return false;
    if (rw && !(r.rewards[rw] > 0)) return false;
    if (tk && String(r.task) !== tk) return false;
    if (lv && String(r.level) !== lv) return false;
    if (q && (r.prompt + '\n' + r.completion + '\n' + (r.before || '')).toLowerCase().indexOf(q) < 0) return false;
    return true;
  }
  function render() {
    var body = document.getElementById('rows');
    body.textContent = '';
    shown.slice(at, at + PER).forEach(function (r) {
      var tr = el('tr');
      tr.setAttribute('data-id', r.id);
      tr.appendChild(el('td', r.kind || (r.verdict === null ? 'unscored' : r.verdict ? 'right' : 'wrong'), 'k'));
      tr.appendChild(el('td', r.prompt, 'c'));
      if (D.diff) tr.appendChild(el('td', r.before === null ? '(not in the other version)' : r.before, 'c'));
      tr.appendChild(el('td', r.completion, 'c'));
      tr.appendChild(el('td', r.answer, 'c'));
      var rv = Object.keys(r.rewards).map(function (k) {
        return k + ' ' + (r.rewards[k] === null ? '-' : Number(r.rewards[k]).toFixed(3));
      }).join('\n');
      if (r.group) rv += '\ngroup ' + r.group.rewards.join(' ') + '\nadvantage ' + r.group.advantage.join(' ');
      tr.appendChild(el('td', rv, 'c'));
      tr.appendChild(el('td', r.flags.map(function (f) { return f.flag + ': ' + f.why; }).join('\n'), 'c f'));
      body.appendChild(tr);
    });
    document.getElementById('count').textContent = shown.length ? (at + 1) + '\u2013' +
      Math.min(at + PER, shown.length) + ' of ' + shown.length : '0 rows';
  }
  function apply() { shown = D.rows.filter(keep); at = 0; render(); }
  ['show', 'reward', 'task', 'level'].forEach(function (id) {
    document.getElementById(id).addEventListener('change', apply);
  });
  document.getElementById('search').addEventListener('input', apply);
  document.getElementById('prev').addEventListener('click', function () { at = Math.max(0, at - PER); render(); });
  document.getElementById('next').addEventListener('click', function () {
    if (at + PER < shown.length) { at += PER; render(); }
  });
  if (!D.diff) document.getElementById('before-head').remove();
  apply();
})();
"""

STYLE = """
body{font:14px system-ui,sans-serif;margin:1em 2em;color:#222}
.controls label{margin-right:1em}
table{border-collapse:collapse;width:100%;table-layout:fixed;margin-top:.8em}
th,td{border:1px solid #ccc;padding:4px;vertical-align:top;text-align:left}
td.c{white-space:pre-wrap;word-break:break-all;font-family:ui-monospace,monospace;font-size:12px}
td.c,td.k{max-height:14em}
td.c{overflow:hidden}
td.f{color:#a40}
th.k,td.k{width:6em}
"""


def page(v: dict[str, Any]) -> str:
    """The self-contained HTML page (see the module doc)."""
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    csp = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"
    options = "".join(f'<option value="{s}">{s.replace("_", " ")}</option>' for s in SHOWS if s != "all")
    before = '<th id="before-head">the version compared with</th>'
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f"<title>Regimen trajectories</title><style>{STYLE}</style></head><body>"
        '<h1 id="title"></h1><div id="summary"></div><div class="controls">'
        f'<label>show <select id="show"><option value="all">all</option>{options}</select></label>'
        '<label>paid by <select id="reward"><option value="">any reward</option></select></label>'
        '<label>task <select id="task"><option value="">every task</option></select></label>'
        '<label>level <select id="level"><option value="">every level</option></select></label>'
        '<label>search <input id="search" type="search"></label>'
        '<button id="prev">previous</button> <span id="count"></span> <button id="next">next</button></div>'
        f'<table><thead><tr><th class="k">outcome</th><th>prompt</th>{before}<th>completion</th><th>reference</th>'
        '<th>rewards</th><th>flags</th></tr></thead><tbody id="rows"></tbody></table>'
        f'<script type="application/json" id="data">{_json_for_html(page_data(v))}</script>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def write_page(v: dict[str, Any], path: Path) -> Path:
    """The page written whole (a temporary file renamed), so a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page(v), encoding="utf-8")
    tmp.replace(path)
    return path
